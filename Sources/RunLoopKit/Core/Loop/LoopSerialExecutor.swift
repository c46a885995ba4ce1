/// The object that is a loop's serial executor: the identity of the actors pinned to the loop,
/// distinct from the loop itself (the loop is the task executor of tasks that prefer it, and both
/// roles would otherwise share one `enqueue`). The concurrency layer makes it a `SerialExecutor`
/// (Concurrency/RunLoop+Executor.swift).
///
/// The loop keeps it for its life; it refers to the loop weakly, so there is no cycle.
final class LoopSerialExecutor: Sendable {
    weak let loop: RunLoop?

    init(loop: RunLoop) { self.loop = loop }
}
