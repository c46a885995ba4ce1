import CRunLoopKit

// A loop as the serial executor of actors and as a task executor: an actor whose
// `unownedExecutor` is a loop's, and a task started with `Task(executorPreference: loop)`, run
// every job on the loop's thread, as a block in the common modes, between the loop's timers and
// sources.

extension RunLoop: SerialExecutor, TaskExecutor {
    /// Runs `job` on the loop's thread: queues it as a block in the common modes
    /// (``perform(inModes:_:)->()`` with `[.common]`), so it runs the next time the loop runs in any
    /// of ``commonModes``, first in, first out with the loop's other blocks. Called by the Swift
    /// runtime, from any thread, for actors pinned to the loop and for tasks that prefer it
    /// (`Task(executorPreference: loop) { … }`, `withTaskExecutorPreference(loop) { … }`); it
    /// wakes the loop.
    ///
    /// Jobs do not run while the loop is not running, or while it runs in a mode that is not
    /// common, and they do not keep a run alive once they are done (give the loop a source or a
    /// timer). Once the loop's thread has exited, jobs are dropped (with a warning): a task
    /// waiting for an actor pinned to such a loop never resumes.
    ///
    /// - Complexity: O(1) amortized; one allocation (the block).
    public func enqueue(_ job: consuming ExecutorJob) {
        let job = UnownedJob(job)
        // Unowned is enough: the block lives in this loop's own queue, so it can only run while
        // the loop exists. The job may be an actor's (this loop as its serial executor) or a task
        // that prefers this loop (as its task executor): run as both, it keeps either isolation.
        let executor = asUnownedSerialExecutor()
        let taskExecutor = asUnownedTaskExecutor()
        perform(inModes: RunLoop.commonModesOnly) {
            job.runSynchronously(isolatedTo: executor, taskExecutor: taskExecutor)
        }
    }

    /// The loop as an unowned serial executor, for an actor's `unownedExecutor`:
    ///
    /// ```swift
    /// actor Model {
    ///     let loop: RunLoop
    ///     init(loop: RunLoop) { self.loop = loop }
    ///     nonisolated var unownedExecutor: UnownedSerialExecutor { loop.asUnownedSerialExecutor() }
    /// }
    /// ```
    ///
    /// Two executors are the same when they are the same loop. Any thread.
    public func asUnownedSerialExecutor() -> UnownedSerialExecutor {
        UnownedSerialExecutor(ordinary: self)
    }

    /// Whether `other` is this loop: a loop is the only execution context that is exclusive with
    /// itself. (The runtime asks only for executors made with `complexEquality`; the ones
    /// ``asUnownedSerialExecutor()`` makes are compared by identity, with the same answer.)
    public func isSameExclusiveExecutionContext(other: RunLoop) -> Bool { self === other }

    /// Stops the process, with a message naming the loop and both threads, unless the caller runs
    /// on the loop's thread.
    ///
    /// The runtime calls this (or ``isIsolatingCurrentContext()``) when code that is not running a
    /// job of this executor asks to be isolated to it — `assumeIsolated` or `preconditionIsolated`
    /// on an actor pinned to the loop, from a timer handler, a source, an observer or a block
    /// on the loop's thread, for example. Every such callback runs on the loop's thread, where
    /// jobs of the loop's actors cannot run concurrently: the loop runs one thing at a time.
    public func checkIsolated() {
        guard !isCurrent else { return }
        // fatalError, not preconditionFailure: the message must name the threads in -O builds too.
        fatalError(
            "code isolated to \(shortDescription) (an actor's serial executor) ran on thread '\(ThreadLoops.currentName())' (tid \(crlk_gettid())); it must run on the loop's thread '\(ownerName)' (tid \(ownerTID))"
        )
    }

    /// Whether the caller runs on the loop's thread (``isCurrent``): the runtime's non-crashing
    /// form of ``checkIsolated()``, used by `assumeIsolated` and `#isolation` checks outside this
    /// executor's jobs.
    public func isIsolatingCurrentContext() -> Bool? { isCurrent }

    /// `[.common]`, made once (an array literal per job would allocate).
    static let commonModesOnly: [Mode] = [.common]
}
