import DequeModule
import Dispatch
import Glibc
import RunLoopKit
import Synchronization
import Testing

import class RunLoopKit.RunLoop

/// Runs the async `body` with a fresh ``VirtualTimeLoop`` on a thread of its own, on virtual
/// time: async code is tested as it is written — the tasks it starts with `Task {}` and their
/// sleeps on the virtual clock run on the virtual loop, inside the test's `advance(by:)`.
///
/// <!-- snippet: prelude
/// import Testing
/// import Synchronization
/// final class Search: Sendable {
///     let clock: any Clock<Duration>
///     let results = Mutex<[String]>([])
///     init(clock: any Clock<Duration>) { self.clock = clock }
///     func type(_ text: String) {
///         Task {
///             try await self.clock.sleep(for: .milliseconds(300))
///             self.results.withLock { $0.append(text) }
///         }
///     }
/// }
/// -->
/// ```swift
/// try await withVirtualTime { time in
///     let search = Search(clock: time.clock)   // any Clock<Duration>; a Task inside sleeps on it
///     search.type("r")
///     try await time.advance(by: .milliseconds(299))
///     #expect(search.results.withLock { $0 }.isEmpty)
///     try await time.advance(by: .milliseconds(1))
///     #expect(search.results.withLock { $0 } == ["r"])
/// }
/// ```
///
/// **Where things run.** `body` and the nonisolated async code it calls run on the scope's thread
/// (a task executor of the scope is the body's preference), outside the loop's runs, so it can
/// drive the loop: ``VirtualTimeLoop/advance(by:in:maxPasses:)-9wgxh`` and
/// ``VirtualTimeLoop/runUntilIdle(in:maxPasses:)-7obqd`` (or their `async` forms). A job that code on
/// the scope's thread hands the global executor — a task `body` starts with `Task {}` or
/// `Task.detached {}`, a continuation resumed by one of the loop's callouts — runs on the virtual
/// loop instead, in its common modes, the next time the loop runs: inside `advance(by:)`, and,
/// while `body` is suspended, at the current instant (virtual time never moves by itself). So a
/// debouncer that sleeps on the clock it is given (``VirtualTimeLoop/clock``) is tested unchanged.
///
/// **What stays outside.** A plain `Task.sleep` sleeps in real time (Swift 6.3.1 schedules it
/// through the platform's executor, which no hook reaches; give the code a clock). Work of an
/// actor (the main actor included) runs on that actor's executor, and jobs that other threads
/// enqueue run on the global pool. See the RunLoopTesting article "Testing async code on virtual
/// time".
///
/// - Throws: ``VirtualTimeMisuse`` before `body` runs when called from code isolated to an actor
///   (the body must run on the scope's thread, and an actor's code runs on its executor); what
///   `body` throws; else a ``VirtualTimeError`` the loop reported while it ran what was due as
///   `body` waited (a livelock, for example).
@_disfavoredOverload  // a closure with no `await` keeps choosing the synchronous scope
public func withVirtualTime<Result>(
    isolation: isolated (any Actor)? = #isolation,
    _ body: (VirtualTimeLoop) async throws -> Result
) async throws -> Result {
    if let isolation {
        throw VirtualTimeMisuse(
            "withVirtualTime { time async in … }: called from code isolated to \(isolation); its body must run on the virtual loop's thread, which an actor's code cannot: call it from a nonisolated function (a test function without @MainActor)"
        )
    }
    let driver = VirtualTimeDriver()
    let time = driver.start()
    let result: Result
    do {
        result = try await withTaskExecutorPreference(driver) { try await body(time) }
    } catch {
        _ = await driver.finish()
        throw error
    }
    if let error = await driver.finish() { throw error }
    return result
}

extension VirtualTimeLoop {
    /// The clock of the virtual loop (`runLoop.clock`): give it to the code under test as its
    /// `any Clock<Duration>`; its sleeps are the loop's timers, due on virtual time.
    public var clock: RunLoopClock { runLoop.clock }

    /// ``advance(by:in:maxPasses:)-9wgxh`` from the async body of ``withVirtualTime(isolation:_:)``.
    public func advance(
        by duration: Duration, in mode: RunLoop.Mode = .default, maxPasses: Int = 1_000_000
    ) async throws(VirtualTimeError) {
        // A synchronous context picks the synchronous overload (this one would call itself).
        func drive() throws(VirtualTimeError) { try advance(by: duration, in: mode, maxPasses: maxPasses) }
        try drive()
    }

