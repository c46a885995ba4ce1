// Timer conveniences: scheduledTimer (`RunLoop.schedule`), `fire()`, and timers with a weak target
// (the NSProxy fix for NSTimer's retain cycle, built in).

extension RunLoop {
    /// Creates a timer and adds it to this loop in `mode`: NSTimer's
    /// `scheduledTimerWithTimeInterval:repeats:block:`, for any loop (not only the caller's).
    ///
    /// <!-- snippet: prelude
    /// func refresh() {}
    /// -->
    /// ```swift
    /// let timer = loop.schedule(after: .seconds(1), repeating: .seconds(1), mode: .common) { _ in
    ///     refresh()
    /// }
    /// ```
    ///
    /// The loop keeps the timer until it is invalidated (a one-shot timer is, after it fires).
    /// Remember NSTimer's first pitfall: a timer in ``Mode/default`` stops while the loop runs in
    /// ``Mode/tracking``; pass ``Mode/common`` for a timer that must keep firing.
    ///
    /// - Parameters:
    ///   - delay: How long from now the first fire is (negative counts as zero).
    ///   - repeating: The repeat interval; nil for a one-shot timer.
    ///   - tolerance: How late the timer may fire so that it shares a wakeup with others.
    ///   - mode: The mode to add it to (``Mode/common`` for every common mode).
    ///   - handler: Called on the loop's thread with the timer.
    /// - Returns: The scheduled timer.
    @discardableResult
    public func schedule(
        after delay: Duration,
        repeating: Duration? = nil,
        tolerance: Duration = .zero,
        mode: Mode = .default,
        _ handler: @escaping @Sendable (RunLoopTimer) -> Void
    ) -> RunLoopTimer {
        let timer = RunLoopTimer(after: delay, repeating: repeating, tolerance: tolerance, handler: handler)
        add(timer, forMode: mode)
        return timer
    }

    /// Creates a timer for `target`, held weakly, and adds it to this loop in `mode`.
    ///
    /// The timer never keeps `target` alive, so an object that owns its timer does not leak (the
    /// retain cycle iOS code breaks with an `NSProxy`). When the timer fires and `target` is gone,
    /// the timer invalidates itself instead of calling `handler`: the loop then releases it, and
    /// `handler` is never called after `target`'s deinitialization.
    ///
    /// ```swift
    /// import RunLoopKit
    /// import Synchronization
    ///
    /// final class Clock: Sendable {
    ///     let timer: Mutex<RunLoopTimer?> = Mutex(nil)
    ///     init(loop: RunLoop) {
    ///         let timer = loop.schedule(after: .seconds(1), repeating: .seconds(1), target: self) {
    ///             clock, _ in clock.tick()
    ///         }
    ///         self.timer.withLock { $0 = timer }
    ///     }
    ///
    ///     func tick() { /* ... */ }
    /// }
    /// ```
    ///
    /// `handler` must not capture `target` strongly itself (it is given the target as its first
    /// argument): a strong capture would bring the cycle back.
    ///
    /// - Returns: The scheduled timer.
    @discardableResult
    public func schedule<Target: AnyObject & Sendable>(
        after delay: Duration,
        repeating: Duration? = nil,
        tolerance: Duration = .zero,
        mode: Mode = .default,
        target: Target,
        _ handler: @escaping @Sendable (Target, RunLoopTimer) -> Void
    ) -> RunLoopTimer {
        let timer = RunLoopTimer(
            after: delay, repeating: repeating, tolerance: tolerance, target: target, handler: handler)
        add(timer, forMode: mode)
        return timer
    }
}

extension RunLoopTimer {
    /// Creates a timer for `target`, held weakly, that first fires `after` from now and then, if
    /// `repeating` is given, every `repeating`.
    ///
    /// When the timer fires (or ``fire()`` is called) and `target` has been deallocated, the timer
    /// invalidates itself and `handler` is not called. See
    /// ``RunLoop/schedule(after:repeating:tolerance:mode:target:_:)``.
    public convenience init<Target: AnyObject & Sendable>(
        after delay: Duration,
        repeating: Duration? = nil,
        tolerance: Duration = .zero,
        target: Target,
        handler: @escaping @Sendable (Target, RunLoopTimer) -> Void
    ) {
        let reference = Weak(target)
        self.init(after: delay, repeating: repeating, tolerance: tolerance) { timer in
            // The strong reference lives only for the call.
            guard let target = reference.value else {
                timer.invalidate()
                return
            }
            handler(target, timer)
        }
    }
}

