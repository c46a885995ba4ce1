import CRunLoopKit

// A loop as the serial executor of actors and as a task executor: an actor whose
// `unownedExecutor` is a loop's, and a task started with `Task(executorPreference: loop)`, run
// every job on the loop's thread, as a block in the common modes, between the loop's timers and
// sources.
//
// The two roles have two identities. The loop is the task executor (the runtime retains and
// releases the object a task's preference names, so it must be the loop itself); an object the
// loop keeps (`LoopSerialExecutor`) is the serial executor. One object cannot be both: a job
// arrives through the one `enqueue` both protocols share, and a task's job run isolated to the
// loop would leave that isolation, with a hop back through the loop's queue, at each of its
// nonisolated async calls and returns (eight hops per tick of an async timer sequence, measured).

extension RunLoop: SerialExecutor, TaskExecutor {
    /// Runs `job` on the loop's thread for a task that prefers the loop
    /// (`Task(executorPreference: loop) { … }`, `withTaskExecutorPreference(loop) { … }`): queues
    /// it as a block in the common modes (``perform(inModes:_:)->()`` with `[.common]`), so it runs
    /// the next time the loop runs in any of ``commonModes``, first in, first out with the loop's
    /// other blocks, with the loop as the current task executor and no actor isolation (its
    /// nonisolated async calls go on inline). Called by the Swift runtime, from any thread; it
    /// wakes the loop. Jobs of actors pinned to the loop come through the serial executor that
    /// ``asUnownedSerialExecutor()`` names instead.
    ///
    /// Jobs do not run while the loop is not running, or while it runs in a mode that is not
    /// common, and they do not keep a run alive once they are done (give the loop a source or a
    /// timer). Once the loop's thread has exited, a job (one queued then, or one that comes
    /// later) runs on the global concurrent executor instead: the task is not isolated to the
    /// loop, so it goes on there and finds the loop gone (its ``RunLoopClock`` sleeps throw
    /// ``RunLoop/PerformError/threadExited``).
    ///
    /// - Important: Give an actor `loop.asUnownedSerialExecutor()`, never an
    ///   `UnownedSerialExecutor` made from the loop object itself: the loop runs what it is given
    ///   as a task's job, so that actor's jobs would never be isolated to it.
    ///
    /// - Complexity: O(1) amortized; no allocation (the job rides in the block queue as it is).
    public func enqueue(_ job: consuming ExecutorJob) {
        enqueue(PendingBlock(modes: .one(.common), work: .taskJob(UnownedJob(job))))
    }

    /// Runs `job` on the loop's thread isolated to the loop (an actor's job, the main actor's when
    /// this is the main loop): as ``enqueue(_:)``, with the loop's serial executor
    /// (``asUnownedSerialExecutor()``) as the job's isolation and no task executor (naming one would
    /// make the runtime hop through the queue again at the next call into the same isolation from
    /// a task that prefers no executor). Any thread.
    ///
    /// The serial executor never re-enters: if the block finds another of its jobs on the thread's
    /// stack (that job runs the loop nested), this one waits and runs when that job returns
    /// (``LoopSerialExecutor/run(_:)``).
    package func enqueueIsolated(_ job: consuming ExecutorJob) {
        enqueue(PendingBlock(modes: .one(.common), work: .isolatedJob(UnownedJob(job))))
    }

    /// Runs `job` isolated to the loop, now, from one of the loop's callouts (a timer that ends a
    /// sleep), or once the job of the loop's serial executor that is on the thread's stack
    /// returns. On the loop's thread.
    package func runIsolated(_ job: UnownedJob) {
        serialExecutor.run(job)
    }

    /// The loop's serial executor, for an actor's `unownedExecutor`:
    ///
    /// ```swift
    /// actor Model {
    ///     let loop: RunLoop
    ///     init(loop: RunLoop) { self.loop = loop }
    ///     nonisolated var unownedExecutor: UnownedSerialExecutor { loop.asUnownedSerialExecutor() }
    /// }
    /// ```
    ///
    /// It names an object the loop keeps for its life (the actor keeps it alive by keeping the
    /// loop), which runs the actor's jobs on the loop's thread isolated to the loop. Two executors
    /// are the same when they are the same loop's. Any thread.
    ///
    /// - Complexity: O(1): one atomic load (the runtime asks at every hop to such an actor).
    public func asUnownedSerialExecutor() -> UnownedSerialExecutor {
        serialExecutor.asUnownedSerialExecutor()
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

/// A loop's serial executor (``LoopSerialExecutor``, stored by the core): its jobs run on the loop's
/// thread isolated to the loop (``RunLoop/enqueueIsolated(_:to:)``); its isolation checks are the
/// loop's. An actor keeps its executor alive by keeping the loop (the serial-executor contract), so
/// a job never comes after the loop is gone; if one did, it is dropped with a warning, never run on
/// another thread.
extension LoopSerialExecutor: SerialExecutor {
    func enqueue(_ job: consuming ExecutorJob) {
        guard let loop else {
            Diagnostics.warning("a job for an actor pinned to a run loop came after the loop was gone; dropped")
            return
        }
        loop.enqueueIsolated(job)
    }

    func checkIsolated() {
        guard let loop else { fatalError("code isolated to a run loop that is gone ran on thread '\(ThreadLoops.currentName())'") }
        loop.checkIsolated()
    }

    func isIsolatingCurrentContext() -> Bool? { loop?.isIsolatingCurrentContext() ?? false }
}