    /// ``advance(to:in:maxPasses:)`` from the async body of ``withVirtualTime(isolation:_:)``.
    public func advance(
        to target: ContinuousClock.Instant, in mode: RunLoop.Mode = .default, maxPasses: Int = 1_000_000
    ) async throws(VirtualTimeError) {
        func drive() throws(VirtualTimeError) { try advance(to: target, in: mode, maxPasses: maxPasses) }
        try drive()
    }

    /// ``runUntilIdle(in:maxPasses:)-7obqd`` from the async body of ``withVirtualTime(isolation:_:)``.
    public func runUntilIdle(in mode: RunLoop.Mode = .default, maxPasses: Int = 10_000) async throws(VirtualTimeError) {
        func drive() throws(VirtualTimeError) { try runUntilIdle(in: mode, maxPasses: maxPasses) }
        try drive()
    }
}

/// The thread of an async virtual-time scope, and the task executor its body prefers: the
/// thread runs the body's jobs one at a time, outside the loop's runs (so the body can drive the
/// loop), and, while the body waits, what is due on the virtual loop at the current instant.
final class VirtualTimeDriver: TaskExecutor, @unchecked Sendable {
    // `@unchecked Sendable` is safe: `state` is behind its mutex; `wake` is a semaphore (thread
    // safe); `time` is written once by the scope's thread before `ready` is signalled and read by
    // others only after waiting on `ready`, and by the scope's thread itself.
    private struct State {
        var jobs = Deque<UnownedJob>()
        var closing = false
        var finished: CheckedContinuation<VirtualTimeError?, Never>?
        var exited = false
        var error: VirtualTimeError?
    }

    private let state = Mutex(State())
    private let wake = DispatchSemaphore(value: 0)
    private let ready = DispatchSemaphore(value: 0)
    private var time: VirtualTimeLoop?

    /// How long the thread sleeps between looks at the loop while the body waits for something
    /// else than its own jobs (work another thread hands the virtual loop wakes no semaphore).
    static let idleLook = DispatchTimeInterval.milliseconds(10)
    /// Real time the body may wait with nothing due before the scope says why it is stuck.
    static let stuckAfter = Duration.seconds(5)

    /// Starts the scope's thread; returns its virtual-time loop once made.
    func start() -> VirtualTimeLoop {
        let box = Unmanaged.passRetained(self).toOpaque()
        var thread = pthread_t()
        let created = pthread_create(&thread, nil, { raw in
            let driver = Unmanaged<VirtualTimeDriver>.fromOpaque(raw!).takeRetainedValue()
            driver.serve()
            return nil
        }, box)
        guard created == 0 else {
            fatalError("withVirtualTime: cannot start the scope's thread (pthread_create: \(created))")
        }
        pthread_detach(thread)
        ready.wait()
        return time!
    }

    func enqueue(_ job: consuming ExecutorJob) {
        let job = UnownedJob(job)
        state.locked { $0.jobs.append(job) }
        wake.signal()
    }

    /// Ends the scope once the body returned: the thread leaves it (the loop torn down) and exits.
    /// Returns an error the loop reported while the body waited, if any.
    func finish() async -> VirtualTimeError? {
        await withCheckedContinuation { (continuation: CheckedContinuation<VirtualTimeError?, Never>) in
            let error = state.locked { state -> VirtualTimeError?? in
                state.closing = true
                guard state.exited else {
                    state.finished = continuation
                    return nil
                }
                return .some(state.error)
            }
            wake.signal()
            if let error { continuation.resume(returning: error) }
        }
    }

