import Foundation
import RunLoopKit
import Synchronization

import class RunLoopKit.RunLoop

/// The seeds' 卡顿 detector, on RunLoopKit, for the lag-monitor experiment: an observer of every
/// activity stores the activity and signals a semaphore; a watchdog on a global queue waits on the
/// semaphore ``wait`` at a time, and a wait that times out while the activity is beforeSources or
/// afterWaiting counts one; the ``Configuration/timeoutsForStall``-th in a row is a stall ("monitor trigger",
/// where the seed would dump the stacks). As in the seeds, every other round (a signal, or a
/// timeout in another activity) and the round that declares set the count back to zero.
///
/// The wait and the count are parameters because the seeds differ: seeds 000/001's first listing
/// waits 3 s, their HCCMonitor class 20 ms (its "three in a row" check is commented out, so one
/// timeout declares), seed 004 waits 80 ms (one timeout declares). See ``Configuration``. The seeds
/// keep the activity in a plain ivar written on the main thread and read on the watchdog's; here
/// it is an atomic (Swift 6 rejects the race).
final class SeedLagDetector: Sendable {
    /// One seed's values.
    struct Configuration: Sendable {
        /// Who uses these values, for the trace (`seed 004`).
        let name: String
        /// The watchdog's wait (`dispatch_semaphore_wait(..., dispatch_time(DISPATCH_TIME_NOW, wait))`).
        let wait: Duration
        /// Timeouts in a row that make a stall.
        let timeoutsForStall: Int

        /// Seeds 000/001's HCCMonitor class: `20*NSEC_PER_MSEC`, the `++timeoutCount < 3` check
        /// commented out, so one timeout declares.
        static let hccMonitor = Configuration(name: "seeds 000/001 HCCMonitor", wait: .milliseconds(20), timeoutsForStall: 1)
        /// Seed 004: `80 * NSEC_PER_MSEC` ("80毫秒为卡顿阈值"), no count: one timeout declares.
        static let seed004 = Configuration(name: "seed 004", wait: .milliseconds(80), timeoutsForStall: 1)
        /// Seeds 000/001's first listing: `3 * NSEC_PER_SEC`, no count: one timeout declares.
        static let firstListing = Configuration(name: "seeds 000/001 first listing", wait: .seconds(3), timeoutsForStall: 1)

        /// `20 ms × 1`.
        var shortDescription: String {
            let ms = wait / .milliseconds(1)
            return (ms >= 1000 ? "\(Int(ms / 1000)) s" : "\(Int(ms)) ms") + " × \(timeoutsForStall)"
        }
    }

    /// A timeout counted by the watchdog (one in beforeSources or afterWaiting).
    struct CountedTimeout: Sendable {
        /// `timeoutCount` after the increment.
        let count: Int
        /// The activity the observer stored last.
        let activity: RunLoop.Activity
        /// When the wait timed out.
        let at: ContinuousClock.Instant
        /// Whether this timeout declared a stall (the count reached the configuration's).
        let declaredStall: Bool
    }

    /// The seed's values this detector runs with.
    let configuration: Configuration
    /// Called on the watchdog's thread when a stall is declared: where the seeds dump every
    /// thread's stack (`[HCCCallStack callStackWithType:HCCCallStackTypeAll]`, itself commented out
    /// in seeds 000/001).
    private let onStall: (@Sendable (CountedTimeout) -> Void)?

    /// A detector with `configuration`'s wait and count; `onStall` runs at each declared stall.
    init(_ configuration: Configuration, onStall: (@Sendable (CountedTimeout) -> Void)? = nil) {
        self.configuration = configuration
        self.onStall = onStall
    }

    /// The seed's `dispatchSemaphore`.
    private let semaphore = DispatchSemaphore(value: 0)
    /// The seed's `runLoopActivity` (raw value of the last activity; 0 before the first).
    private let activity = Atomic<UInt>(0)
    /// The seed's `runLoopObserver`; nil once ended (the watchdog then returns, as in the seed).
    private let observer = Mutex<RunLoopObserver?>(nil)
    private let counted = Mutex<[CountedTimeout]>([])
    private let syncRequested = Atomic<Bool>(false)
    private let synced = DispatchSemaphore(value: 0)
    private let finished = DispatchSemaphore(value: 0)

    /// The seed's `beginMonitor`: adds the observer to `loop`'s common modes and starts the
    /// watchdog.
    func begin(on loop: RunLoop) {
        let observer = RunLoopObserver(activities: .allActivities) { [self] _, activity in
            // The seed's runLoopObserverCallBack.
            self.activity.store(activity.rawValue, ordering: .releasing)
            semaphore.signal()
        }
        self.observer.locked { $0 = observer }
        loop.add(observer, forMode: .common)
        // The seeds start the watchdog with dispatch_async to a global queue. Each watchdog blocks
        // a pool thread for good, and on Linux libdispatch adds pool threads slowly once its
        // threads block: with several detectors the later watchdogs started 100 ms and more late
        // and missed whole stalls. A thread of its own runs the seeds' logic with their timing.
        let thread = Thread { [self] in watchdog() }
        thread.name = "seed-watchdog"
        thread.start()
    }

    /// The seed's `endMonitor`: removes the observer. In the seed the watchdog returns at its next
    /// timeout; here a signal wakes it at once (with a 3 s wait, the tour would wait 3 s more),
    /// and this call waits for it to return.
    func end() {
        observer.locked { observer in
            observer?.invalidate()
            observer = nil
        }
        semaphore.signal()
        finished.wait()
    }

    /// Waits until the watchdog has finished the round it is in (at most one wait), so that every
    /// timeout of a stall that ended before this call is in ``takeCounted()``.
    func sync() {
        syncRequested.store(true, ordering: .releasing)
        // Wakes a watchdog in a long wait (3 s): the stall is over, so the extra round it counts as
        // activity changes no verdict.
        semaphore.signal()
        synced.wait()
    }

    /// The timeouts counted since the last call.
    func takeCounted() -> [CountedTimeout] {
        counted.locked { list in
            defer { list.removeAll() }
            return list
        }
    }

    /// The seed's watchdog loop.
    private func watchdog() {
        var timeoutCount = 0
        while true {
            if syncRequested.exchange(false, ordering: .acquiringAndReleasing) { synced.signal() }
            let result = semaphore.wait(timeout: .now() + .milliseconds(Int(configuration.wait / .milliseconds(1))))
            if observer.locked({ $0 == nil }) {
                finished.signal()
                return
            }
            if result == .timedOut {
                let current = RunLoop.Activity(rawValue: activity.load(ordering: .acquiring))
                if current == .beforeSources || current == .afterWaiting {
                    timeoutCount += 1
                    let timeout = CountedTimeout(
                        count: timeoutCount, activity: current, at: .now,
                        declaredStall: timeoutCount >= configuration.timeoutsForStall)
                    counted.locked { $0.append(timeout) }
                    if !timeout.declaredStall { continue }
                    // NSLog(@"monitor trigger"): the seeds dump every thread's stack here.
                    onStall?(timeout)
                }
            }
            timeoutCount = 0
        }
    }
}
