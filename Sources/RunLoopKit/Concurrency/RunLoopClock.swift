import Synchronization

// A `Clock` whose time is a loop's clock and whose sleeps are that loop's timers. Code that takes
// `some Clock<Duration>` (a debouncer, a retry policy, an animation) runs on it unchanged; on a
// loop made by RunLoopTesting's `withVirtualTime`, the same code sleeps in virtual time, and
// `advance(by:)` resumes exactly the sleepers that are due, in order, with no real waiting.

/// A clock that reads a run loop's clock and sleeps on that loop's timers.
///
/// ```swift
/// let clock = loop.clock
/// try await clock.sleep(for: .milliseconds(300))   // a one-shot timer on `loop`
/// ```
///
/// - **Time.** ``now`` is the loop's clock (`loop.now`): the monotonic clock that counts
///   suspended time (`CLOCK_BOOTTIME`), or the virtual clock of a loop made by `withVirtualTime`.
///   Its instants are `ContinuousClock.Instant`s, the same as every fire date of RunLoopKit.
/// - **Sleeping.** ``sleep(until:tolerance:)`` adds a one-shot ``RunLoopTimer`` to the loop in
///   its common modes (so a sleep ends during a `.tracking` run too) and resumes the sleeping
///   task from its handler. The tolerance is the timer's. Nothing is polled and no thread blocks.
///   The timer is made on the loop's thread: called elsewhere, the sleep first hands the loop a
///   block that makes it (the loop's clock is the one that must read the deadline).
/// - **Cancellation.** Cancelling the sleeping task invalidates the timer at once and the sleep
///   throws `CancellationError`; no timer is left behind.
/// - **A loop that is not running** ends no sleep until it runs; a loop whose thread has exited
///   ends every sleep at once with ``RunLoop/PerformError/threadExited``.
///
/// ## Deterministic tests on virtual time
///
/// Under `withVirtualTime`, use the virtual loop's clock (`virtual.runLoop.clock`) and run the
/// code that sleeps on that loop (an actor pinned to it, or a task started with
/// `Task(executorPreference: virtual.runLoop)`): its jobs then run inside `advance(by:)`, register
/// their sleeps there, and are resumed there, in deadline order, with no race between the test
/// and the sleeper. Tasks on the global pool that sleep on the virtual clock still work, but
/// whether a sleep is registered before a given `advance` is up to the scheduler.
///
/// Virtual and real sleeps mixed: virtual time moves only with `advance(by:)` (and `elapse`), so
/// real time passing ends no sleep on the virtual clock; a sleep on a real clock
/// (`ContinuousClock`, `Task.sleep`) ends in real time whatever `advance(by:)` does; a task on
/// the virtual loop that slept on a real clock resumes when the loop next runs (`advance(by:)`,
/// `runUntilIdle()`), at the virtual instant of that run. So a test that mixes them waits in real
/// time for the real sleeps: use the loop's clock for every sleep the test must control.
public struct RunLoopClock: Clock, Sendable {
    public typealias Instant = ContinuousClock.Instant
    public typealias Duration = Swift.Duration

    /// The loop whose clock this is and whose timers end the sleeps.
    public let loop: RunLoop

    /// The clock of `loop` (also ``RunLoop/clock``).
    public init(loop: RunLoop) { self.loop = loop }

    /// The loop's clock now. Any thread.
    public var now: Instant { loop.now }

    /// One nanosecond: the loop clock's unit (a timer's precision is the kernel's, tens of
    /// microseconds on a loaded machine).
    public var minimumResolution: Duration { .nanoseconds(1) }

    /// Suspends until `deadline` on the loop's clock: a one-shot timer in the loop's common modes,
    /// with `tolerance` (nil: none). A deadline now or in the past still waits for the timer's
    /// callout (one pass of the loop).
    ///
    /// - Throws: `CancellationError` if the task is cancelled before or during the sleep;
    ///   ``RunLoop/PerformError/threadExited`` if the loop's thread has exited.
    public func sleep(until deadline: Instant, tolerance: Duration? = nil) async throws {
        try Task.checkCancellation()
        let sleeper = LoopSleeper(loop: loop, deadline: deadline, tolerance: tolerance ?? .zero)
        try await withTaskCancellationHandler {
            try await withUnsafeThrowingContinuation { (continuation: UnsafeContinuation<Void, any Error>) in
                sleeper.start(continuation)
            }
        } onCancel: {
            sleeper.cancel()
        }
    }
}

