import Glibc
import SharedTestSupport
import Testing

@testable import RunLoopKit

/// `RunLoop.main` serves `DispatchQueue.main` (and so `@MainActor` jobs) while it runs on the main
/// thread in a common mode, and not in other modes, as CFRunLoop does; checked against
/// CoreFoundation's main loop.
///
/// A test never has the main thread (Swift Testing runs tests on worker threads, and its runner
/// has called `dispatch_main()`, in exit-test children too), so each scenario runs in a child
/// process, `MainQueueProbe` (Tests/MainQueueProbe), whose top-level code owns its main thread:
/// once on CoreFoundation, once on RunLoopKit, in separate processes, and once with both in one
/// process. The probe's runs are bounded (5 s each) and end on the events they wait for; the
/// child has 60 s before it is killed and the test fails.
@Suite struct MainQueueTests {
    /// CoreFoundation's trace of `MainQueueProbe cf modes` (see `modes` in the probe): RunLoopKit
    /// must print the same.
    static let modesTrace = [
        "timer in Private fired",
        "run(Private, 5 s) -> finished",
        "A ran on the main thread",
        "main-actor task ran on the main thread",
        "run(default, 5 s, returnAfterSourceHandled) -> handledSource",
        "run(default, 50 ms), nothing queued -> timedOut",
        "B ran on the main thread",
        "run(Tracking, 5 s, returnAfterSourceHandled) -> handledSource",
        "C ran on the main thread",
        "  run(default, 100 ms) nested in C -> finished",
        "run(default, 5 s, returnAfterSourceHandled) -> handledSource",
        "D ran on the main thread",
        "run(default, 5 s, returnAfterSourceHandled) -> handledSource",
        "main-actor task resumed after Task.sleep",
        "asyncAfter block ran; stop()",
        "run() returned",
    ]

    /// On the main thread, work queued on `DispatchQueue.main` and a main-actor task wait through
    /// a run in a private mode and run in the first run in `.default`; a mode made common serves
    /// them too; an idle `.default` is not empty; a run nested in a main-queue block serves nothing
    /// (and, its mode otherwise empty, finishes at once); `run()` keeps running on main-queue work
    /// alone (a main actor's `Task.sleep`, `asyncAfter`) until stopped. CoreFoundation first, then
    /// RunLoopKit, each in its own process: same trace.
    @Test func mainQueueIsServedInCommonModesOnlyAsInCoreFoundation() throws {
        try expectSameAsCoreFoundation("modes", Self.modesTrace)
    }

