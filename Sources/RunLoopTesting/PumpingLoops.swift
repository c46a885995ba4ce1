import Dispatch
import RunLoopKit
import Synchronization
import Testing

import class RunLoopKit.RunLoop

// Tests whose code needs a loop to run while the test awaits: code that adds timers to
// `RunLoop.main` or performs blocks on it (swift-testing does not run the main loop:
// swiftlang/swift-testing#997), or code that must run on a loop's thread. Two async helpers any
// test framework can call (XCTest's async tests included), and swift-testing traits built on them.

/// Runs `body` while the main loop runs on the main thread, in its default mode, and returns what
/// `body` returns.
///
/// The main loop runs in slices of at most 5 ms, each a block of libdispatch's main queue, so
/// main-queue work and `@MainActor` jobs still run between slices (libdispatch does not drain the
/// main queue from inside one of its own blocks). While nothing is due, a slice sleeps in the
/// kernel: no busy loop. When `body` returns or throws, the pumping stops.
///
/// This needs a process whose main thread drains the main queue: one that runs `CFRunLoopRun()`
/// or `RunLoop.main.run()` on it (XCTest's runner, a test executable of your own). In a process
/// whose main thread called `dispatch_main()`, libdispatch parks that thread for good and runs
/// the main queue's blocks on worker threads: `RunLoop.main` can never run there, and this throws
/// ``MainLoopUnavailable`` before `body` runs. `swift test` with swift-testing on Linux is such a
/// process (its main thread waits in libdispatch's `_dispatch_sig_thread`); there, run the code on
/// a loop of its own (``withLoopThread(name:_:)``, `.onLoopThread`).
///
/// <!-- snippet: prelude
/// import Testing
/// final class Banner: Sendable { func show() {}; var isHidden: Bool { true } }
/// let banner = Banner()
/// -->
/// ```swift
/// try await withMainLoopRunning {
///     banner.show()                        // adds a RunLoopTimer to RunLoop.main
///     try await Task.sleep(for: .seconds(2.1))
///     #expect(banner.isHidden)
/// }
/// ```
public func withMainLoopRunning<Result>(
    _ body: () async throws -> Result
) async throws -> Result {
    let pump = MainLoopPump()
    guard await pump.start() else { throw MainLoopUnavailable() }
    defer { pump.stop() }
    return try await body()
}

/// ``withMainLoopRunning(_:)`` found that the main queue's blocks do not run on the main thread:
/// the process's main thread called `dispatch_main()`, and `RunLoop.main` cannot run.
public struct MainLoopUnavailable: Error, CustomStringConvertible {
    public var description: String {
        "RunLoop.main cannot run in this process: its main thread called dispatch_main(), so libdispatch parked it and runs the main queue on worker threads (as `swift test` does on Linux); run the code on a loop thread of its own (withLoopThread, .onLoopThread) or in a test executable whose main thread runs the main loop"
    }
}

/// Runs `body` on the thread of a new loop that runs for the whole call (a `PermanentThread`):
/// `body`, and the nonisolated async code it calls, run on that thread (the loop is the task's
/// executor preference), with the loop passed in. The thread stops when `body` returns or throws.
///
/// <!-- snippet: prelude
/// import Testing
/// -->
/// ```swift
/// try await withLoopThread { loop in
///     #expect(RunLoop.current === loop)
///     let timer = RunLoopTimer(after: .milliseconds(10)) { _ in }
///     loop.add(timer, forMode: .default)
/// }
/// ```
public func withLoopThread<Result: Sendable>(
    name: String = "test-loop", _ body: @Sendable (RunLoop) async throws -> Result
) async rethrows -> Result {
    let thread = PermanentThread(name: name)
    let loop = thread.loop
    do {
        let result = try await withTaskExecutorPreference(loop) { try await body(loop) }
        await stop(thread)
        return result
    } catch {
        await stop(thread)
        throw error
    }
}

/// Stops `thread` and waits for it to exit: a join of a thread whose loop only has to return
/// from its run (microseconds), so the pool thread that waits is not held.
private func stop(_ thread: PermanentThread) async {
    thread.stop()
}

/// The slices of the main loop's run (see ``withMainLoopRunning(_:)``).
final class MainLoopPump: Sendable {
    private let running = Atomic<Bool>(false)

    /// Starts the slices; false (and nothing started) if the main queue's blocks do not run on
    /// the main thread.
    func start() async -> Bool {
        let onMainThread = await withCheckedContinuation { (continuation: CheckedContinuation<Bool, Never>) in
            DispatchQueue.main.async { continuation.resume(returning: RunLoop.main.isCurrent) }
        }
        guard onMainThread else { return false }
        running.store(true, ordering: .releasing)
        DispatchQueue.main.async { self.slice() }
        return true
    }

    func stop() {
        running.store(false, ordering: .releasing)
        RunLoop.main.wakeUp()
    }

    private func slice() {
        guard running.load(ordering: .acquiring) else { return }
        _ = RunLoop.main.run(mode: .default, for: .milliseconds(5))
        DispatchQueue.main.async { self.slice() }
    }
}

/// A swift-testing trait: the test (or each test of the suite) runs while the main loop runs
/// (``withMainLoopRunning(_:)``).
///
/// <!-- snippet: prelude
/// import Testing
/// -->
/// ```swift
/// @Test(.mainLoopRunning) func theBannerHides() async throws {}
/// ```
public struct MainLoopRunningTrait: TestTrait, SuiteTrait, TestScoping {
    public var isRecursive: Bool { true }

    public func provideScope(
        for test: Test, testCase: Test.Case?, performing function: @Sendable () async throws -> Void
    ) async throws {
        try await TestScopeKind.mainLoopRunning.scope(test) {
            try await withMainLoopRunning { try await function() }
        }
    }
}

/// A swift-testing trait: the test (or each test of the suite) runs on the thread of a loop of
/// its own (``withLoopThread(name:_:)``); `RunLoop.current` in the test is that loop.
public struct LoopThreadTrait: TestTrait, SuiteTrait, TestScoping {
    public var isRecursive: Bool { true }

    public func provideScope(
        for test: Test, testCase: Test.Case?, performing function: @Sendable () async throws -> Void
    ) async throws {
        try await TestScopeKind.onLoopThread.scope(test) {
            try await withLoopThread(name: "test-loop") { _ in try await function() }
        }
    }
}

extension Trait where Self == MainLoopRunningTrait {
    /// Runs the test while the main loop runs on the main thread (see ``withMainLoopRunning(_:)``).
    public static var mainLoopRunning: Self { Self() }
}

extension Trait where Self == LoopThreadTrait {
    /// Runs the test on the thread of a loop of its own (see ``withLoopThread(name:_:)``).
    public static var onLoopThread: Self { Self() }
}
