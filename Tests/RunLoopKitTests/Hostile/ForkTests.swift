import SharedTestSupport
import Testing

@testable import RunLoopKit

/// Finding 10: fork(). In `HostileProbe`, whose main thread forks.
@Suite(.serialized) struct HostileForkTests {
    /// In the child, `RunLoop.current` is a new loop, not the parent's object; the child's 50 ms
    /// repeating timer fires about 30 times in a 1.5 s run (25...31: a loaded machine may start a
    /// little late or miss the last point; a loop sharing the parent's kernel objects loses fires
    /// or sleeps through them) and the run returns after 1.5 s ± 0.5 s; meanwhile the parent's own
    /// 50 ms timer on its own loop fires about 30 times too.
    @Test func afterForkTheChildGetsANewLoopAndBothProcessesKeepTheirTimers() throws {
        let probe = try #require(runHostileProbe("fork"))
        try #require(probe.completed, "\(probe.report)")
        #expect(probe.bool("child: current is the pre-fork loop") == false, "\(probe.report)")
        let childFires = probe.int("child: timer fires") ?? -1
        #expect((25...31).contains(childFires), "the child's timer fired \(childFires) times: \(probe.report)")
        let childElapsed = probe.double("child: run returned after ms") ?? -1
        #expect(
            childElapsed >= 1000 && childElapsed <= 2000, "the child's run took \(childElapsed) ms: \(probe.report)")
        let parentFires = probe.int("parent: timer fires") ?? -1
        #expect((25...31).contains(parentFires), "the parent's timer fired \(parentFires) times: \(probe.report)")
        let parentElapsed = probe.double("parent: run returned after ms") ?? -1
        #expect(
            parentElapsed >= 1000 && parentElapsed <= 2000, "the parent's run took \(parentElapsed) ms: \(probe.report)"
        )
        #expect(probe.value("parent: child status") == "exited 0", "\(probe.report)")
    }

    /// A loop object made before fork() and used in the child stops the child with a message
    /// that names fork (the loop's kernel objects are shared with the parent: running it would
    /// steal the parent's wakeups).
    @Test func usingAPreForkLoopInTheChildStopsItWithAMessageNamingFork() throws {
        let probe = try #require(runHostileProbe("fork-stale"))
        try #require(probe.completed, "the parent side of the probe finishes: \(probe.report)")
        let status = probe.value("parent: child status") ?? ""
        #expect(status.hasPrefix("signalled"), "the child was not stopped: \(status): \(probe.report)")
        #expect(probe.value("child: pre-fork loop's run returned") == nil, "\(probe.report)")
        #expect(probe.stderr.contains("fork"), "no message naming fork on stderr: \(probe.report)")
    }
}
