#if SwiftNIO
import Glibc
import NIOCore
import NIOPosix
import RunLoopKit
import RunLoopMonitor
import RunLoopMonitorNIO
import SharedTestSupport
import Synchronization
import Testing

/// Looks every 20 ms, stalls after 100 ms: an idle loop is looked at five times per threshold.
private let threshold = Duration.milliseconds(100)
private let interval = Duration.milliseconds(20)
/// How long an idle round waits for a stall that must not come: the threshold and three looks
/// (a false stall is reported within threshold + one look of the loop going "busy", which for a
/// loop taken for busy while it waits is its first look), and room for a late monitor thread.
private let idleWait = Duration.milliseconds(260)

/// Groups made and shut down one after another, sharing one `NIOEventLoopTicks`: a new loop often
/// lands at a freed loop's address (so on its slot), and its epoll descriptor is another number
/// whenever a descriptor was opened meanwhile (a connection accepted, a file opened).
///
/// Exclusive of the monitor suites (it times monitors) and of the robustness ones (it opens
/// descriptors and threads, which those count exactly).
@Suite(.serialized, .exclusive(.monitor), .exclusive(.robustness)) struct NIOSlotTests {
    /// One loop per round, the last round's descriptors taken by a file opened in between: an
    /// idle loop at a reused address is never taken for busy (no stall), and the slots in use
    /// never exceed the loops alive.
    @Test func loopsAtReusedAddressesAreNotStalled() throws {
        // Room for every round's loop, so that none is watched by heartbeats (a heartbeat holds
        // its loop, whose address then stays taken).
        let ticks = NIOEventLoopTicks(capacity: 16)
        let events = Events()
        let monitor = StallMonitor(loops: [], threshold: threshold, sampleInterval: interval, backoff: .none, logger: nil)
        monitor.start { events.append($0) }
        defer { monitor.stop() }
        var addresses: Set<UInt> = []
        var reused = 0
        // Descriptors held open so that each new loop's epoll descriptor differs from the last
        // loop's (the kernel gives the lowest free number).
        var held: [Int32] = []
        defer { held.forEach { close($0) } }
        for _ in 0..<13 {
            let group = MultiThreadedEventLoopGroup(numberOfThreads: 1, metricsDelegate: ticks)
            let loop = group.next()
            if !addresses.insert(UInt(bitPattern: ObjectIdentifier(loop))).inserted { reused += 1 }
            monitor.watch(group, ticks: ticks)
            try loop.submit {}.wait()
            // An absence: the round waits its bound out.
            _ = events.wait(for: 1, timeout: idleWait)
            try group.syncShutdownGracefully()
            // Forgotten by the monitor (its thread exited) before the next group is made.
            #expect(waitUntil(timeout: .seconds(60)) { monitor.watchedSources.isEmpty })
            held.append(open("/dev/null", O_RDONLY | O_CLOEXEC))
        }
        #expect(events.all.isEmpty, "\(events.all.count) false stalls in 13 rounds (\(reused) at a reused address): \(events.all.map(\.report.loop))")
    }

    /// 24 groups of one or two loops, made and shut down with up to three alive at once, sharing
    /// one delegate and one monitor: no stall on their idle loops, every loop watched through
    /// ticks (a slot given back at each loop's exit is free for the next), and the slots in use
    /// never more than the loops alive.
    @Test func twentyFourGroupsRebuilt() throws {
        let ticks = NIOEventLoopTicks(capacity: 6)
        let events = Events()
        let monitor = StallMonitor(loops: [], threshold: threshold, sampleInterval: interval, backoff: .none, logger: nil)
        monitor.start { events.append($0) }
        defer { monitor.stop() }
        var alive: [MultiThreadedEventLoopGroup] = []
        var loopsAlive: Int { alive.reduce(0) { $0 + $1.makeIterator().reduce(0) { count, _ in count + 1 } } }
        var held: [Int32] = []
        defer { held.forEach { close($0) } }
        var mostInUse = 0
        for number in 0..<24 {
            let group = MultiThreadedEventLoopGroup(numberOfThreads: 1 + number % 2, metricsDelegate: ticks)
            alive.append(group)
            let sources = monitor.watch(group, ticks: ticks)
            #expect(sources.allSatisfy { $0 is NIOEventLoopStallSource }, "group \(number)")
            for loop in group.makeIterator() { try loop.submit {}.wait() }
            mostInUse = max(mostInUse, ticks.slotsInUse)
            #expect(ticks.slotsInUse <= loopsAlive, "group \(number): \(ticks.slotsInUse) slots for \(loopsAlive) loops")
            // Every third group is shut down at once, the others stay until three are alive: so
            // groups are made beside live ones and at freed ones' addresses.
            _ = events.wait(for: 1, timeout: idleWait)  // an absence: the bound is waited out
            if number % 3 == 0 || alive.count >= 3 {
                try alive.removeFirst().syncShutdownGracefully()
                #expect(ticks.slotsInUse <= loopsAlive, "after a shutdown: \(ticks.slotsInUse) slots for \(loopsAlive) loops")
                held.append(open("/dev/null", O_RDONLY | O_CLOEXEC))
            }
        }
        for group in alive { try group.syncShutdownGracefully() }
        #expect(ticks.slotsInUse == 0)
        #expect(ticks.overflowingTicks == 0)
        #expect(events.all.isEmpty, "\(events.all.count) false stalls: \(events.all.map(\.report.loop))")
        #expect(waitUntil(timeout: .seconds(60)) { monitor.watchedSources.isEmpty })
    }

    /// More loops than slots: one warning (however many ticks overflow), the loop beyond is
    /// watched by heartbeats, and once a group is shut down its slots serve the next group.
    @Test func pastCapacityItWarnsOnceAndFreedSlotsAreReused() throws {
        _ = TestLog.recorder  // the process's log backend, before the delegate makes its logger
        let ticks = NIOEventLoopTicks(capacity: 2)
        let warning = "NIOEventLoopTicks: more than 2 event loops at once"
        let before = TestLog.messages(containing: warning).count
        let monitor = StallMonitor(loops: [], threshold: threshold, sampleInterval: interval, backoff: .none, logger: nil)
        monitor.start { _ in }
        defer { monitor.stop() }
        let three = MultiThreadedEventLoopGroup(numberOfThreads: 3, metricsDelegate: ticks)
        let sources = monitor.watch(three, ticks: ticks)
        #expect(sources.filter { $0 is NIOEventLoopStallSource }.count == 2)
        #expect(sources.filter { $0 is HeartbeatStallSource }.count == 1)
        // Many ticks of the loop without a slot.
        for _ in 0..<50 { for loop in three.makeIterator() { try loop.submit {}.wait() } }
        #expect(ticks.overflowingTicks >= 50)
        #expect(ticks.slotsInUse == 2)
        #expect(TestLog.messages(containing: warning).count == before + 1)
        let levels = TestLog.messages(containing: warning).map(\.level)
        #expect(levels.last == .warning)
        try three.syncShutdownGracefully()
        #expect(ticks.slotsInUse == 0)
        let two = MultiThreadedEventLoopGroup(numberOfThreads: 2, metricsDelegate: ticks)
        defer { try? two.syncShutdownGracefully() }
        let reused = monitor.watch(two, ticks: ticks)
        #expect(reused.allSatisfy { $0 is NIOEventLoopStallSource })
        for loop in two.makeIterator() { try loop.submit {}.wait() }
        #expect(ticks.slotsInUse == 2)
        #expect(TestLog.messages(containing: warning).count == before + 1)
    }
}

#endif
