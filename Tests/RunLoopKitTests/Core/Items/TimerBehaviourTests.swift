import Foundation
import SharedTestSupport
import Synchronization
import Testing

import class RunLoopKit.RunLoop

@testable import RunLoopKit
import RunLoopTesting

/// Timer behaviour that needs a real loop: phase-keeping repeats, tolerance coalescing.
@Suite struct TimerBehaviourTests {
    // Phase-keeping, missed ticks and tolerance on virtual time (RunLoopTesting): the real run
    // algorithm, exact instants, no real time passing, so no bounds to widen for a loaded
    // machine. The same rules on the real clock, against CoreFoundation:
    // DifferentialTests.repeatingTimerSkipsMissed.

    /// Phase-keeping: a handler that takes 30 ms does not push the next fire date; it stays on
    /// the grid `first + k·interval`.
    @Test func aRepeatingTimerKeepsItsPhaseWhenItsHandlerTakesTime() throws {
        try withVirtualTime { time in
            let start = time.start
            let fires = LoopBound<[Duration]>([])
            let timer = RunLoopTimer(after: .milliseconds(100), repeating: .milliseconds(100)) { _ in
                fires.value.append(RunLoop.now - start)
                time.elapse(.milliseconds(30))
            }
            RunLoop.current.add(timer, forMode: .default)
            try time.advance(by: .milliseconds(450))
            #expect(fires.value == [.milliseconds(100), .milliseconds(200), .milliseconds(300), .milliseconds(400)])
        }
    }

    /// Missed ticks are skipped, not bunched: a handler that overruns by 2.5 intervals makes the
    /// next fire the first grid point after it returned.
    @Test func aRepeatingTimerSkipsTheTicksItMissed() throws {
        try withVirtualTime { time in
            let start = time.start
            let fires = LoopBound<[Duration]>([])
            let nextFireDate = LoopBound<Duration?>(nil)
            let timer = RunLoopTimer(after: .milliseconds(100), repeating: .milliseconds(100)) { timer in
                fires.value.append(RunLoop.now - start)
                if fires.value.count == 1 { time.elapse(.milliseconds(250)) }
            }
            let observer = RunLoopObserver(activities: .beforeWaiting) { _, _ in
                if fires.value.count == 1, nextFireDate.value == nil { nextFireDate.value = timer.fireDate - start }
            }
            RunLoop.current.add(timer, forMode: .default)
            RunLoop.current.add(observer, forMode: .default)
            try time.advance(by: .milliseconds(600))
            #expect(nextFireDate.value == .milliseconds(400))
            #expect(fires.value == [.milliseconds(100), .milliseconds(400), .milliseconds(500), .milliseconds(600)])
        }
    }

    /// Tolerance coalesces: 100 timers due within 10 ms, each with 10 ms of tolerance, fire in
    /// one wakeup, at the earliest timer's latest acceptable instant.
    @Test func toleranceServesTimersDueTogetherInOneWakeup() throws {
        try withVirtualTime { time in
            let start = time.start
            let fired = LoopBound<[Duration]>([])
            let wakeups = LoopBound(0)
            for index in 0..<100 {
                let timer = RunLoopTimer(fireAt: start + .milliseconds(20) + .microseconds(100 * index), tolerance: .milliseconds(10)) { _ in
                    fired.value.append(RunLoop.now - start)
                }
                RunLoop.current.add(timer, forMode: .default)
            }
            RunLoop.current.add(RunLoopObserver(activities: .afterWaiting) { _, _ in wakeups.value += 1 }, forMode: .default)
            try time.advance(by: .milliseconds(100))
            #expect(fired.value.count == 100)
            #expect(Set(fired.value) == [.milliseconds(30)])
            // One wakeup for all of them; then the mode is empty (observers keep no mode alive),
            // so the run finishes, as it would in production, and the rest of the time passes.
            #expect(wakeups.value == 1)
            #expect(time.elapsed == .milliseconds(100))
        }
    }

    @Test func nextTimerFireDateIsTheEarliestValidTimer() {
        let ok = TestThreads.runBlocking(timeout: .seconds(10), stackSize: 1 << 20) { () -> Bool in
            let loop = RunLoop.current
            let base = ContinuousClock.now + .seconds(100)
            let early = RunLoopTimer(fireAt: base) { _ in }
            let late = RunLoopTimer(fireAt: base + .seconds(1)) { _ in }
            loop.add(late, forMode: .default)
            loop.add(early, forMode: .default)
            guard loop.nextTimerFireDate(forMode: .default) == base else { return false }
            early.invalidate()
            guard loop.nextTimerFireDate(forMode: .default) == base + .seconds(1) else { return false }
            late.fireDate = base - .seconds(50)
            guard loop.nextTimerFireDate(forMode: .default) == base - .seconds(50) else { return false }
            return loop.nextTimerFireDate(forMode: "Elsewhere") == nil
                && loop.nextTimerFireDate(forMode: .common) == nil
        }
        #expect(ok == true)
    }
}
