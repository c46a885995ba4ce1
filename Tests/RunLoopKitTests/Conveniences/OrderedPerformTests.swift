import SharedTestSupport
import Synchronization
import Testing

@testable import RunLoopKit

/// NSRunLoop's ordered performers (`performSelector:target:argument:order:modes:`): run at the
/// start of the next iteration in one of their modes, lower orders first.
@Suite struct OrderedPerformTests {
    final class Target: Sendable {}

    @Test func lowerOrdersRunFirstAndEqualOrdersInTheOrderAdded() throws {
        let log = try #require(
            TestThreads.runBlocking(name: "op-order") { () -> [String] in
                let loop = RunLoop.current
                let log = Mutex<[String]>([])
                @Sendable func note(_ line: String) { log.locked { $0.append(line) } }
                loop.perform(order: 3) { note("c") }
                loop.perform(order: 1) { note("a") }
                loop.perform(order: 2) { note("b") }
                loop.perform(order: 1) { note("a2") }
                loop.run(mode: .default, for: .seconds(5), returnAfterSourceHandled: false)
                return log.locked { $0 }
            })
        // The run ends when its mode is empty (the performers' timers are spent).
        #expect(log == ["a", "a2", "b", "c"])
    }

    @Test func aPerformerWaitsForItsModeAndRunsOnce() throws {
        let log = try #require(
            TestThreads.runBlocking(name: "op-modes") { () -> [String] in
                let loop = RunLoop.current
                let log = Mutex<[String]>([])
                let other: RunLoop.Mode = "op-other"
                loop.perform(order: 0, inModes: [other]) { log.locked { $0.append("other only") } }
                loop.perform(order: 0, inModes: [.default, other]) { log.locked { $0.append("both") } }
                loop.run(mode: .default, for: .seconds(5))
                log.locked { $0.append("default run ended") }
                loop.run(mode: other, for: .seconds(5))
                return log.locked { $0 }
            })
        #expect(log == ["both", "default run ended", "other only"])
    }

    @Test func cancellingByTargetKeepsThemFromRunning() throws {
        let log = try #require(
            TestThreads.runBlocking(name: "op-cancel") { () -> [String] in
                let loop = RunLoop.current
                let log = Mutex<[String]>([])
                let target = Target()
                loop.perform(order: 0, target: target) { log.locked { $0.append("cancelled one ran") } }
                loop.perform(order: 1, target: target) { log.locked { $0.append("cancelled two ran") } }
                loop.perform(order: 2) { log.locked { $0.append("kept") } }
                let cancelled = loop.cancelOrderedPerforms(withTarget: target)
                loop.run(mode: .default, for: .seconds(5))
                return ["cancelled \(cancelled)"] + log.locked { $0 }
            })
        #expect(log == ["cancelled 2", "kept"])
    }

    /// A performer added by a performer runs in a later iteration, even with a lower order.
    @Test func oneAddedWhileTheyRunWaitsForTheNextIteration() throws {
        let log = try #require(
            TestThreads.runBlocking(name: "op-later") { () -> [String] in
                let loop = RunLoop.current
                let log = Mutex<[String]>([])
                let passes = Atomic<Int>(0)
                let observer = RunLoopObserver(activities: .beforeTimers) { _, _ in passes.add(1, ordering: .relaxed) }
                loop.add(observer, forMode: .default)
                defer { observer.invalidate() }
                loop.perform(order: 5) {
                    log.locked { $0.append("first, pass \(passes.load(ordering: .relaxed))") }
                    loop.perform(order: 0) { log.locked { $0.append("added, pass \(passes.load(ordering: .relaxed))") } }
                }
                loop.perform(order: 6) { log.locked { $0.append("second, pass \(passes.load(ordering: .relaxed))") } }
                loop.run(mode: .default, for: .seconds(5))
                return log.locked { $0 }
            })
        #expect(log == ["first, pass 1", "second, pass 1", "added, pass 2"])
    }

    /// From another thread, while the loop sleeps: its timer wakes the loop (a timer added from
    /// another thread re-arms the loop's timerfd).
    @Test func fromAnotherThreadItWakesASleepingLoop() throws {
        let ran = TestEvent()
        guard
            let thread = TestThread.hostingLoop(
                name: "op-cross", setup: { loop in loop.add(RunLoopSource {}, forMode: .default) },
                run: { loop in loop.run(mode: .default, for: .seconds(30)) })
        else { return }
        let loop = thread.loop
        #expect(waitUntil { loop.isWaiting })
        loop.perform(order: 0) {
            ran.fire()
            RunLoop.current.stop()
        }
        #expect(ran.wait(timeout: .seconds(10)))
        #expect(thread.join(timeout: .seconds(10)))
    }
}
