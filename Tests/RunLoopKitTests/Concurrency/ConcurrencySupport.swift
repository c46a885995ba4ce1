import CRunLoopKit
import RunLoopKit
import SharedTestSupport
import Synchronization
import Testing

// Helpers for the Swift-concurrency tests: a hosted loop whose mode the test chooses,
// an actor pinned to a loop, and a bounded await.

/// The mode a hosted loop runs in, chosen by the test: a ``TestThread/hostingLoop(name:stackSize:sourceLocation:setup:run:)``
/// whose thread runs, over and over, in the mode the test asks for, until ``finish(timeout:)``.
/// A never-signalled source in the common modes and in every private mode keeps each run alive;
/// a probe source in every private mode lets a test count passes there.
final class ModalLoop: Sendable {
    /// The thread hosting the loop.
    let thread: TestThread
    var loop: RunLoop { thread.loop }
    /// The mode the thread runs in next; nil makes it return.
    private let wanted: TestMonitor<RunLoop.Mode?>
    /// Bumped by the probe source, which is in every private mode.
    private let probePasses: TestMonitor<Int>
    private let probe: RunLoopSource

    private init(
        thread: TestThread, wanted: TestMonitor<RunLoop.Mode?>, probePasses: TestMonitor<Int>, probe: RunLoopSource
    ) {
        self.thread = thread
        self.wanted = wanted
        self.probePasses = probePasses
        self.probe = probe
    }

    /// Starts the thread, makes `commonModes` common, and waits (bounded) until the loop exists;
    /// nil, with an issue recorded, if it does not.
    static func start(
        name: String,
        mode: RunLoop.Mode = .default,
        commonModes: [RunLoop.Mode] = [],
        privateModes: [RunLoop.Mode] = [],
        sourceLocation: SourceLocation = #_sourceLocation
    ) -> ModalLoop? {
        let wanted = TestMonitor<RunLoop.Mode?>(mode)
        let probePasses = TestMonitor(0)
        let probe = RunLoopSource { probePasses.update { $0 += 1 } }
        let keepAlive = RunLoopSource {}
        guard
            let thread = TestThread.hostingLoop(
                name: name, sourceLocation: sourceLocation,
                setup: { loop in
                    for mode in commonModes { loop.addCommonMode(mode) }
                    loop.add(keepAlive, forMode: .common)
                    for mode in privateModes {
                        loop.add(keepAlive, forMode: mode)
                        loop.add(probe, forMode: mode)
                    }
                },
                run: { loop in
                    // Each run is bounded, so that a stop() that arrives between two runs (and is
                    // dropped, as in CoreFoundation) delays a mode change by at most this long.
                    while let mode = wanted.read({ $0 }) {
                        loop.run(mode: mode, for: .milliseconds(100))
                    }
                    keepAlive.invalidate()
                    probe.invalidate()
                })
        else { return nil }
        return ModalLoop(thread: thread, wanted: wanted, probePasses: probePasses, probe: probe)
    }

    /// Makes the thread run in `mode` from its next run on, and ends the current run.
    func switchMode(to mode: RunLoop.Mode) {
        wanted.update { $0 = mode }
        loop.stop()
    }

    /// Waits (bounded) until the loop has run a block in `mode`, that is, until it runs in `mode`.
    func entered(_ mode: RunLoop.Mode, timeout: Duration = concurrencyPatience) async -> Bool {
        let entered = TestEvent()
        loop.perform(inModes: [mode]) { entered.fire() }
        return await entered.waitAsync(timeout: timeout) { $0 }
    }

    /// Signals the probe source and waits (bounded) until a pass of a private mode has performed
    /// it. Every such pass runs the blocks of its mode first, so a block queued before this call
    /// and meant for the running mode would have run.
    func pulse(timeout: Duration = concurrencyPatience) async -> Bool {
        let before = probePasses.read { $0 }
        probe.signal()
        loop.wakeUp()
        return await probePasses.waitAsync(timeout: timeout) { $0 > before }
    }

