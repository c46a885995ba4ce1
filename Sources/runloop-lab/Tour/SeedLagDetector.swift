import Foundation
import RunLoopKit
import Synchronization

import class RunLoopKit.RunLoop

/// Seed 001's 卡顿 detector (HCCMonitor), on RunLoopKit, for the lag-monitor experiment: an
/// observer of every activity stores the activity and signals a semaphore; a watchdog on a global
/// queue waits on the semaphore 50 ms at a time, and a wait that times out while the activity is
/// beforeSources or afterWaiting counts one; the 5th in a row is a stall ("monitor trigger", where
/// the seed would dump the stacks). As in the seed, every other round (a signal, or a timeout in
/// another activity) and the round that declares set the count back to zero.
///
/// The seed's article shows the count commented out (`if (++timeoutCount < 3) continue;`) and a
/// 20 ms wait; the 5 × 50 ms form is the one usually quoted, and the one run here. The seed keeps
/// the activity in a plain ivar written on the main thread and read on the watchdog's; here it is
/// an atomic (Swift 6 rejects the race).
final class SeedLagDetector: Sendable {
    /// The watchdog's wait (the seed's `dispatch_time(DISPATCH_TIME_NOW, 50 * NSEC_PER_MSEC)`).
    static let wait = Duration.milliseconds(50)
    /// Timeouts in a row that make a stall.
    static let timeoutsForStall = 5

    /// A timeout counted by the watchdog (one in beforeSources or afterWaiting).
    struct CountedTimeout: Sendable {
        /// `timeoutCount` after the increment.
        let count: Int
        /// The activity the observer stored last.
        let activity: RunLoop.Activity
        /// When the wait timed out.
        let at: ContinuousClock.Instant
        /// Whether this timeout declared a stall (the count reached ``timeoutsForStall``).
        var declaredStall: Bool { count >= SeedLagDetector.timeoutsForStall }
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
        self.observer.withLock { $0 = observer }
        loop.add(observer, forMode: .common)
        DispatchQueue.global().async { [self] in watchdog() }
    }

    /// The seed's `endMonitor`: removes the observer; the watchdog returns at its next timeout.
    /// Waits for it.
    func end() {
        observer.withLock { observer in
            observer?.invalidate()
            observer = nil
        }
        finished.wait()
    }

    /// Waits until the watchdog has finished the round it is in (at most one wait), so that every
    /// timeout of a stall that ended before this call is in ``takeCounted()``.
    func sync() {
        syncRequested.store(true, ordering: .releasing)
        synced.wait()
    }

    /// The timeouts counted since the last call.
    func takeCounted() -> [CountedTimeout] {
        counted.withLock { list in
            defer { list.removeAll() }
            return list
        }
    }

    /// The seed's watchdog loop.
    private func watchdog() {
        var timeoutCount = 0
        while true {
            if syncRequested.exchange(false, ordering: .acquiringAndReleasing) { synced.signal() }
            let result = semaphore.wait(timeout: .now() + .milliseconds(Int(Self.wait / .milliseconds(1))))
            if result == .timedOut {
                if observer.withLock({ $0 == nil }) {
                    finished.signal()
                    return
                }
                let current = RunLoop.Activity(rawValue: activity.load(ordering: .acquiring))
                if current == .beforeSources || current == .afterWaiting {
                    timeoutCount += 1
                    counted.withLock { $0.append(CountedTimeout(count: timeoutCount, activity: current, at: .now)) }
                    if timeoutCount < Self.timeoutsForStall { continue }
                    // NSLog(@"monitor trigger"): the seed dumps the stacks here.
                }
            }
            timeoutCount = 0
        }
    }
}
