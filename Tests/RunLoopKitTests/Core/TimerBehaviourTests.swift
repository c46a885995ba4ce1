import Foundation
import Synchronization
import Testing

import class RunLoopKit.RunLoop

@testable import RunLoopKit

/// Timer behaviour that needs a real loop: phase-keeping repeats, tolerance coalescing.
@Suite struct TimerBehaviourTests {
    /// A repeating timer whose handler overruns keeps its phase and skips the missed points: the
    /// next fire date is `first + k·interval`, the first such point after the handler returned.
    @Test func repeatingTimerKeepsPhaseAndSkipsMissedFirePoints() {
        let result = TestThreads.runBlocking(timeout: .seconds(10), stackSize: 1 << 20) {
            () -> (Int64, Int64, Int64, Int, Int64, Int64) in
            let loop = RunLoop.current
            let interval: Int64 = 20_000_000
            let first = ContinuousClock.now + .milliseconds(5)
            let fires = Mutex<[ContinuousClock.Instant]>([])
            let nextAfterFirst = Mutex<Int64>(0)
            let overrunEnd = Mutex<Int64>(0)
            let sawNextAt = Mutex<Int64>(0)
            let timer = RunLoopTimer(fireAt: first, interval: .nanoseconds(interval)) { timer in
                fires.locked { $0.append(.now) }
                if fires.locked({ $0.count }) == 1 {
                    // Overrun: three and a half intervals.
                    let until = ContinuousClock.now + .milliseconds(70)
                    while ContinuousClock.now < until {}
                    overrunEnd.locked { $0 = LoopClock.now() }
                } else {
                    timer.invalidate()
                    RunLoop.current.stop()
                }
            }
            let observer = RunLoopObserver(activities: .beforeWaiting) { _, _ in
                if fires.locked({ $0.count }) == 1, nextAfterFirst.locked({ $0 }) == 0 {
                    nextAfterFirst.locked { $0 = LoopClock.nanoseconds(timer.fireDate) }
                    sawNextAt.locked { $0 = LoopClock.now() }
                }
            }
            loop.add(timer, forMode: .default)
            loop.add(observer, forMode: .default)
            loop.run(mode: .default, for: .seconds(5))
            let firstNs = LoopClock.nanoseconds(first)
            let secondFire = fires.locked { LoopClock.nanoseconds($0.last!) }
            return (
                firstNs, nextAfterFirst.locked { $0 }, secondFire, fires.locked { $0.count },
                overrunEnd.locked { $0 }, sawNextAt.locked { $0 }
            )
        }
        guard let (first, next, secondFire, count, overrunEnd, sawNext) = result else {
            Issue.record("the loop thread did not finish")
            return
        }
        let interval: Int64 = 20_000_000
        #expect(count == 2)
        // Phase kept: an exact multiple of the interval after the first fire date...
        #expect((next - first) % interval == 0)
        // ...and the missed points (first + 1, 2, 3 intervals at least: all before the 70 ms
        // overrun ended) were skipped, not bunched: the next point comes after the overrun, and
        // the point before it had passed when the loop looked. (Which point that is depends on
        // how late the first fire was on a loaded machine: 4 intervals after the first when it
        // was on time.)
        #expect((next - first) / interval >= 4)
        #expect(next > overrunEnd)
        #expect(next - interval <= sawNext)
        #expect(secondFire >= next)
    }

    /// 100 timers due within 10 ms, each with 10 ms of tolerance, are served by at most three
    /// wakeups (CoreFoundation on Linux ignores tolerance and wakes for each distinct date).
    @Test func toleranceCoalescesWakeups() {
        let result = TestThreads.runBlocking(timeout: .seconds(10), stackSize: 1 << 20) {
            () -> (wakeups: Int, fired: Int, late: Int64) in
            let loop = RunLoop.current
            let wakeups = Mutex(0)
            let fired = Mutex(0)
            let maxLate = Mutex<Int64>(0)
            let start = ContinuousClock.now + .milliseconds(20)
            for index in 0..<100 {
                let due = start + .microseconds(index * 100)
                let timer = RunLoopTimer(fireAt: due, tolerance: .milliseconds(10)) { _ in
                    let late = LoopClock.now() - LoopClock.nanoseconds(due)
                    maxLate.locked { $0 = max($0, late) }
                    fired.locked { $0 += 1 }
                }
                loop.add(timer, forMode: .default)
            }
            let observer = RunLoopObserver(activities: .afterWaiting) { _, _ in wakeups.locked { $0 += 1 } }
            loop.add(observer, forMode: .default)
            // The run finishes when the last one-shot timer has fired and the mode is empty.
            let outcome = loop.run(mode: .default, for: .seconds(5))
            #expect(outcome == .finished)
            return (wakeups.locked { $0 }, fired.locked { $0 }, maxLate.locked { $0 })
        }
        guard let result else {
            Issue.record("the loop thread did not finish")
            return
        }
        #expect(result.fired == 100)
        #expect(result.wakeups <= 3, "wakeups: \(result.wakeups)")
        // Every timer fired no earlier than its fire date (late >= 0 for all).
        #expect(result.late >= 0)
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
