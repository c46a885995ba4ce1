import Foundation
import SharedTestSupport
import Synchronization
import Testing

import class RunLoopKit.RunLoop

@testable import RunLoopKit

/// ``RunLoop/timerSpinWindow``: the loop stops sleeping a window before a timer is due and spins;
/// the timer still never fires early, and the spinning loop still answers other threads.
@Suite struct TimerSpinWindowTests {
    /// With a window larger than the whole delay the loop spins from the start: the timer fires at
    /// or after its fire date (never before), and the spin counts as a wait for observers.
    @Test func spinningTimerNeverFiresEarly() {
        let result = TestThreads.runBlocking(timeout: .seconds(10), stackSize: 1 << 20) {
            () -> (fireDate: Int64, firedAt: Int64, waits: Int) in
            let loop = RunLoop.current
            loop.timerSpinWindow = .milliseconds(100)
            let fireDate = ContinuousClock.now + .milliseconds(20)
            let firedAt = Mutex<Int64>(0)
            let waits = Mutex(0)
            loop.add(
                RunLoopTimer(fireAt: fireDate) { _ in
                    firedAt.locked { $0 = LoopClock.now() }
                    RunLoop.current.stop()
                }, forMode: .default)
            loop.add(
                RunLoopObserver(activities: .beforeWaiting) { _, _ in waits.locked { $0 += 1 } }, forMode: .default)
            loop.run(mode: .default, for: .seconds(5))
            return (LoopClock.nanoseconds(fireDate), firedAt.locked { $0 }, waits.locked { $0 })
        }
        guard let result else {
            Issue.record("the loop thread did not finish")
            return
        }
        #expect(result.firedAt >= result.fireDate, "fired \(result.firedAt - result.fireDate) ns early")
        #expect(result.waits >= 1, "the spin is announced as a wait")
    }

    /// A loop spinning towards a distant timer runs a block performed from another thread at once,
    /// and a stop ends the run, long before the timer is due.
    @Test func spinningLoopAnswersOtherThreads() {
        let spinning = TestEvent()
        let ran = TestEvent()
        let timer = RunLoopTimer(after: .seconds(30)) { _ in }
        guard
            let thread = TestThread.hostingLoop(
                name: "spin-window",
                setup: { loop in
                    loop.timerSpinWindow = .seconds(60)
                    loop.add(timer, forMode: .default)
                    loop.add(RunLoopObserver(activities: .beforeWaiting) { _, _ in spinning.fire() }, forMode: .default)
                },
                run: { loop in
                    let result = loop.run(mode: .default, for: .seconds(30))
                    #expect(result == .stopped)
                    timer.invalidate()
                })
        else { return }
        #expect(spinning.wait(timeout: .seconds(10)))
        let loop = thread.loop
        let start = ContinuousClock.now
        loop.perform { ran.fire() }
        #expect(ran.wait(timeout: .seconds(10)))
        loop.stop()
        #expect(thread.join(timeout: .seconds(10)))
        // Bounded with room for a loaded machine: the timer was 30 s away.
        #expect(ContinuousClock.now - start < .seconds(10))
    }

    /// Negative windows count as zero.
    @Test func negativeWindowIsZero() {
        let loop = RunLoop.current
        loop.timerSpinWindow = .milliseconds(-5)
        #expect(loop.timerSpinWindow == .zero)
    }
}
