import SharedTestSupport
import Testing

@testable import RunLoopKit

/// Findings 8 and 9: a source's cancel callback, called by the thread-exit teardown, uses the
/// dying loop. In `HostileProbe`: on a broken library the teardown deadlocks (the thread never
/// exits) or traps.
@Suite(.serialized) struct HostileTeardownReentryTests {
    /// `perform(inModes:waitUntilDone: true)` on the dying loop from its own teardown: the block
    /// runs inline (the caller is the loop's thread) or the call throws `.threadExited`; either
    /// way it returns, and the thread is joined (within 5 s).
    @Test func performAndWaitOnTheDyingLoopFromATeardownCallbackReturns() throws {
        let probe = try #require(runHostileProbe("teardown-perform-wait"))
        try #require(probe.completed, "\(probe.report)")
        #expect(probe.bool("thread joined") == true, "the exiting thread deadlocked in its teardown: \(probe.report)")
        let ranInline = probe.value("perform returned; block ran") == "true"
        let threw = probe.value("perform threw") == "threadExited"
        #expect(ranInline || threw, "neither ran the block inline nor threw .threadExited: \(probe.report)")
    }

    /// A `LoopBound` of the dying loop is usable from its teardown callbacks (they run on the
    /// loop's thread): no trap.
    @Test func aLoopBoundOfTheDyingLoopWorksInATeardownCallback() throws {
        let probe = try #require(runHostileProbe("teardown-loop-bound"))
        try #require(probe.completed, "the probe died or did not finish: \(probe.report)")
        #expect(probe.int("LoopBound value in onCancel") == 1, "\(probe.report)")
        #expect(probe.bool("LoopBound accessible in onCancel") == true, "\(probe.report)")
        #expect(probe.bool("thread joined") == true, "\(probe.report)")
    }

    /// `RunLoop.current` in a teardown callback is the dying loop (not a new loop made for the
    /// exiting thread), opens no descriptor, and the thread's exit leaves no descriptor behind.
    @Test func runLoopCurrentInATeardownCallbackIsTheDyingLoop() throws {
        let probe = try #require(runHostileProbe("teardown-current"))
        try #require(probe.completed, "\(probe.report)")
        #expect(probe.bool("current in onCancel is the dying loop") == true, "\(probe.report)")
        #expect(probe.bool("current.isCurrent in onCancel") == true, "\(probe.report)")
        #expect(probe.int("descriptors opened by RunLoop.current in onCancel") == 0, "\(probe.report)")
        #expect(probe.int("descriptors left after the thread exited") == 0, "\(probe.report)")
        #expect(probe.bool("thread joined") == true, "\(probe.report)")
    }

    /// A thread exits while its descriptor sources' and port's handlers hold (through a table)
    /// the items themselves: the teardown invalidates every one, and the descriptors the sources
    /// own are closed, although the cycles keep the objects alive (in a process of its own, so the
    /// descriptor count is exact).
    @Test func threadExitClosesOwnedDescriptorsThroughHandlerCycles() throws {
        let probe = try #require(runHostileProbe("thread-exit-cycle"))
        try #require(probe.completed, "\(probe.report)")
        #expect(probe.int("descriptors opened on the thread") ?? 0 >= 20, "\(probe.report)")
        #expect(probe.int("descriptors left after the thread exited") == 0, "\(probe.report)")
        #expect(probe.report.contains("items invalidated by the thread's exit: 21 of 21"), "\(probe.report)")
        #expect(probe.bool("thread joined") == true, "\(probe.report)")
    }
}
