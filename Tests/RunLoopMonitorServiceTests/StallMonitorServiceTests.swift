#if ServiceLifecycle
import Dispatch
import Glibc
import Logging
import RunLoopKit
import RunLoopMonitor
import RunLoopMonitorService
import ServiceLifecycle
import SharedTestSupport
import Testing

/// A handler that blocks its queue: the function the reports must name.
@inline(never)
func serviceTestBlockingHandler(for duration: Duration) {
    let deadline = ContinuousClock.now + duration
    while ContinuousClock.now < deadline {
        var request = timespec(tv_sec: 0, tv_nsec: 10_000_000)
        nanosleep(&request, nil)
    }
}

/// The events a monitor delivered, waited for with a bound only a failing test reaches.
final class Events: Sendable {
    private let events = TestMonitor<[StallEvent]>([])
    func append(_ event: StallEvent) { events.update { $0.append(event) } }
    var all: [StallEvent] { events.read { $0 } }
    func wait(for count: Int) async -> [StallEvent] {
        _ = await events.waitAsync(timeout: Sanitizers.any ? .seconds(180) : .seconds(20)) { $0.count >= count }
        return all
    }
}

/// Exclusive of the monitor suites (it times a monitor and captures stacks) and of the robustness
/// ones (it starts threads, which those count exactly).
@Suite(.serialized, .exclusive(.monitor), .exclusive(.robustness)) struct StallMonitorServiceTests {
    /// In a `ServiceGroup`: the service's monitor reports a stall while the group runs; graceful
    /// shutdown during a second stall ends that stall's report (cut short) before `run()` returns,
    /// and the group's run returns with no error.
    @Test func runsInAServiceGroupAndStopsAtGracefulShutdown() async throws {
        let queue = DispatchQueue(label: "service-test")
        let events = Events()
        let monitor = StallMonitor(
            loops: [], threshold: .milliseconds(100), sampleInterval: .milliseconds(20), backoff: .none, logger: nil)
        let source = monitor.watch(queue, name: "service-test", heartbeat: .milliseconds(20))
        let service = StallMonitorService(monitor: monitor) { events.append($0) }
        let group = ServiceGroup(
            configuration: .init(services: [service], logger: Logger(label: "StallMonitorServiceTests")))
        let running = Task { try await group.run() }
        // The service has started the monitor once the queue answered a heartbeat (the group
        // starts its services asynchronously: a stall queued before would end unwatched).
        let deadline = ContinuousClock.now + (Sanitizers.any ? .seconds(180) : .seconds(20))
        while source.stallSnapshot().threadID == 0, ContinuousClock.now < deadline { try await Task.sleep(for: .milliseconds(5)) }

        // The first stall, reported whole while the group runs.
        queue.async { serviceTestBlockingHandler(for: .milliseconds(400)) }
        let first = await events.wait(for: 2)
        #expect(first.count == 2)
        guard case .began(let began)? = first.first, case .ended(let ended)? = first.last else {
            Issue.record("expected began and ended, got \(first)")
            return
        }
        #expect(began.loop == "service-test")
        #expect(ended.duration >= .milliseconds(300))
        // (No stuckIn: a heartbeat on a DispatchQueue does not know the queue's thread, so the
        // report has no stack; naming is RunLoopMonitor's concern, tested there.)

        // A second stall, under way when the group shuts down: its ended report comes before
        // run() returns, cut short (the stall lasts 3 s).
        queue.async { serviceTestBlockingHandler(for: .seconds(3)) }
        let during = await events.wait(for: 3)
        #expect(during.count == 3)
        let shutdownAt = ContinuousClock.now
        await group.triggerGracefulShutdown()
        try await running.value
        let final = events.all
        #expect(final.count == 4)
        if case .ended(let cut)? = final.last {
            #expect(cut.duration < .seconds(3))
        } else {
            Issue.record("the stall under way at the shutdown did not end: \(final)")
        }
        // The monitor's threads finish what they are doing (a capture, a name lookup) and exit:
        // well under 2 s, and under a sanitizer on a loaded machine (everything 5-15× slower,
        // the other suites' threads beside it) under 15 s.
        #expect(ContinuousClock.now - shutdownAt < (Sanitizers.any ? .seconds(15) : .seconds(2)))
        // Stopped: the rest of the stall (and any later one) is never reported.
        queue.sync {}
        #expect(events.all.count == 4)
    }

    /// As a newcomer writes it from the documentation: a monitor with the defaults, the service
    /// with no handler, a group of it alone; cancelling the group's task ends the service.
    @Test func theDocumentedSetupRunsAndEndsOnCancellation() async throws {
        let monitor = StallMonitor(loops: [])
        let stalls = StallMonitorService(monitor: monitor)
        let group = ServiceGroup(services: [stalls], logger: Logger(label: "app"))
        let task = Task { try await group.run() }
        try await Task.sleep(for: .milliseconds(100))
        let cancelledAt = ContinuousClock.now
        task.cancel()
        // A group whose task is cancelled cancels its services and returns once they have.
        _ = try? await task.value
        #expect(ContinuousClock.now - cancelledAt < .seconds(5))
    }

    /// Outside a `ServiceGroup`, `run()` runs until its task is cancelled.
    @Test func runOutsideAGroupEndsOnCancellation() async throws {
        let monitor = StallMonitor(loops: [], threshold: .milliseconds(100), sampleInterval: .milliseconds(20), logger: nil)
        let service = StallMonitorService(monitor: monitor)
        let task = Task { try await service.run() }
        try await Task.sleep(for: .milliseconds(100))
        task.cancel()
        try await task.value
    }
}
#endif
