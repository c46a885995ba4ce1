import CRunLoopKit
import Glibc
import Synchronization

/// A thread whose run loop stays alive to take tasks, stops cleanly, and never leaks: iOS's
/// thread keep-alive (线程保活, ZXYPermenantThread / LBPPermenantThread), done properly.
///
/// <!-- snippet: prelude
/// struct Record: Sendable {}
/// final class Database: Sendable { func write(_ record: Record) {}; var count: Int { 0 } }
/// let database = Database()
/// let record = Record()
/// -->
/// ```swift
/// let worker = PermanentThread(name: "db-writer")
/// try worker.execute { database.write(record) }           // asynchronous, in order
/// let count = try worker.executeAndWait { database.count } // synchronous, with the value
/// worker.stop()                                            // runs what is queued, then joins
/// ```
///
/// The thread is a POSIX thread named `name` (the kernel keeps the first 15 bytes: `ps -L`,
/// `top -H`, `/proc/<pid>/task/<tid>/comm` and debuggers show it). Its loop is kept alive by a
/// ``MessagePort`` that never receives a message (iOS's `addPort:[NSPort port]`), and runs the
/// stoppable keep-alive pattern: `while !stopped { loop.run(mode: .default, before: RunLoop.distantFuture) }`.
///
/// - Tasks run one at a time on that thread, first in, first out (in the order their
///   ``execute(_:)`` or ``executeAndWait(_:)`` calls were accepted), as blocks of ``loop`` queued for
///   ``RunLoop/Mode/common``. Other work may share the loop: add timers or sources to ``loop`` (for
///   ``RunLoop/Mode/default`` or ``RunLoop/Mode/common``) and they are served between tasks.
/// - ``stop()`` refuses new tasks, lets every task accepted before it run, ends the loop and waits
///   for the thread to end. It is idempotent and safe from any thread.
/// - Dropping the last reference stops the thread the same way (`deinit`), so a forgotten thread
///   does not outlive its owner.
///
/// A task may run the thread's loop itself (a nested run). A stop requested while that run is in
/// progress ends it and then the outer one (if the nested run is in a common mode, where the
/// stop's block can run); a stop requested before the task started waits for the task to return,
/// like every task queued before it.
///
/// If the loop's kernel descriptors cannot be opened (the process ran out of descriptors), the
/// thread ends at once and every submission throws ``Error/stopped``; the loop logs the cause.
public final class PermanentThread: Sendable, CustomStringConvertible {
    /// Why a task was not accepted.
    public enum Error: Swift.Error, Sendable, Hashable, CustomStringConvertible {
        /// The thread was stopped (``PermanentThread/stop()`` or `deinit`), or could not start its
        /// loop: it takes no more tasks. The task was not run.
        case stopped

        /// What went wrong, in a sentence.
        public var description: String {
            switch self {
            case .stopped: "the PermanentThread was stopped; the task was rejected"
            }
        }
    }

    /// The name given to ``init(name:)``; the kernel sees its first 15 bytes.
    public let name: String
    /// The thread's run loop, for adding timers and sources to it (tasks reach it through
    /// ``execute(_:)``). It runs only on the thread; after ``stop()`` it runs no more.
    public let loop: RunLoop
    /// The thread's kernel id (`gettid()`), as `/proc/self/task/<tid>` and `ps -L` show it.
    public let threadID: Int32

    private let core: PermanentThreadCore
    /// The pthread; joined once by ``stop()`` or `deinit`, or detached by a `deinit` that runs on
    /// the thread itself.
    private let handle: pthread_t
    /// Set by the one caller that joins the thread.
    private let joinClaimed = Atomic<Bool>(false)
    /// Set once the thread has been joined: the other stoppers wait for it.
    private let joined = OneShot<Bool>()

    /// Starts the thread, and returns once its loop runs and can take tasks.
    ///
    /// - Parameter name: The thread's name (the kernel keeps the first 15 bytes).
    /// - Precondition: The system lets the process make a thread (`pthread_create` succeeds).
    public init(name: String = "PermanentThread") {
        self.name = name
        let core = PermanentThreadCore(name: name)
        self.core = core
        var thread = pthread_t()
        let status = pthread_create(
            &thread, nil,
            { raw in
                Unmanaged<PermanentThreadCore>.fromOpaque(raw!).takeRetainedValue().main()
                return nil
            }, Unmanaged.passRetained(core).toOpaque())
        guard status == 0 else {
            fatalError("PermanentThread '\(name)': pthread_create failed: \(String(cString: strerror(status)))")
        }
        handle = thread
        let started = core.started.wait()
        loop = started.loop
        threadID = started.tid
    }

    /// Stops the thread (see ``stop()``). Dropping the last reference on the thread itself (from a
    /// task, say) cannot wait for the thread to end: the stop is requested, the thread is detached,
    /// and it ends after the tasks already accepted.
    deinit {
        core.requestStop(loop)
        if pthread_equal(pthread_self(), handle) != 0 {
            pthread_detach(handle)
        } else {
            join()
        }
    }

    /// Runs `task` on the thread, asynchronously: it is queued behind the tasks accepted before it,
    /// and runs once they have.
    ///
    /// Safe from any thread, the permanent thread included (the task then runs after the current
    /// task returns).
    ///
    /// - Throws: ``Error/stopped`` once ``stop()`` has been called (or the thread could not start):
    ///   the task is not run. A task accepted before ``stop()`` always runs.
    /// - Complexity: O(1) amortized.
    public func execute(_ task: @escaping @Sendable () -> Void) throws(Error) {
        guard core.submit(task, to: loop) else { throw .stopped }
    }

