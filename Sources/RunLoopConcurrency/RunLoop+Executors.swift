@_spi(ExperimentalCustomExecutors) @_spi(ExperimentalScheduling) import _Concurrency
import RunLoopKit
import Synchronization

import class RunLoopKit.RunLoop

// What Swift 6.3's experimental executor SPI asks of the main loop: a `MainExecutor` (run until
// stopped, run until a condition holds, and a serial executor), and delayed jobs as a loop's own
// timers. The SPI's protocols cannot appear in a public conformance, so the main executor is an
// internal object that is `RunLoop.main` in all but name: its serial-executor identity is the main
// loop's (`RunLoop.main.asUnownedSerialExecutor()`), so the runtime enqueues main-actor jobs to the
// main loop's serial executor, and an actor pinned to `RunLoop.main` shares the main actor's
// isolation.

/// `RunLoop.main` as the SPI's `MainExecutor`.
///
/// `@unchecked Sendable` is safe: its one stored property is a constant (a `Sendable` value); `RunLoop` is `Sendable`.
final class MainLoopExecutor: MainExecutor, @unchecked Sendable {
    static let shared = MainLoopExecutor()

    private var loop: RunLoop { RunLoop.main }
    /// The main loop's serial executor, looked up once (the main loop lives as long as the process).
    private let serial = RunLoop.main.asUnownedSerialExecutor()

    func enqueue(_ job: consuming ExecutorJob) { loop.enqueueIsolated(job) }

    func asUnownedSerialExecutor() -> UnownedSerialExecutor { serial }

    func checkIsolated() { loop.checkIsolated() }

    func isIsolatingCurrentContext() -> Bool? { loop.isIsolatingCurrentContext() }

    var isMainExecutor: Bool { true }

    /// The main loop's `run()` (`CFRunLoopRun`): it goes on until ``stop()``; the main loop's
    /// common modes are never empty (its main-queue source keeps them alive).
    func run() throws { loop.run() }

    /// `RunLoop.main.stop()`.
    func stop() { loop.stop() }

    func runUntil(_ condition: () -> Bool) throws { loop.runUntil(condition) }
}

extension RunLoop {
    /// Runs the loop in its default mode until `condition` holds (looked at before each sleep,
    /// once every job that was ready has run), ``RunLoop/stop()`` is called, or the mode has
    /// nothing to do. On the loop's thread.
    func runUntil(_ condition: () -> Bool) {
        if !isCurrent {
            fatalError("RunLoop.runUntil(_:) as an executor: called off the loop's thread; a loop runs only on its own thread (\(self))")
        }
        withoutActuallyEscaping(condition) { condition in
            let check = ConditionCheck(condition)
            let observer = RunLoopObserver(activities: .beforeWaiting) { _, _ in
                if check.holds() { RunLoop.current.stop() }
            }
            add(observer, forMode: .default)
            defer { observer.invalidate() }
            while !condition() {
                let result = run(mode: .default, for: .seconds(Int64(Int32.max)))
                if result == .finished { return }
                if result == .stopped && !condition() { return }
            }
        }
    }

    /// Runs `job` on the loop's thread once `delay` has passed on `clock`: a one-shot timer of
    /// the loop in its common modes, with `tolerance` (the global executor's, for a task that
    /// sleeps on a loop's thread).
    func enqueue<C: Clock>(
        _ job: consuming ExecutorJob, after delay: C.Duration, tolerance: C.Duration?, clock: C
    ) {
        let nanoseconds = Self.nanoseconds(delay) ?? 0
        scheduleJob(UnownedJob(job), afterNanoseconds: nanoseconds, tolerance: tolerance.flatMap(Self.nanoseconds) ?? 0)
    }

    /// Runs `job` on the loop's thread at `instant` of `clock` (converted to the loop's clock
    /// through `clock.now`, unless it is a ``RunLoopClock``, or a `ContinuousClock` on a loop on
    /// real time, whose instants are the loop's; on a loop on virtual time a `ContinuousClock`
    /// deadline is a real one, so its delay counts from the virtual now).
    func enqueue<C: Clock>(
        _ job: consuming ExecutorJob, at instant: C.Instant, tolerance: C.Duration?, clock: C
    ) {
        let toleranceNs = tolerance.flatMap(Self.nanoseconds) ?? 0
        let job = UnownedJob(job)
        if let deadline = instant as? ContinuousClock.Instant, clock is RunLoopClock {
            scheduleJob(job, at: deadline, toleranceNs: toleranceNs)
        } else if let deadline = instant as? ContinuousClock.Instant, clock is ContinuousClock, !isOnVirtualTime {
            scheduleJob(job, at: deadline, toleranceNs: toleranceNs)
        } else {
            // Another clock, or a ContinuousClock deadline (`Task.sleep(for:)`'s, read on the real
            // clock) for a loop on virtual time: the same delay from the loop's own now.
            let delay = Self.nanoseconds(clock.now.duration(to: instant)) ?? 0
            scheduleJob(job, afterNanoseconds: delay, tolerance: toleranceNs)
        }
    }

    private func scheduleJob(_ job: UnownedJob, afterNanoseconds delay: Int64, tolerance: Int64) {
        if isCurrent {
            scheduleJob(job, at: RunLoop.now + .nanoseconds(max(0, delay)), toleranceNs: tolerance)
        } else {
            // Read the deadline on the loop's own clock (a loop on virtual time has its own).
            let start = now
            scheduleJob(job, at: start + .nanoseconds(max(0, delay)), toleranceNs: tolerance)
        }
    }

    private func scheduleJob(_ job: UnownedJob, at deadline: ContinuousClock.Instant, toleranceNs: Int64) {
        // Isolated to the loop (a main-actor sleep, the usual case), with no task executor: naming
        // one would make the runtime hop at the next main-actor call. A sleeping task that prefers
        // the loop instead leaves the isolation with one hop through the loop's queue.
        let add: @Sendable () -> Void = { [self] in
            let timer = RunLoopTimer(fireAt: deadline, tolerance: .nanoseconds(toleranceNs)) { _ in
                // Through the serial executor: a sleep that ends inside a nested run started by
                // another job of the same isolation waits for that job to return.
                RunLoop.current.runIsolated(job)
            }
            self.add(timer, forMode: .common)
        }
        if isCurrent { add() } else { perform(inModes: [.common], add) }
    }

    private static func nanoseconds<D: DurationProtocol>(_ duration: D) -> Int64? {
        guard let duration = duration as? Duration else { return nil }
        let (seconds, attoseconds) = duration.components
        let (scaled, overflow) = seconds.multipliedReportingOverflow(by: 1_000_000_000)
        if overflow { return seconds < 0 ? .min : .max }
        return scaled.addingReportingOverflow(attoseconds / 1_000_000_000).partialValue
    }
}

/// The condition of a ``RunLoop/runUntil(_:)``, reached from the loop's observer.
///
/// `@unchecked Sendable` is safe: the observer runs on the loop's thread, inside the
/// `runUntil` call that owns the closure (it is removed before `runUntil` returns), so the closure
/// is only ever called on that thread while it is alive.
private final class ConditionCheck: @unchecked Sendable {
    let holds: () -> Bool
    init(_ holds: @escaping () -> Bool) { self.holds = holds }
}