    /// Runs `scenario` of the probe on CoreFoundation (its trace must be `cfTrace`) and on
    /// RunLoopKit (its trace must be CoreFoundation's), each in its own process.
    private func expectSameAsCoreFoundation(
        _ scenario: String, _ cfTrace: [String], sourceLocation: SourceLocation = #_sourceLocation
    ) throws {
        let cf = try #require(runMainQueueProbe("cf", scenario), sourceLocation: sourceLocation)
        let rlk = try #require(runMainQueueProbe("rlk", scenario), sourceLocation: sourceLocation)
        #expect(cf.lines == cfTrace, "CoreFoundation's trace changed:\n\(cf.report)", sourceLocation: sourceLocation)
        #expect(
            rlk.lines == cf.lines, "RunLoopKit differs from CoreFoundation:\n\(rlk.report)\nCF:\n\(cf.report)",
            sourceLocation: sourceLocation)
    }

    /// CoreFoundation's trace of `MainQueueProbe cf activities`: the main queue's port checked
    /// before a pass announces a sleep (see `activities` in the probe).
    static let activitiesTrace = [
        "run(default, 5 s, returnAfterSourceHandled)",
        "  observer: entry",
        "  observer: beforeTimers",
        "  observer: beforeSources",
        "  observer: beforeWaiting",
        "  observer: afterWaiting",
        "  timer fired; queues A",
        "  observer: beforeTimers",
        "  observer: beforeSources",
        "  A ran on the main thread",
        "  observer: exit",
        "-> handledSource",
        "run(default, 5 s, returnAfterSourceHandled)",
        "  observer: entry",
        "  observer: beforeTimers",
        "  observer: beforeSources",
        "  observer: beforeWaiting",
        "  observer: afterWaiting",
        "  B ran on the main thread",
        "  observer: exit",
        "-> handledSource",
        "run(default, 300 ms)",
        "  observer: entry",
        "  observer: beforeTimers",
        "  observer: beforeSources",
        "  observer: beforeWaiting",
        "  observer: afterWaiting",
        "  timer fired; queues C",
        "  observer: beforeTimers",
        "  observer: beforeSources",
        "  C ran on the main thread",
        "  observer: beforeTimers",
        "  observer: beforeSources",
        "  observer: beforeWaiting",
        "  observer: afterWaiting",
        "  D ran on the main thread",
        "  observer: beforeTimers",
        "  observer: beforeSources",
        "  observer: beforeWaiting",
        "  observer: afterWaiting",
        "  observer: exit",
        "-> timedOut",
        "run(default, 200 ms)",
        "  observer: entry",
        "  observer: beforeTimers",
        "  observer: beforeSources",
        "  observer: beforeWaiting",
        "  observer: afterWaiting",
        "  timer fired; queues E",
        "  observer: beforeTimers",
        "  observer: beforeSources",
        "  E (wakeUp()) ran on the main thread",
        "  observer: beforeTimers",
        "  observer: beforeSources",
        "  observer: beforeWaiting",
        "  observer: afterWaiting",
        "  observer: exit",
        "-> timedOut",
    ]

    /// Work queued on the main queue during a pass is served at the next pass without a sleep
    /// that observers would see (no beforeWaiting/afterWaiting), unless the main queue was served
    /// in the pass before; a run's first pass does not check; a wakeUp() from a block served so is
    /// ignored, as after a wait. As `__CFRunLoopRun` does before
    /// `kCFRunLoopBeforeWaiting` (`didDispatchPortLastTime`), which activity-based lag monitors
    /// see. CoreFoundation first, then RunLoopKit, each in its own process: same trace.
    @Test func theMainQueuesPortIsCheckedBeforeSleepingAsInCoreFoundation() throws {
        try expectSameAsCoreFoundation("activities", Self.activitiesTrace)
    }

    /// CoreFoundation's trace of `MainQueueProbe cf polling`: a pass that polls (its version-0
    /// source was handled) checks the main queue's port too, and serves it alone.
    static let pollingTrace = [
        "run(default, 200 ms)",
        "  observer: entry",
        "  observer: beforeTimers",
        "  observer: beforeSources",
        "  source performed (1)",
        "  observer: beforeTimers",
        "  observer: beforeSources",
        "  source performed (2)",
        "  A ran on the main thread",
        "  observer: beforeTimers",
        "  observer: beforeSources",
        "  observer: beforeWaiting",
        "  observer: afterWaiting",
        "  timer fired",
        "  observer: beforeTimers",
        "  observer: beforeSources",
        "  observer: beforeWaiting",
        "  observer: afterWaiting",
        "  observer: exit",
        "-> timedOut",
    ]

    /// A pass that polls instead of sleeping asks the kernel once (for the main queue's port and
    /// the mode's descriptors together, where it used to ask about the port first): the main
    /// queue's work queued during the pass is still served by the pass alone, and the timer that
    /// came due meanwhile fires the pass after, as in CoreFoundation. CoreFoundation first, then
    /// RunLoopKit, each in its own process: same trace.
    @Test func aPassThatPollsServesTheMainQueueAloneAsInCoreFoundation() throws {
        try expectSameAsCoreFoundation("polling", Self.pollingTrace)
    }

    /// The same on RunLoopKit with a descriptor made readable in that pass: the pass that serves
    /// the main queue drops the descriptor's event, and the next pass's wait reports it again.
    @Test func aDescriptorReadyInAPassThatServesTheMainQueueIsHandledThePassAfter() throws {
        let outcome = try #require(runMainQueueProbe("rlk", "polling-pipe"))
        var expected = Self.pollingTrace
        expected.insert("  pipe readable", at: try #require(expected.firstIndex(of: "  timer fired")) + 1)
        #expect(outcome.lines == expected, "\(outcome.report)")
    }

    /// Both loops in one process: CoreFoundation's main loop run inside a RunLoopKit timer, and
    /// RunLoopKit's inside a CoreFoundation timer. Whichever runs serves the main queue; every
    /// block runs once, on the main thread, and each run returns after serving it.
    @Test func coreFoundationAndRunLoopKitServeTheMainQueueInOneProcess() throws {
        let both = try #require(runMainQueueProbe("rlk", "coexist"))
        #expect(
            both.lines == [
                "RunLoop.main serves the main queue: true",
                "X ran on the main thread",
                "  CF run(default) nested in a RunLoopKit timer -> handledSource",
                "Y ran on the main thread",
                "RunLoopKit run(default) -> handledSource",
                "Z ran on the main thread",
                "  RunLoopKit run(default) nested in a CF timer -> handledSource",
                "W ran on the main thread",
                "CF run(default) -> handledSource",
            ], "\(both.report)")
    }

    /// Only the main loop serves the main queue, not while it runs the queue's blocks; the main
    /// queue's source does not show in the main loop's description.
    @Test func onlyTheMainLoopServesTheMainQueue() throws {
        let identity = try #require(runMainQueueProbe("rlk", "identity"))
        #expect(
            identity.lines == [
                "RunLoop.main serves the main queue: true",
                "RunLoop.current is RunLoop.main on the main thread: true",
                "a thread's loop serves the main queue: false",
                "inside a main-queue block, RunLoop.main serves the main queue: false",
                "run(default, 5 s, returnAfterSourceHandled) -> handledSource",
                "after it, RunLoop.main serves the main queue: true",
                "description mentions a descriptor source: false",
            ], "\(identity.report)")
    }

    /// In this process a thread's loop does not serve the main queue, and an empty default mode
    /// still finishes at once there.
    @Test func aThreadsLoopDoesNotServeTheMainQueue() {
        let outcome = TestMonitor<(Bool, RunLoop.RunResult)?>(nil)
        let thread = TestThread(name: "mq-worker") {
            let loop = RunLoop.current
            let serves = loop.servesMainDispatchQueue
            let result = loop.run(mode: .default, for: .seconds(5))
            outcome.update { $0 = (serves, result) }
        }
        #expect(thread.join(timeout: .seconds(30)))
        let result = outcome.update { $0 }
        #expect(result?.0 == false)
        #expect(result?.1 == .finished)
    }
}