    /// Runs `task` on the thread and waits for it: returns its value or rethrows its error.
    ///
    /// Called on the permanent thread itself (from a task), it runs `task` at once, inline, rather
    /// than queue it behind the running task and wait for itself forever.
    ///
    /// - Returns: What `task` returned.
    /// - Throws: What `task` threw; ``Error/stopped`` if the thread was stopped before the task was
    ///   accepted (it is not run then). Called on the thread itself, `task` runs even after a stop
    ///   was requested: the thread is still running its last tasks.
    public func executeAndWait<T: Sendable>(_ task: @escaping @Sendable () throws -> T) throws -> T {
        if isCurrent { return try task() }
        let completion = BlockCompletion<Result<T, any Swift.Error>>()
        guard core.submit(completion.block({ Result { try task() } }), to: loop) else { throw Error.stopped }
        completion.noticeDrop(by: loop)
        switch completion.wait() {
        case .ran(let result): return try result.get()
        // An accepted task is dropped only if the thread ended otherwise than by stop() (a task
        // called pthread_exit, say).
        case .dropped: throw Error.stopped
        }
    }

    /// Stops the thread: new tasks are rejected from now on, the tasks accepted before run, then
    /// the loop exits and the thread ends. Returns once the thread has ended (it is joined), so
    /// its loop's descriptors are closed by then.
    ///
    /// Idempotent, and safe from any thread: calls made while another call waits for the thread
    /// wait too. Called on the permanent thread itself (from a task), it cannot wait for the thread
    /// it runs on: it requests the stop and returns at once, and the thread ends after the current
    /// task and the ones accepted before the stop; a later `stop()` from another thread (or
    /// `deinit`) waits for that end.
    public func stop() {
        core.requestStop(loop)
        if pthread_equal(pthread_self(), handle) == 0 { join() }
    }

    /// Whether ``stop()`` was called (or the thread could not start): tasks are rejected.
    public var isStopped: Bool { !core.accepting.locked { $0 } }

    /// Whether the calling thread is this permanent thread.
    public var isCurrent: Bool { pthread_equal(pthread_self(), handle) != 0 }

    /// `<PermanentThread 'name' tid 1234 running>`.
    public var description: String {
        "<PermanentThread '\(name)' tid \(threadID) \(isStopped ? "stopped" : "running")>"
    }

    /// Joins the thread once; other callers wait until it has been joined.
    private func join() {
        if !joinClaimed.exchange(true, ordering: .acquiringAndReleasing) {
            pthread_join(handle, nil)
            joined.set(true)
        } else {
            _ = joined.wait()
        }
    }
}

/// What the permanent thread shares with its owner. The thread holds it, not the
/// ``PermanentThread``, so that dropping the owner's last reference runs its `deinit` (iOS's
/// `__weak typeof(self) weakSelf`).
final class PermanentThreadCore: Sendable {
    struct Started: Sendable {
        let loop: RunLoop
        let tid: Int32
    }

    let name: String
    /// Whether tasks are accepted. Submissions queue their block while holding this lock, and the
    /// stop queues its final block after clearing the flag under it: every accepted task is queued
    /// before the final block, and blocks run first in, first out. (The lock is never held while a
    /// task runs.)
    let accepting = Mutex<Bool>(true)
    /// Read by the thread's `while !stopped` loop; set on the thread by the final block.
    let stopped = Atomic<Bool>(false)
    /// The loop and tid, handed to `init` once the loop is ready.
    let started = OneShot<Started>()

    /// The modes tasks are queued for: the common modes, as `performSelector:onThread:` does.
    static let taskModes: [RunLoop.Mode] = [.common]

    init(name: String) { self.name = name }

    /// The thread's body.
    func main() {
        _ = crlk_set_thread_name(name)
        let loop = RunLoop.current
        let tid = crlk_gettid()
        let keepAlive = MessagePort<Never> { _ in }
        loop.add(keepAlive, forMode: .default)
        started.set(Started(loop: loop, tid: tid))
        while !stopped.load(ordering: .acquiring) {
            loop.run(mode: .default, before: RunLoop.distantFuture)
        }
        keepAlive.invalidate()
        // Returning ends the thread; its loop is torn down by the thread-exit hook.
    }

    /// Queues `block` on `loop` unless stopping; returns whether it was accepted.
    func submit(_ block: @escaping @Sendable () -> Void, to loop: RunLoop) -> Bool {
        accepting.locked { accepting -> Bool in
            guard accepting else { return false }
            loop.perform(inModes: Self.taskModes, block)
            return true
        }
    }

    /// Rejects tasks from now on and queues the final block, behind every accepted task (once).
    func requestStop(_ loop: RunLoop) {
        accepting.locked { accepting in
            guard accepting else { return }
            accepting = false
            loop.perform(inModes: Self.taskModes) { [self] in finish(loop) }
        }
    }

    /// The final block, on the thread: ends the loop's run. In a run nested in a task, it ends that
    /// run and comes back for the outer one.
    private func finish(_ loop: RunLoop) {
        stopped.store(true, ordering: .releasing)
        loop.stop()
        if loop.runDepth > 1 {
            loop.perform(inModes: Self.taskModes) { [self] in finish(loop) }
        }
    }
}
