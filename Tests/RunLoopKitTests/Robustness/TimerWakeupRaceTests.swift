import CRunLoopKit
import Glibc
import SharedTestSupport
import Synchronization
import Testing

@testable import RunLoopKit

// A timer added from another thread must fire on time even when it is added at the moment the
// loop re-arms its timerfd: the loop sleeps armed for timer X; X is invalidated (no wakeup needed)
// and the loop is woken, so it re-arms for a later deadline; meanwhile timer Y, due just after X
// was, is added. If the adder decides "no wakeup needed, the loop is armed for X" from an armed
// deadline the loop is about to replace, the loop sleeps through Y.

@Suite(.serialized, .exclusive(.robustness)) struct TimerWakeupRace {
    @Test func aTimerAddedWhileTheLoopReArmsFiresOnTime() async {
        let trials = TestThreads.scaled(400, minimum: 100)
        final class Shared: Sendable {
            let done = Atomic<Bool>(false)
            let fired = TestMonitor<Int>(0)
        }
        let shared = Shared()
        guard
            let host = TestThread.hostingLoop(
                name: "rlk-arm-loop",
                setup: { loop in loop.add(RunLoopSource {}, forMode: .default) },
                run: { loop in
                    while !shared.done.load(ordering: .acquiring) { loop.run(mode: .default, for: .seconds(20)) }
                })
        else { return }
        let loop = host.loop

        let result = await TestThreads.run(name: "rlk-arm-driver", timeout: .seconds(120)) { () -> [String] in
            var late: [String] = []
            var skipped = 0
            for trial in 0..<trials {
                // 1. The loop sleeps, armed for X.
                let x = RunLoopTimer(after: .milliseconds(3)) { _ in }
                loop.add(x, forMode: .default)
                let giveUp = ContinuousClock.now + .milliseconds(2)
                var armed = false
                while ContinuousClock.now < giveUp {
                    if loop.isWaiting {
                        armed = true
                        break
                    }
                }
                if !armed {
                    skipped += 1
                    x.invalidate()
                    continue
                }
                // 2. X goes away (no wakeup), then the loop is woken and re-arms for its run's end.
                x.invalidate()
                loop.wakeUp()
                // 3. Meanwhile Y, due just after X was, is added.
                var sink = 0
                for index in 0..<(trial % 100) * 8 { sink &+= index }
                withExtendedLifetime(sink) {}
                let target = trial + 1
                let y = RunLoopTimer(fireAt: x.fireDate + .microseconds(300)) { _ in
                    shared.fired.update { $0 = target }
                }
                loop.add(y, forMode: .default)
                let due = y.fireDate
                // Y is due in about 3 ms. A loop that slept through it sleeps until its run's
                // end, 20 s away; 5 s leaves a loaded machine room to be merely slow.
                if !shared.fired.wait(timeout: .seconds(5), until: { $0 >= target }) {
                    late.append(
                        "trial \(trial): a timer due \(due) did not fire within 5 s; loop: \(loop.description)")
                    y.invalidate()
                    loop.wakeUp()
                    _ = shared.fired.wait(timeout: .seconds(1), until: { $0 >= target })
                    shared.fired.update { $0 = target }
                }
            }
            if skipped > trials / 2 { late.append("\(skipped) of \(trials) trials could not set up") }
            print("TimerWakeupRace: \(trials - skipped) trials run, \(skipped) skipped")
            return late
        }
        shared.done.store(true, ordering: .releasing)
        loop.perform { RunLoop.current.stop() }
        _ = await host.joinAsync(timeout: .seconds(30))
        guard let late = result else { return }
        #expect(late.isEmpty, "\(late.count) of \(trials) timers slept through: \(late.prefix(3))")
    }
}
