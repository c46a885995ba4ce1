import Synchronization

// `try await loop.submit { value }`: runs a closure on the loop's thread and hands its value (or
// error) back to the awaiting task. A verb of its own, as SwiftNIO's `EventLoop.submit`: as an
// async overload of `perform`, a closure such as `{ [items] in items.count }` resolved to the
// fire-and-forget `perform` and returned `()` without a word.

extension RunLoop {
    /// Why ``submit(inModes:_:)`` or ``perform(inModes:waitUntilDone:_:)`` could not run its body.
    public enum PerformError: Error, Sendable, Hashable, CustomStringConvertible {
        /// The loop's thread exited (before the body started): its loop is torn down and runs
        /// nothing any more.
        case threadExited
        /// `modes` was empty: the body could never run.
        case noModes

        /// What went wrong, in a sentence.
        public var description: String {
            switch self {
            case .threadExited: "the run loop's thread has exited; the block was dropped"
            case .noModes: "perform(inModes:) was given no modes; the block could never run"
            }
        }
    }

    /// Runs `body` on the loop's thread, the next time the loop runs in one of `modes`
    /// (``Mode/common`` matches every common mode), and returns its value or rethrows its error.
    ///
    /// <!-- snippet: prelude
    /// final class Model { var items: [Int] = [] }
    /// nonisolated(unsafe) let model = Model()   // state only the loop's thread touches
    /// -->
    /// ```swift
    /// let count = try await loop.submit { model.items.count }   // on the loop's thread
    /// ```
    ///
    /// The body is queued as a block, exactly as ``perform(inModes:_:)->()`` queues one: first in,
    /// first out with the loop's other blocks, and it wakes the loop. The calling task suspends
    /// until the body has run (it never blocks a thread), then continues in its own isolation.
    /// The body runs in the calling task, so it sees the task's cancellation, priority and task-local
    /// values; it runs even if the task is cancelled meanwhile (check `Task.isCancelled` in it to
    /// skip work).
    ///
    /// Calling this from the loop's own thread does not deadlock: a caller isolated to an actor
    /// pinned to this loop (or any task running there) suspends, which ends the current job, and
    /// the loop runs the body in a later pass — in `modes`, so if the loop is running in a mode
    /// not among them, the body waits until the loop runs in one that is.
    ///
    /// The body may also `await`: whatever it runs outside actors (its own code and the
    /// nonisolated functions it calls) runs on the loop's thread in `modes`, each resumption as a
    /// new block; calls to actors run on those actors.
    ///
    /// - Parameters:
    ///   - modes: The modes the body may run in; `[.default]` if omitted.
    ///   - body: The work, run on the loop's thread.
    /// - Returns: What `body` returned.
    /// - Throws: What `body` threw; ``PerformError/threadExited`` if the loop's thread has exited
    ///   (its blocks are dropped, so the body can never start); ``PerformError/noModes`` if `modes`
    ///   is empty. If the thread exits while the body is suspended in an `await`, the rest of the
    ///   body runs on the global concurrent executor: the loop no longer exists.
    /// - Complexity: O(1) amortized to queue; a few small allocations per call (the scope's task
    ///   executor) and per hop onto the loop (the block and its job's handoff).
    public nonisolated(nonsending) func submit<T: Sendable>(
        inModes modes: [Mode] = RunLoop.defaultModeOnly,
        _ body: @concurrent @Sendable () async throws -> T
    ) async throws -> T {
        guard !modes.isEmpty else { throw PerformError.noModes }
        // Every piece of nonisolated code the task runs inside this scope (starting with
        // runOnLoop) is enqueued on `executor`, which queues it as a block in `modes`.
        let executor = LoopTaskExecutor(loop: self, modes: modes)
        return try await withTaskExecutorPreference(executor) {
            try await runOnLoop(body)
        }
    }

    /// The body's first step: on the loop's thread unless the loop dropped the job (its thread
    /// exited), in which case the job ran on the global concurrent executor.
    @concurrent
    private func runOnLoop<T: Sendable>(_ body: @concurrent @Sendable () async throws -> T) async throws -> T {
        guard isCurrent else { throw PerformError.threadExited }
        return try await body()
    }
}

/// A task executor that runs each job on a loop's thread as a block in given modes: the task
/// executor preference of ``RunLoop/submit(inModes:_:)``'s scope.
///
/// A job the loop drops (its thread exited) must still run, or its task would never resume; it is
/// handed to the global concurrent executor instead (see ``JobHandoff``).
final class LoopTaskExecutor: TaskExecutor {
    let loop: RunLoop
    let modes: [RunLoop.Mode]

    init(loop: RunLoop, modes: [RunLoop.Mode]) {
        self.loop = loop
        self.modes = modes
    }

    func enqueue(_ job: consuming ExecutorJob) {
        let handoff = JobHandoff(job: UnownedJob(job), executor: self)
        loop.perform(inModes: modes) { handoff.runHere() }
        // The loop drops blocks once its thread has exited: at once when `blocksClosed` is set
        // (the block is destroyed, and with it the handoff, whose deinit reroutes the job), or at
        // teardown (the same). One case is left: a push that saw `blocksClosed` false but landed
        // after teardown emptied the queue stays queued while the loop lives, and the waiting task
        // keeps the loop alive. That push synchronized with teardown through the queue's lock, so
        // this load sees `true` and reroutes; if the block ran or was dropped first, the handoff
        // was claimed and this does nothing.
        if loop.blocksClosed.load(ordering: .acquiring) { handoff.reroute() }
    }
}

/// One job on its way to a loop: run on the loop's thread by its block, or — if the block never
/// runs because the loop's thread exited — on the global concurrent executor. Whichever claims it
/// first wins; a job runs exactly once.
final class JobHandoff: Sendable {
    private let job: UnownedJob
    private let executor: LoopTaskExecutor
    private let claimed = Atomic<Bool>(false)

    init(job: UnownedJob, executor: LoopTaskExecutor) {
        self.job = job
        self.executor = executor
    }

    /// Runs the job here, on the loop's thread (from its block).
    func runHere() {
        guard claim() else { return }
        job.runSynchronously(on: executor.asUnownedTaskExecutor())
    }

    /// Hands the job to the global concurrent executor, unless it already ran.
    func reroute() {
        guard claim() else { return }
        globalConcurrentExecutor.enqueue(ExecutorJob(job))
    }

    private func claim() -> Bool { !claimed.exchange(true, ordering: .acquiringAndReleasing) }

    /// The block is gone: if it never ran (dropped by the loop's teardown), the job runs elsewhere.
    deinit { reroute() }
}
