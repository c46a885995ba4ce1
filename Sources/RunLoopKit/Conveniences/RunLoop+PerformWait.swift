extension RunLoop {
    /// Queues `block` to run on the loop's thread the next time the loop runs in one of `modes`,
    /// and, with `waitUntilDone`, blocks the calling thread until it has run — NSObject's
    /// `performSelector:onThread:withObject:waitUntilDone:modes:` for closures.
    ///
    /// <!-- snippet: prelude
    /// let networkThread = PermanentThread(name: "network")
    /// let networkLoop = networkThread.loop
    /// nonisolated(unsafe) var connections: [Int32] = []  // the network thread's
    /// -->
    /// ```swift
    /// // From any thread: run on the network thread's loop, and wait for it.
    /// try networkLoop.perform(inModes: [.common], waitUntilDone: true) {
    ///     connections.removeAll()
    /// }
    /// ```
    ///
    /// The block is delivered as NSThread delivers a perform: queued first in, first out with the
    /// loop's other performs, and run by a version-0 source of the loop, one per mode
    /// (``Mode/common``'s is in every common mode); it wakes the loop. So, unlike a block queued with
    /// ``perform(inModes:_:)->()`` (`CFRunLoopPerformBlock`), it is a handled source:
    /// ``run(mode:before:)-(_,ContinuousClock.Instant)``,
    /// ``acceptInput(mode:before:)-(_,ContinuousClock.Instant)`` and a run with
    /// `returnAfterSourceHandled` return after it. That is what the keep-alive pattern
    /// `while keepRunning { loop.run(mode: .default, before: RunLoop.distantFuture) }` needs to
    /// notice a flag cleared by the perform, without a ``stop()``. As NSThread's, a mode's source
    /// is made the first time a perform names the mode and stays in it, so the mode is not empty
    /// from then on (it keeps a run in it waiting, as on Darwin). A block queued for a mode
    /// the loop is not running in waits — and so does a caller that waits for it — until the loop
    /// runs in one of its modes; a block queued for several modes runs once, in the first of them
    /// the loop runs.
    ///
    /// Called on the loop's own thread with `waitUntilDone: true`, the block runs at once, inline,
    /// whatever mode the loop is in (or even if it is not running), as NSObject does: waiting for a
    /// block that only this thread could run would deadlock.
    ///
    /// A waiting caller is never left waiting forever for a loop that cannot run the block: if the
    /// loop's thread exits first, the loop drops its queued performs, and the call throws
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
            try performAsSource(inModes: modes, block)
            return
        }
        if isCurrent {
            block()
            return
        }
        let completion = BlockCompletion<Void>()
        try performAsSource(inModes: modes, completion.block(block))
        completion.noticeDrop(by: self)
        if case .dropped = completion.wait() { throw .threadExited }
    }
}

extension RunLoop {
    /// What became of a block queued with ``perform(inModes:waitingAtMost:_:)``.
    public enum WaitOutcome: Sendable, Hashable {
        /// The block ran to its end within the time allowed.
        case completed
        /// The time ran out before the block started; it was cancelled and will never run.
        case cancelled
        /// The time ran out while the block was running on the loop's thread; it finishes on its
        /// own, and nothing waits for it.
        case stillRunning
    }

    /// Queues `block` to run on the loop's thread the next time the loop runs in one of `modes`,
    /// and blocks the calling thread until it has run or `timeout` has passed:
    /// ``perform(inModes:waitUntilDone:_:)`` for a caller that must not wait forever for a loop
    /// that is busy, runs in another mode, or never runs.
    ///
    /// <!-- snippet: prelude
    /// let worker = PermanentThread(name: "worker")
    /// func flush() {}
    /// func log(_ message: String) {}
    /// -->
    /// ```swift
    /// switch try worker.loop.perform(inModes: [.common], waitingAtMost: .seconds(1), { flush() }) {
    /// case .completed: break
    /// case .cancelled: log("the worker's loop did not get to it; it will not run")
    /// case .stillRunning: log("flush() is slow; it finishes on its own")
    /// }
    /// ```
    ///
    /// When the time runs out before the block starts, the block is cancelled in one atomic step
    /// with the loop's start of it, so ``WaitOutcome/cancelled`` means it never runs. Called on
    /// the loop's own thread, the block runs at once, inline (as with `waitUntilDone`), and the
    /// outcome is ``WaitOutcome/completed``. A negative timeout counts as zero.
    ///
    /// - Throws: ``PerformError/noModes`` if `modes` is empty (nothing is queued);
    ///   ``PerformError/threadExited`` if the loop's thread exited, so the block was dropped.
    public func perform(
        inModes modes: [Mode] = RunLoop.defaultModeOnly,
        waitingAtMost timeout: Duration,
        _ block: @escaping @Sendable () -> Void
    ) throws(PerformError) -> WaitOutcome {
        guard !modes.isEmpty else { throw .noModes }
        if isCurrent {
            block()
            return .completed
        }
        let start = PerformRequestCore(block, target: nil)
        let completion = BlockCompletion<Bool>()
        try performAsSource(
            inModes: modes,
            completion.block {
                guard let body = start.start() else { return false }
                body()
                return true
            })
        completion.noticeDrop(by: self)
        switch completion.wait(timeout: timeout) {
        case .ran(true): return .completed
        case .ran(false): return .cancelled
        case .dropped: throw .threadExited
        case nil: break
        }
        if let cancelled = start.cancel() {
            // Released here, outside every lock.
            _ = consume cancelled
            return .cancelled
        }
        // Started meanwhile: it may have just finished.
        return completion.wait(timeout: .zero).map { if case .ran(true) = $0 { .completed } else { .stillRunning } }
            ?? .stillRunning
    }
}