extension RunLoop {
    /// The loop's clock (``RunLoopClock``): its time, and sleeps that are this loop's timers.
    public var clock: RunLoopClock { RunLoopClock(loop: self) }

    /// The loop's clock now, from any thread: the real loop clock, or the virtual clock of a loop
    /// made by RunLoopTesting's `withVirtualTime` (read from the scope's thread or any other).
    public var now: ContinuousClock.Instant {
        if let virtualNs = virtualNowNs { return RunLoop.instant(ofNanoseconds: virtualNs) }
        return RunLoop.now
    }
}

/// One sleep: the continuation, the timer that ends it, and who ended it first (the timer, a
/// cancellation or the loop's exit). Every path resumes the continuation exactly once.
///
/// `@unchecked Sendable` is safe: the mutable state is behind `state`'s mutex; `loop`,
/// `deadline` and `tolerance` are constants.
final class LoopSleeper: @unchecked Sendable {
    private enum State {
        case idle
        case waiting(UnsafeContinuation<Void, any Error>)
        case scheduled(UnsafeContinuation<Void, any Error>, Weak<RunLoopTimer>)
        case cancelledEarly
        case finished
    }


    /// Lives in the timer's handler: when the loop lets go of the handler, the sleep ends (a
    /// no-op once it has ended: fired or cancelled).
    private final class EndsWithTimer: Sendable {
        let sleeper: LoopSleeper
        init(_ sleeper: LoopSleeper) { self.sleeper = sleeper }
        deinit { sleeper.finish(throwing: RunLoop.PerformError.threadExited) }
    }

    private let loop: RunLoop
    private let deadline: ContinuousClock.Instant
    private let tolerance: Duration
    private let state = Mutex(State.idle)

    init(loop: RunLoop, deadline: ContinuousClock.Instant, tolerance: Duration) {
        self.loop = loop
        self.deadline = deadline
        self.tolerance = tolerance
    }

    /// Takes the continuation and makes the timer (on the loop's thread).
    func start(_ continuation: UnsafeContinuation<Void, any Error>) {
        let cancelled = state.locked { state -> Bool in
            if case .cancelledEarly = state {
                state = .finished
                return true
            }
            state = .waiting(continuation)
            return false
        }
        if cancelled {
            continuation.resume(throwing: CancellationError())
            return
        }
        if loop.isCurrent {
            schedule()
        } else {
            loop.perform(inModes: RunLoop.commonModesOnly) { [self] in schedule() }
            // A loop whose thread has exited drops the block: end the sleep here instead. (One
            // that exits after taking the block lets go of the timer, which ends it then.)
            if loop.blocksClosed.load(ordering: .acquiring) { finish(throwing: RunLoop.PerformError.threadExited) }
        }
    }

    /// On the loop's thread: adds the timer, unless the sleep already ended.
    private func schedule() {
        let ending = EndsWithTimer(self)
        let timer = RunLoopTimer(fireAt: deadline, tolerance: tolerance) { _ in ending.sleeper.fire() }
        let added = state.locked { state -> Bool in
            guard case .waiting(let continuation) = state else { return false }
            state = .scheduled(continuation, Weak(timer))
            return true
        }
        if added { loop.add(timer, forMode: .common) }
    }

    fileprivate func fire() {
        let continuation = state.locked { state -> UnsafeContinuation<Void, any Error>? in
            guard case .scheduled(let continuation, _) = state else { return nil }
            state = .finished
            return continuation
        }
        continuation?.resume()
    }

    /// The task was cancelled: the timer goes, the sleep throws.
    func cancel() { finish(throwing: CancellationError()) }

    fileprivate func finish(throwing error: any Error) {
        let (continuation, timer) = state.locked { state -> (UnsafeContinuation<Void, any Error>?, RunLoopTimer?) in
            switch state {
            case .idle:
                state = .cancelledEarly
                return (nil, nil)
            case .waiting(let continuation):
                state = .finished
                return (continuation, nil)
            case .scheduled(let continuation, let weakTimer):
                state = .finished
                return (continuation, weakTimer.value)
            case .cancelledEarly, .finished:
                return (nil, nil)
            }
        }
        timer?.invalidate()
        continuation?.resume(throwing: error)
    }
}