    /// The scope's thread: runs the body's jobs, and what is due on the loop while it waits.
    private func serve() {
        withVirtualTime { time in
            self.time = time
            ready.signal()
            var idleSince: ContinuousClock.Instant?
            var warned = false
            while true {
                let (job, closing) = state.locked { state in (state.jobs.popFirst(), state.closing) }
                if let job {
                    job.runSynchronously(on: asUnownedTaskExecutor())
                    idleSince = nil
                    continue
                }
                if closing { break }
                if time.runLoop.hasWorkOnVirtualTime(inMode: .default) {
                    do throws(VirtualTimeError) { try time.runUntilIdle() } catch {
                        state.locked { state in if state.error == nil { state.error = error } }
                    }
                    idleSince = nil
                    continue
                }
                let since = idleSince ?? .now
                idleSince = since
                if !warned, ContinuousClock.now - since > Self.stuckAfter {
                    warned = true
                    print(
                        "RunLoopTesting: withVirtualTime's body has waited \(Self.stuckAfter) of real time with nothing due on the virtual loop now; virtual time moves only with advance(by:): a task sleeping on the virtual clock waits for it"
                    )
                }
                _ = wake.wait(timeout: .now() + Self.idleLook)
            }
        }
        let finished = state.locked { state -> (CheckedContinuation<VirtualTimeError?, Never>, VirtualTimeError?)? in
            state.exited = true
            defer { state.finished = nil }
            return state.finished.map { ($0, state.error) }
        }
        if let (continuation, error) = finished { continuation.resume(returning: error) }
    }
}

extension VirtualTimeLoop {
    /// The scope of the test that runs with the ``VirtualTimeTrait`` (`@Test(.virtualTime)`), or of
    /// the innermost async ``withVirtualTime(isolation:_:)`` around the caller; nil elsewhere.
    @TaskLocal public static var current: VirtualTimeLoop?
}

/// A swift-testing trait: the test (or each test of the suite) runs in an async virtual-time scope
/// (``withVirtualTime(isolation:_:)``), which ``VirtualTimeLoop/current`` names inside it.
///
/// <!-- snippet: prelude
/// import Testing
/// -->
/// ```swift
/// @Test(.virtualTime) func retriesBackOff() async throws {
///     let time = try #require(VirtualTimeLoop.current)
///     try await time.advance(by: .seconds(1))
/// }
/// ```
///
/// The test function must be nonisolated (no `@MainActor`): it runs on the scope's thread. It
/// cannot be combined with ``MainLoopRunningTrait`` or ``LoopThreadTrait``, which run the test
/// elsewhere: the test fails with ``VirtualTimeMisuse`` naming both.
public struct VirtualTimeTrait: TestTrait, SuiteTrait, TestScoping {
    public var isRecursive: Bool { true }

    public func provideScope(
        for test: Test, testCase: Test.Case?, performing function: @Sendable () async throws -> Void
    ) async throws {
        try await TestScopeKind.virtualTime.scope(test) {
            try await withVirtualTime { time in
                try await VirtualTimeLoop.$current.withValue(time) { try await function() }
            }
        }
    }
}

extension Trait where Self == VirtualTimeTrait {
    /// Runs the test in an async virtual-time scope (see ``VirtualTimeTrait``).
    public static var virtualTime: Self { Self() }
}

/// Which of RunLoopTesting's scoping traits runs the current test: two that place the test on
/// different threads cannot both hold.
enum TestScopeKind: String, Sendable {
    case virtualTime = ".virtualTime"
    case mainLoopRunning = ".mainLoopRunning"
    case onLoopThread = ".onLoopThread"

    @TaskLocal static var current: TestScopeKind?

    /// Runs `body` as the scope of this trait for `test`; throws if another of these traits
    /// already scopes it.
    func scope(_ test: Test, _ body: () async throws -> Void) async throws {
        try enter(test: test.name)
        try await Self.$current.withValue(self) { try await body() }
    }

    private func enter(test: String) throws(VirtualTimeMisuse) {
        let kind = self
        guard let other = Self.current, other != kind else { return }
        throw VirtualTimeMisuse(
            "RunLoopTesting: test '\(test)' has both \(other.rawValue) and \(kind.rawValue); they run the test on different threads (the main loop's, a loop thread's, a virtual-time scope's). Keep one; for virtual time with a loop, use the scope's own loop (VirtualTimeLoop.current?.runLoop)"
        )
    }
}

/// A virtual-time scope used where it cannot work: called from code isolated to an actor, or
/// combined with another trait that runs the test on another thread. The description says what to
/// do instead.
public struct VirtualTimeMisuse: Error, CustomStringConvertible {
    /// What was wrong, and what to do.
    public let description: String
    init(_ description: String) { self.description = description }
}
