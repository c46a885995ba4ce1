import RunLoopKit

import class RunLoopKit.RunLoop

extension RunLoop {
    /// Runs the loop in `mode` until `condition` holds, for at most `timeout`, and returns whether
    /// it held: a synchronous test (an XCTest method on the main thread, code on a loop thread)
    /// waits for what the loop's timers, blocks and sources do, without sleeping for a guessed
    /// time and without polling.
    ///
    /// `condition` is checked before the first pass, and then in every pass of the loop, before
    /// its timers and before it sleeps; once it holds, the run stops. So it must become true
    /// through work the loop runs (a timer, a block, a source, a message): a change made by
    /// another thread is seen at the loop's next pass, which that thread can bring about with
    /// `RunLoop.wakeUp()`. If the mode has nothing to run (no timers, sources or blocks), this
    /// returns at once with `condition()`: nothing could make it true, and it does not spin.
    ///
    /// <!-- snippet: prelude
    /// import Synchronization
    /// -->
    /// ```swift
    /// let fired = Atomic(0)
    /// let timer = RunLoopTimer(after: .milliseconds(10), repeating: .milliseconds(10)) { _ in
    ///     fired.add(1, ordering: .relaxed)
    /// }
    /// RunLoop.current.add(timer, forMode: .default)
    /// let done = RunLoop.current.run(timeout: .seconds(5)) { fired.load(ordering: .relaxed) == 3 }
    /// timer.invalidate()
    /// ```
    ///
    /// On a loop on virtual time (``withVirtualTime(_:)``), `timeout` is virtual: the runs move the
    /// virtual clock, and the call returns when it reaches the deadline, whatever real time passed.
    ///
    /// - Precondition: Called on the loop's own thread.
    @discardableResult
    public func run(mode: Mode = .default, timeout: Duration, until condition: () -> Bool) -> Bool {
        if condition() { return true }
        // A year at most: an instant plus a larger duration would overflow. On the loop's own
        // clock (`RunLoop.now` on its thread): virtual time on a loop made by withVirtualTime, so
        // the runs, which move virtual time, end at the virtual deadline.
        let deadline = RunLoop.now.advanced(by: min(max(timeout, .zero), .seconds(365 * 86400)))
        // The run this call makes is one level deeper than the caller's: its observer stops that
        // run only, never one nested inside it by a callout (which has its own condition).
        let depth = runDepth + 1
        return withoutActuallyEscaping(condition) { condition in
            let check = ConditionCheck(condition)
            let observer = RunLoopObserver(activities: [.beforeTimers, .beforeWaiting]) { _, _ in
                let loop = RunLoop.current
                if loop.runDepth == depth, check.holds() { loop.stop() }
            }
            add(observer, forMode: mode)
            defer { observer.invalidate() }
            while true {
                let remaining = RunLoop.now.duration(to: deadline)
                let result = run(mode: mode, for: max(remaining, .zero))
                if condition() { return true }
                if result == .finished || RunLoop.now >= deadline { return false }
                // Stopped by another caller, or a source handled: run again until the deadline.
            }
        }
    }
}

/// The condition of one ``RunLoop/run(mode:timeout:until:)`` call, held by its observer.
///
/// `@unchecked Sendable`: the observer is added to the calling loop only, so it is called on the
/// calling thread only, inside the call (it is invalidated before the call returns and the
/// non-escaping closure with it).
private struct ConditionCheck: @unchecked Sendable {
    let holds: () -> Bool
    init(_ holds: @escaping () -> Bool) { self.holds = holds }
}