    /// Ends the thread's runs and waits (bounded) until the thread has exited.
    func finish(timeout: Duration = concurrencyPatience) async -> Bool {
        wanted.update { $0 = nil }
        loop.stop()
        return await thread.joinAsync(timeout: timeout)
    }
}

/// Where a piece of code ran.
struct Placement: Sendable, Equatable {
    /// Whether it ran on the loop's thread (``RunLoop/isCurrent``).
    let onLoopThread: Bool
    /// The kernel id of the thread it ran on.
    let tid: Int32
    /// The loop's innermost running mode at the time.
    let mode: RunLoop.Mode?

    /// Here and now, for `loop`.
    static func here(_ loop: RunLoop) -> Placement {
        Placement(onLoopThread: loop.isCurrent, tid: crlk_gettid(), mode: loop.currentMode)
    }
}

/// An actor whose jobs run on a loop's thread.
actor LoopActor {
    let loop: RunLoop
    var count = 0
    var offThread = 0

    init(loop: RunLoop) { self.loop = loop }

    nonisolated var unownedExecutor: UnownedSerialExecutor { loop.asUnownedSerialExecutor() }

    /// Where this method ran; also asserts the isolation through the runtime.
    func placement() -> Placement {
        preconditionIsolated("a method of a loop-pinned actor runs isolated to it")
        return .here(loop)
    }

    /// Counts a call; returns whether it ran on the loop's thread.
    @discardableResult
    func increment() -> Bool {
        count += 1
        let onLoop = loop.isCurrent
        if !onLoop { offThread += 1 }
        return onLoop
    }

    /// Appends `entry` (with a mark if not on the loop's thread) to `trace`.
    func record(_ entry: String, into trace: TestMonitor<[String]>) {
        let onLoop = loop.isCurrent
        trace.update { $0.append(onLoop ? entry : entry + " (off the loop's thread)") }
    }

    /// Awaits a value from the same loop, from inside one of the loop's own jobs.
    func performOnOwnLoop(inModes modes: [RunLoop.Mode] = [.default]) async throws -> (Int, Placement, Placement) {
        let inBody: (Int, Placement) = try await loop.submit(inModes: modes) { [loop] in (7, Placement.here(loop)) }
        // Back on the actor: its executor is the loop, so this is the loop's thread again.
        return (inBody.0, inBody.1, .here(loop))
    }
}

/// Runs `operation` in a new task and waits for it at most `timeout`: its result, or nil (with an
/// issue recorded) if it did not finish in time — a hang becomes a failure, not a stuck test run.
func completes<T: Sendable>(
    within timeout: Duration = concurrencyPatience,
    sourceLocation: SourceLocation = #_sourceLocation,
    _ operation: @escaping @Sendable () async throws -> T
) async -> Result<T, any Error>? {
    let outcome = TestMonitor<Result<T, any Error>?>(nil)
    Task {
        let result: Result<T, any Error>
        do { result = .success(try await operation()) } catch { result = .failure(error) }
        outcome.update { $0 = result }
    }
    guard await outcome.waitAsync(timeout: timeout, until: { $0 != nil }) else {
        Issue.record("the operation did not finish within \(timeout)", sourceLocation: sourceLocation)
        return nil
    }
    return outcome.read { $0 }
}

/// An error with an identity, to check that the one thrown is the one caught.
struct Boom: Error, Equatable {
    let code: Int
}

/// How long a test waits for an async operation before calling it hung: 30 s, or 180 s under a
/// sanitizer. The operations run as tasks on the concurrency pool, which has one thread per core
/// (two here); under ThreadSanitizer the synchronous suites that run meanwhile (the differential
/// and fuzz suites block a pool thread for their whole run) can hold both threads for more than
/// 30 s, and a task then waits without anything being wrong. A deadlock still fails.
let concurrencyPatience: Duration = TestThreads.sanitized ? .seconds(180) : .seconds(30)