// MARK: - Running the probe

/// What a probe run printed.
struct MainQueueProbeOutcome {
    /// The trace lines, without the final "done".
    let lines: [String]
    /// Everything, for failure messages.
    let report: String
}

/// Runs `MainQueueProbe <arguments>` (built next to the test binary by `swift build --build-tests`
/// and `swift test`), waits at most `timeout`, and returns its trace. Records an issue and returns
/// nil when the probe is missing, times out, fails, prints anything on standard error (a sanitizer
/// report, say), or does not finish its trace.
///
/// See `runTestExecutable` (Support/ChildProcess.swift); the child inherits the environment,
/// sanitizer options included, so a leak it reports fails the test.
func runMainQueueProbe(
    _ arguments: String..., timeout: Duration = .seconds(60), sourceLocation: SourceLocation = #_sourceLocation
) -> MainQueueProbeOutcome? {
    guard
        let child = runTestExecutable(
            "MainQueueProbe", arguments, timeout: timeout, crashQuietly: false, sourceLocation: sourceLocation)
    else { return nil }
    let report = "\(child.command): stdout:\n\(child.stdout)stderr:\n\(child.stderr)"
    guard child.ending != .timedOut else {
        Issue.record("\(child.command) did not exit within \(timeout)\n\(report)", sourceLocation: sourceLocation)
        return nil
    }
    var lines = child.stdout.split(separator: "\n", omittingEmptySubsequences: false).map(String.init)
    if lines.last == "" { lines.removeLast() }
    guard child.ending == .exited(0), child.stderr.isEmpty, lines.last == "done" else {
        Issue.record("\(child.command) failed (\(child.ending))\n\(report)", sourceLocation: sourceLocation)
        return nil
    }
    lines.removeLast()
    return MainQueueProbeOutcome(lines: lines, report: report)
}
