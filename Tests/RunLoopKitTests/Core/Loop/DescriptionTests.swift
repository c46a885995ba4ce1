import Glibc
import SharedTestSupport
import Testing

@testable import RunLoopKit

/// `RunLoop.description` shows what CoreFoundation's shows (seed 002 prints it in `main.m`): the
/// wake-up port, the stopped and ignoring-wake-ups flags, each mode's port set and deadlines.
@Suite struct DescriptionTests {
    @Test func showsTheDescriptorsFlagsAndEachModesDeadlines() throws {
        let lines = try #require(
            TestThreads.runBlocking(name: "desc") { () -> [String] in
                let loop = RunLoop.current
                let timer = RunLoopTimer(after: .seconds(60)) { _ in }
                timer.tolerance = .seconds(2)
                loop.add(timer, forMode: .default)
                defer { timer.invalidate() }
                let descriptors = loop.backend.map { backend in
                    let (epoll, wakeUp, timer) = backend.descriptors
                    return "wake-up descriptor = \(wakeUp) (eventfd), epoll descriptor = \(epoll), timer descriptor = \(timer) (timerfd"
                }
                var found: [String] = []
                let idle = loop.description
                if let descriptors, idle.contains(descriptors) { found.append("descriptors") }
                if idle.contains("stopped = false, ignoring wake-ups = true,") { found.append("idle flags") }
                // Soft deadline: the fire date (60 s away); hard: 2 s of tolerance later. Printed
                // to the millisecond, so within a second of those.
                if let match = idle.firstMatch(of: /next deadline = \{ soft in ([0-9.]+)s, hard in ([0-9.]+)s \}/),
                    let soft = Double(match.1), let hard = Double(match.2), abs(soft - 60) < 1, abs(hard - 62) < 1
                {
                    found.append("deadlines")
                }
                if idle.contains("sleeps in = the loop's epoll set,") { found.append("base set") }
                // Inside a run, wake-ups are heard; a stop requested is shown until the run ends.
                let inside = TestMonitor<String>("")
                loop.perform {
                    loop.stop()
                    inside.update { $0 = loop.description }
                }
                loop.run(mode: .default, for: .seconds(10))
                let running = inside.read { $0 }
                if running.contains("stopped = true, ignoring wake-ups = false,") { found.append("running flags") }
                if running.contains("current mode = kCFRunLoopDefaultMode,") { found.append("current mode") }
                return found
            })
        #expect(lines == ["descriptors", "idle flags", "deadlines", "base set", "running flags", "current mode"])
    }
}
