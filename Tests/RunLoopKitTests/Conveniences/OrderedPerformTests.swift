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

    /// Draining is linear in the performers (plus sorting their distinct orders): 4,000 pending
    /// performers take at most 15 times the time of 400, and run in order. Linear work is 10
    /// times, an n log n drain (sorting them all) about 14, and a drain that scans every pending
    /// performer for each next one over 100 (measured on this 2-core machine: 63 ms for 400,
    /// 9.9 s for 4,000). This one measures 7-8 times here (0.6-1.1 ms and 4.7-8.0 ms).
    ///
    /// The time is the loop thread's CPU time (time the thread was preempted is not counted), the
    /// best of three drains of each size, so a loaded machine stretches neither much; the 400's
    /// fixed costs (a pass of the loop, the timer) only lower the ratio. A bound for builds
    /// without a sanitizer, whose instrumentation does not scale evenly.
    @Test(.disabled(if: TestThreads.sanitized, "a time bound for builds without a sanitizer"))
    func fourThousandPendingPerformersDrainInAtMostFifteenTimesTheTimeOfFourHundred() throws {
        let outcome = try #require(
            TestThreads.runBlocking(name: "op-scaling", timeout: .seconds(120)) { () -> (Double, Double, [Int]) in
                let loop = RunLoop.current
                // Orders repeat (97 values), so equal orders must keep the order they were added in.
                func order(_ index: Int) -> Int { (index * 7919) % 97 }
                // Adds `count` performers and drains them: the drain's CPU milliseconds, and
                // `count` if they ran out of order (0 when right).
                func drain(_ count: Int) -> (Double, Int) {
                    let ran = Mutex<[Int]>([])
                    ran.locked { $0.reserveCapacity(count) }
                    for index in 0..<count {
                        loop.perform(order: order(index)) { ran.locked { $0.append(index) } }
                    }
                    let start = threadCPUMilliseconds()
                    // The run ends when its mode is empty (the performers' timer is spent).
                    loop.run(mode: .default, for: .seconds(120))
                    let elapsed = threadCPUMilliseconds() - start
                    let expected = (0..<count).sorted { (order($0), $0) < (order($1), $1) }
                    return (elapsed, ran.locked { $0 } == expected ? 0 : count)
                }
                var small = Double.infinity
                var large = Double.infinity
                var wrong: [Int] = []
                for _ in 0..<3 {
                    let (time, misordered) = drain(400)
                    small = min(small, time)
                    if misordered > 0 { wrong.append(misordered) }
                }
                for _ in 0..<3 {
                    let (time, misordered) = drain(4_000)
                    large = min(large, time)
                    if misordered > 0 { wrong.append(misordered) }
                    // A quadratic drain already failed: no need to wait for two more.
                    if large > 15 * small { break }
                }
                return (small, large, wrong)
            })
        let (small, large, wrong) = outcome
        #expect(wrong.isEmpty, "drains of \(wrong) performers ran out of order")
        #expect(large <= 15 * small, "400 performers drained in \(small) ms, 4,000 in \(large) ms (\(large / small)x)")
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
