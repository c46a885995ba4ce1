import SharedTestSupport
import Synchronization
import Testing

import class RunLoopKit.RunLoop

@testable import RunLoopKit

/// ``RunLoop/wakeUpSpinWindow``: how long a loop just woken by another thread watches for the next
/// wakeup on the CPU. The spin itself is tested on `spinForWakeUp()`, the function the wait calls;
/// a loop with the spin off still runs everything other threads hand it.
@Suite struct WakeUpSpinWindowTests {
    @Test func theDefaultIsFiveMicrosecondsAndOutOfRangeValuesAreClamped() {
        let loop = RunLoop.current
        #expect(loop.wakeUpSpinWindow == .microseconds(5))
        loop.wakeUpSpinWindow = .milliseconds(-3)
        #expect(loop.wakeUpSpinWindow == .zero)
        loop.wakeUpSpinWindow = .seconds(Int64.max)
        #expect(loop.wakeUpSpinWindow == .milliseconds(1))
        loop.wakeUpSpinWindow = .microseconds(250)
        #expect(loop.wakeUpSpinWindow == .microseconds(250))
        loop.wakeUpSpinWindow = .microseconds(5)
    }

    /// With the window at its largest (1 ms) and no wakeup coming, the spin lasts the window (a
    /// lower bound on the monotonic clock, exact whatever the load); a pending wakeup ends it at
    /// once; with the window at zero it gives up without spinning.
    @Test func theSpinLastsTheWindowEndsOnAWakeUpAndIsOffAtZero() {
        let result = TestThreads.runBlocking(timeout: .seconds(30)) { () -> String? in
            let loop = RunLoop.current
            loop.wakeUpSpinWindow = .milliseconds(1)
            loop.confined.recentCrossThreadWakeUp = true
            var start = LoopClock.now()
            guard !loop.spinForWakeUp() else { return "a spin with no wakeup coming reported one" }
            let spun = LoopClock.now() - start
            guard spun >= 1_000_000 else { return "spun \(spun) ns of a 1 ms window" }
            guard !loop.confined.recentCrossThreadWakeUp else { return "an expired spin left the flag set" }

            loop.confined.recentCrossThreadWakeUp = true
            _ = loop.wake.request()
            guard loop.spinForWakeUp() else { return "a pending wakeup did not end the spin" }
            _ = loop.wake.takeRequest()

            loop.wakeUpSpinWindow = .zero
            loop.confined.recentCrossThreadWakeUp = true
            start = LoopClock.now()
            guard !loop.spinForWakeUp() else { return "a zero window reported a wakeup" }
            guard !loop.confined.recentCrossThreadWakeUp else { return "a zero window left the flag set" }
            // Generous: no spin at all, but a loaded machine may deschedule this thread.
            guard LoopClock.now() - start < 500_000_000 else { return "a zero window took half a second" }
            return nil
        }
        #expect(result == .some(nil), "\(String(describing: result))")
    }

    /// A newcomer's use: turn the spin off on a loop thread's loop, then hand it blocks from
    /// another thread, each after the one before has run (the case the spin is for). Every block
    /// runs, in order: with the spin off nothing is lost. (That the spin is off is the test
    /// above's: this one would pass with it on.)
    @Test func aLoopWithTheSpinOffRunsEveryBlockHandedToIt() {
        let keepAlive = RunLoopSource {}
        guard
            let thread = TestThread.hostingLoop(
                name: "spin-off",
                setup: { loop in
                    loop.wakeUpSpinWindow = .zero
                    loop.add(keepAlive, forMode: .default)
                },
                run: { loop in
                    #expect(loop.run(mode: .default, for: .seconds(120)) == .stopped)
                    keepAlive.invalidate()
                })
        else { return }
        let loop = thread.loop
        let seen = TestMonitor<[Int]>([])
        for index in 0..<1_000 {
            loop.perform { seen.update { $0.append(index) } }
            guard seen.wait(timeout: .seconds(30), until: { $0.count == index + 1 }) else {
                Issue.record("block \(index) did not run")
                break
            }
        }
        #expect(seen.read { $0 } == Array(0..<1_000))
        #expect(loop.wakeUpSpinWindow == .zero)
        loop.stop()
        #expect(thread.join(timeout: .seconds(30)))
    }
}
