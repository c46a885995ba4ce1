import SharedTestSupport
import Testing

@testable import RunLoopKit

/// Findings 5 and 6: a process out of descriptors. Each scenario lowers `RLIMIT_NOFILE` and opens
/// `/dev/null` until no descriptor is left, so it runs in `HostileProbe`.
///
/// Serialized: the scenarios measure rates over real-time windows (300 ms) and start 40 threads;
/// run one at a time they do not compete with each other for the machine's cores.
@Suite(.serialized) struct HostileDescriptorExhaustionTests {
    /// A thread whose loop is made while the process has no descriptor free still gets a working
    /// loop that waits without descriptors: its 20 ms repeating timer fires (300 ms measured: about
    /// 15 fires, at least 5 asked) and its 20 blocks run while descriptors are still exhausted; the
    /// keep-alive pattern `while !stopped { run(mode:before: .distantFuture) }` does not spin (under
    /// 100 returns in 300 ms; none are expected, since only the final stop ends a run); another
    /// thread's `perform(inModes:waitUntilDone: true)` returns (within 3 s); and once descriptors
    /// are free, a descriptor source added to the loop is watched (its handler runs within 3 s).
    @Test func aLoopMadeWithoutFreeDescriptorsStillRunsTimersAndBlocksWithoutSpinning() throws {
        let probe = try #require(runHostileProbe("exhausted-loop"))
        try #require(probe.completed, "\(probe.report)")
        #expect(probe.bool("descriptors exhausted") == true, "the scenario did exhaust descriptors: \(probe.report)")
        let returns = probe.int("run returns in 300 ms") ?? Int.max
        #expect(returns < 100, "the keep-alive pattern's runs returned \(returns) times in 300 ms: \(probe.report)")
        let fires = probe.int("timer fires in 300 ms") ?? -1
        #expect(fires >= 5, "a 20 ms timer fired \(fires) times in 300 ms: \(probe.report)")
        #expect(probe.int("blocks run") == 20, "\(probe.report)")
        #expect(probe.bool("still exhausted") == true, "\(probe.report)")
        #expect(probe.bool("perform waitUntilDone returned") == true, "\(probe.report)")
        #expect(probe.bool("perform waitUntilDone block ran") == true, "\(probe.report)")
        #expect(probe.bool("descriptor source handled after release") == true, "\(probe.report)")
        #expect(probe.bool("loop thread finished") == true, "\(probe.report)")
    }

    /// 40 threads make their loops while no descriptor is free and descriptors stay exhausted:
    /// every thread's 20 ms timer fires its 3 times and all 400 blocks (5 from each thread, 5 from
    /// the main thread to each loop) run, within 6 s (about 60 ms of work, room for a loaded
    /// machine).
    @Test func fortyLoopsMadeWithoutFreeDescriptorsDeliverEveryTimerAndBlock() throws {
        let probe = try #require(runHostileProbe("exhausted-40"))
        try #require(probe.completed, "\(probe.report)")
        #expect(probe.bool("descriptors exhausted") == true, "\(probe.report)")
        #expect(probe.int("threads with a loop") == 40, "\(probe.report)")
        #expect(probe.bool("all delivered within 6 s") == true, "\(probe.report)")
        #expect(probe.int("timers that fired 3 times") == 40, "\(probe.report)")
        #expect(probe.int("blocks run") == 400, "\(probe.report)")
        #expect(probe.bool("threads finished") == true, "\(probe.report)")
    }

    /// A descriptor source added while its mode's epoll set cannot be made (no descriptor free) is
    /// watched once descriptors are free again: data written then reaches its handler within 2 s.
    @Test func aDescriptorSourceAddedWhileOutOfDescriptorsIsWatchedOnceTheyAreFree() throws {
        let probe = try #require(runHostileProbe("exhausted-fd-source"))
        try #require(probe.completed, "\(probe.report)")
        #expect(probe.bool("descriptors exhausted") == true, "\(probe.report)")
        #expect(probe.bool("handled after release") == true, "the handler never ran: \(probe.report)")
        if let after = probe.double("handled after ms") {
            #expect(after < 2000, "handled \(after) ms after the data was written: \(probe.report)")
        }
        #expect(probe.bool("loop thread finished") == true, "\(probe.report)")
    }

    /// A loop made out of descriptors, inside one long run: a timer added from another thread
    /// while it sleeps on its futex fires on time (within 100 ms of its 5 ms, where the futex's
    /// retry period would make it up to 100 ms late), and once descriptors are freed the loop
    /// sleeps in epoll instead of spinning (a 20 ms timer: about 15 passes in 300 ms; at most 40
    /// allowed, where a spin makes thousands).
    @Test func aLoopWithoutDescriptorsInALongRunServesNewTimersAndDoesNotSpinOnceTheyAreFree() throws {
        let probe = try #require(runHostileProbe("exhausted-long-run", timeout: .seconds(30)))
        try #require(probe.completed, "\(probe.report)")
        #expect(probe.bool("timer fired") == true, "\(probe.report)")
        let late = probe.double("timer fired after ms") ?? .infinity
        #expect(late < 60, "the 5 ms timer fired after \(late) ms: \(probe.report)")
        let passes = probe.int("passes in 300 ms") ?? .max
        #expect(passes <= 40, "\(passes) passes in 300 ms: \(probe.report)")
        #expect(probe.bool("loop thread finished") == true, "\(probe.report)")
    }
}
