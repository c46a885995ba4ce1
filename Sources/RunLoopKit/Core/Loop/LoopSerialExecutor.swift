import DequeModule

/// The object that is a loop's serial executor: the identity of the actors pinned to the loop,
/// distinct from the loop itself (the loop is the task executor of tasks that prefer it, and both
/// roles would otherwise share one `enqueue`). The concurrency layer makes it a `SerialExecutor`
/// (Concurrency/RunLoop+Executor.swift).
///
/// It also keeps the one rule of a serial executor that the loop's block queue cannot: it never
/// re-enters. A job that runs the loop nested (a modal wait, a test's `run(timeout:until:)`)
/// would otherwise see the next job of the same executor run inside it, as a block of the nested
/// run, with the first job's accesses to the actor's state still open (an exclusivity violation).
/// So jobs run through ``run(_:)``, and a job that arrives while another is on the thread's stack
/// waits in ``deferred`` and runs, in order, when the outermost returns: CF's rule for the main
/// queue (`__CFTSDKeyIsInGCDMainQ`). Work that is not a job but must not interleave with them
/// either (the main queue's drain on the main loop) uses ``enterExclusive()`` and
/// ``leaveExclusive()``.
///
/// The loop keeps it for its life; it refers to the loop weakly, so there is no cycle.
final class LoopSerialExecutor: @unchecked Sendable {
    // `@unchecked Sendable` is safe: `loop` is a weak constant (its reads are atomic); every other
    // stored property is read and written only by `run`, `enterExclusive`, `leaveExclusive` and
    // `whenIdle`, which are called only on the loop's thread (from the loop's callouts — a block,
    // a timer, the main queue's source — and the loop runs only on its own thread), so all their
    // accesses come from that one thread.
    weak let loop: RunLoop?

    /// A job of this executor, or exclusive work, is on the thread's stack.
    private var isRunning = false
    /// Jobs that arrived while ``isRunning``, first in first out.
    private var deferred = Deque<UnownedJob>()
    /// Called once when the outermost exclusive work returns (the main queue's source rejoining).
    private var idleAction: (() -> Void)?

    init(loop: RunLoop) { self.loop = loop }

    /// Whether a job of this executor, or exclusive work, is on the calling thread's stack. On the
    /// loop's thread.
    var isBusy: Bool { isRunning }

    /// Runs `job` isolated to this executor now, or, when another job of this executor is on the
    /// thread's stack (a nested run started from it), once that job has returned: the outermost
    /// job runs what was deferred meanwhile, in the order it came, before it returns. On the
    /// loop's thread.
    ///
    /// - Complexity: O(1) when nothing is deferred (a flag set and cleared, no allocation).
    @inline(__always)
    func run(_ job: UnownedJob) {
        if isRunning {
            deferred.append(job)
            return
        }
        isRunning = true
        job.runSynchronously(on: asUnownedSerialExecutor())
        leaveExclusive()
    }

    /// Marks exclusive work as started; false (and nothing changes) when a job or exclusive work
    /// is already on the thread's stack. On the loop's thread.
    func enterExclusive() -> Bool {
        guard !isRunning else { return false }
        isRunning = true
        return true
    }

    /// Ends the outermost exclusive work: runs the jobs deferred meanwhile (in order; those they
    /// defer in turn too), then the idle action, if any. On the loop's thread.
    func leaveExclusive() {
        let executor = asUnownedSerialExecutor()
        while let next = deferred.popFirst() { next.runSynchronously(on: executor) }
        isRunning = false
        if let action = idleAction {
            idleAction = nil
            action()
        }
    }

    /// Calls `action` when the exclusive work on the thread's stack returns (at once if none is).
    /// One action at a time: a second replaces the first. On the loop's thread.
    func whenIdle(_ action: @escaping () -> Void) {
        guard isRunning else { return action() }
        idleAction = action
    }
}
