@_spi(ExperimentalCustomExecutors) @_spi(ExperimentalScheduling) import _Concurrency
import Glibc
import RunLoopKit
import Synchronization

import class RunLoopKit.RunLoop

/// `RunLoop.main` as the main actor's executor, through Swift 6.3's experimental custom-executor
/// SPI (see the RunLoopConcurrency article "Swift concurrency" for what it changes and why it
/// needs a synchronous `main`).
///
/// <!-- snippet: prelude
/// func start() async {}
/// -->
/// ```swift
/// import Glibc                                         // exit
/// import RunLoopConcurrency
///
/// @main struct App {
///     static func main() {
///         RunLoopConcurrency.installMainExecutor()     // first, before any task
///         Task { @MainActor in await start() }
///         exit(RunLoopConcurrency.runMain())           // until stopMain(status:)
///     }
/// }
/// ```
public enum RunLoopConcurrency {
    private static let installed = Atomic<Bool>(false)

    /// Makes `RunLoop.main` the main actor's executor, and a task that sleeps on any loop's
    /// thread (an actor pinned to a loop, the main actor) sleep on that loop's timers.
    ///
    /// - `@MainActor` jobs run as the main loop's work, in its common modes (as iOS's main run
    ///   loop serves the main queue), between its timers and sources, also while it runs nested in
    ///   a `.tracking` mode; `MainActor.executor` is `RunLoop.main`.
    /// - `Task.sleep` called on a loop's thread becomes a one-shot timer of that loop in its
    ///   common modes (tolerance honoured); elsewhere it is the platform's.
    /// - Everything else (the global pool) stays the platform's.
    ///
    /// Call it once, first thing in a synchronous `main`, on the main thread. An `async main`
    /// cannot use it: its main-actor executor is made before its first line runs, and Swift 6.3.1
    /// did not honour the SPI's `DefaultExecutorFactory` type alias, the way to choose it ahead.
    ///
    /// Stops the process with a message when called off the main thread, a second time, or from
    /// inside a task (the executors exist by then).
    public static func installMainExecutor() {
        guard RunLoop.main.isCurrent else {
            fatalError("RunLoopConcurrency.installMainExecutor(): called off the main thread; call it first thing in a synchronous main")
        }
        if withUnsafeCurrentTask(body: { $0 != nil }) {
            fatalError("RunLoopConcurrency.installMainExecutor(): called from a task; call it first thing in a synchronous main, before any task exists")
        }
        guard !installed.exchange(true, ordering: .acquiringAndReleasing) else {
            fatalError("RunLoopConcurrency.installMainExecutor(): called twice; the main actor's executor is chosen once")
        }
        _createExecutors(factory: RunLoopExecutorFactory.self)
    }

    /// Whether ``installMainExecutor()`` made `RunLoop.main` the main actor's executor.
    public static var isMainExecutorInstalled: Bool { installed.load(ordering: .acquiring) }

    /// Runs the main loop as the main actor's executor until ``stopMain(status:)``, and returns
    /// that status (for `exit(_:)`). On the main thread.
    ///
    /// Use this, not `RunLoop.main.run()`, to keep ``stopMain(status:)``'s status: `run()` ends
    /// on the stop too but returns nothing. A `stopMain` that came before this call (from a task
    /// started earlier, or another thread) is kept: this then returns its status at once. A
    /// `RunLoop.main.stop()` from elsewhere ends it with status 0.
    public static func runMain() -> Int32 {
        if let status = takePendingStop() { return status }
        RunLoop.main.run()
        return takePendingStop() ?? 0
    }

    /// Ends ``runMain()`` with `status`; if `runMain()` is not running yet, the next call returns
    /// `status` at once. Any thread.
    public static func stopMain(status: Int32 = 0) {
        pendingStop.locked { $0 = status }
        RunLoop.main.stop()
        // A stop that reaches the main loop just before its run starts is dropped (as
        // CFRunLoopStop's is); this block stops that run at its first pass if the stop is still
        // pending then. It does nothing once runMain() has taken the stop.
        RunLoop.main.perform(inModes: [.common]) {
            if pendingStop.locked({ $0 != nil }) { RunLoop.main.stop() }
        }
    }

    /// The status of a ``stopMain(status:)`` that ``runMain()`` has not returned yet.
    private static let pendingStop = Mutex<Int32?>(nil)

    private static func takePendingStop() -> Int32? {
        pendingStop.locked { pending in
            defer { pending = nil }
            return pending
        }
    }
}

/// The executors ``RunLoopConcurrency/installMainExecutor()`` installs: `RunLoop.main` for the
/// main actor, and the platform's global executor with sleeps on loop threads served by the loop.
struct RunLoopExecutorFactory: ExecutorFactory {
    static var mainExecutor: any MainExecutor { MainLoopExecutor.shared }
    static var defaultExecutor: any TaskExecutor { LoopAwareGlobalExecutor.shared }
}

/// The global executor: the platform's, except that a job scheduled for later (a `Task.sleep`)
/// by a task running on a loop's thread is a timer of that loop. The runtime asks the global
/// executor for every sleep, whatever the sleeping task's actor; asked on a loop's thread, the
/// caller is a job of that loop (async code runs on a loop's thread only as its jobs), so the job
/// resumes there, on the loop, as it would after a hop.
final class LoopAwareGlobalExecutor: TaskExecutor, SchedulingExecutor, @unchecked Sendable {
    // `@unchecked Sendable` is safe: both stored properties are constants of Sendable executors
    // (the protocol existentials are not marked Sendable themselves).
    static let shared = LoopAwareGlobalExecutor()

    private let platform: any TaskExecutor = PlatformExecutorFactory.defaultExecutor
    private let platformScheduler: any SchedulingExecutor = {
        guard let scheduler = PlatformExecutorFactory.defaultExecutor as? any SchedulingExecutor else {
            fatalError("RunLoopConcurrency: this toolchain's global executor schedules no delayed jobs; the executor SPI changed")
        }
        return scheduler
    }()

    func enqueue(_ job: consuming ExecutorJob) { platform.enqueue(job) }

    func enqueue<C: Clock>(_ job: consuming ExecutorJob, after delay: C.Duration, tolerance: C.Duration?, clock: C) {
        if let loop = RunLoop.runningOnCurrentThread {
            loop.enqueue(job, after: delay, tolerance: tolerance, clock: clock)
        } else {
            platformScheduler.enqueue(job, after: delay, tolerance: tolerance, clock: clock)
        }
    }

    func enqueue<C: Clock>(_ job: consuming ExecutorJob, at instant: C.Instant, tolerance: C.Duration?, clock: C) {
        if let loop = RunLoop.runningOnCurrentThread {
            loop.enqueue(job, at: instant, tolerance: tolerance, clock: clock)
        } else {
            platformScheduler.enqueue(job, at: instant, tolerance: tolerance, clock: clock)
        }
    }
}
