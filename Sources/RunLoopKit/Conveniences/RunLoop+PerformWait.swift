extension RunLoop {
    /// Queues `block` to run on the loop's thread the next time the loop runs in one of `modes`,
    /// and, with `waitUntilDone`, blocks the calling thread until it has run — NSObject's
    /// `performSelector:onThread:withObject:waitUntilDone:modes:` for closures.
    ///
    /// ```swift
    /// // From any thread: run on the network thread's loop, and wait for it.
    /// try networkLoop.perform(inModes: [.common], waitUntilDone: true) {
    ///     connections.removeAll()
    /// }
    /// ```
    ///
    /// The block is queued exactly as ``perform(inModes:_:)->()`` queues one: first in, first out
    /// with the loop's other blocks, only in `modes` (``Mode/common`` matches every common mode),
    /// and it wakes the loop. A block queued for a mode the loop is not running in waits — and so
    /// does a caller that waits for it — until the loop runs in one of its modes.
    ///
    /// Called on the loop's own thread with `waitUntilDone: true`, the block runs at once, inline,
    /// whatever mode the loop is in (or even if it is not running), as NSObject does: waiting for a
    /// block that only this thread could run would deadlock.
    ///
    /// A waiting caller is never left waiting forever for a loop that cannot run the block: if the
    /// loop's thread exits first, the loop drops its queued blocks, and the call throws
    /// ``PerformError/threadExited``.
    ///
    /// - Note: Unlike `performSelector:onThread:…`, whose modes default to the common modes,
    ///   `modes` defaults to `[.default]`, as in the other `perform` methods of ``RunLoop``.
    ///
    /// - Parameters:
    ///   - modes: The modes the block may run in; `[.default]` if omitted.
    ///   - waitUntilDone: Whether to block the calling thread until the block has run.
    ///   - block: The work, run on the loop's thread.
    /// - Throws: ``PerformError/noModes`` if `modes` is empty (nothing is queued);
    ///   ``PerformError/threadExited`` if the loop's thread has exited, so the block was dropped
    ///   (with `waitUntilDone: false`, only when the thread had exited already when the call was
    ///   made: a block dropped later is dropped silently, as with ``perform(inModes:_:)->()``).
    public func perform(
        inModes modes: [Mode] = RunLoop.defaultModeOnly,
        waitUntilDone: Bool,
        _ block: @escaping @Sendable () -> Void
    ) throws(PerformError) {
        guard !modes.isEmpty else { throw .noModes }
        guard waitUntilDone else {
            guard !blocksClosed.load(ordering: .acquiring) else { throw .threadExited }
            perform(inModes: modes, block)
            return
        }
        if isCurrent {
            block()
            return
        }
        let completion = BlockCompletion<Void>()
        perform(inModes: modes, completion.block(block))
        completion.noticeDrop(by: self)
        if case .dropped = completion.wait() { throw .threadExited }
    }
}
