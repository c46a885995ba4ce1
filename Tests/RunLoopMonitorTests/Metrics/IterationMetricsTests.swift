import Foundation
import RunLoopKit
import RunLoopMonitor
import RunLoopTesting
import SharedTestSupport
import Synchronization
import Testing

import class RunLoopKit.RunLoop

/// `IterationMetrics` on swift-metrics' test backend.
@Suite("IterationMetrics")
struct IterationMetricsTests {
    @Test("passes, sleeps, phases and wakeups by reason reach the recorders, per loop and mode")
    func recordsPasses() throws {
        _ = testMetrics
        // Real time (the phase timers record only phases that took time). The sixth fire stops a
        // long run, so however late a loaded machine wakes the loop, each wake is the timer's,
        // and a short run with nothing due then ends by its deadline.
        let thread = NamedThread(name: "metered-loop") {
            let loop = RunLoop.current
            let metrics = IterationMetrics(loop: loop, name: "metered")
            let fires = EventLog<Int>()
            let timer = RunLoopTimer(after: .milliseconds(5), repeating: .milliseconds(5)) { _ in
                fires.append(1)
                if fires.all.count == 6 { RunLoop.current.stop() }
            }
            loop.add(timer, forMode: .default)
            loop.run(mode: .default, for: .seconds(10))
            timer.invalidate()
            let keepAlive = RunLoopSource {}
            loop.add(keepAlive, forMode: .default)
            loop.run(mode: .default, for: .milliseconds(2))
            keepAlive.invalidate()
            metrics.stop()
        }
        thread.join()
        let base = [("loop", "metered"), ("mode", RunLoop.Mode.default.rawValue)]
        let iterations = try testMetrics.expectTimer(IterationMetrics.iterationLabel, base)
        // 6 timer passes and the deadline's.
        #expect(iterations.values.count == 7)
        let sleeps = try testMetrics.expectTimer(IterationMetrics.sleepLabel, base)
        #expect(sleeps.values.count == iterations.values.count)
        let timerWakes = try testMetrics.expectCounter(IterationMetrics.wakeupsLabel, base + [("reason", "timer")])
        #expect(timerWakes.totalValue == 6)
        let timeouts = try testMetrics.expectCounter(IterationMetrics.wakeupsLabel, base + [("reason", "timeout")])
        #expect(timeouts.totalValue == 1)
        let timerPhase = try testMetrics.expectTimer(IterationMetrics.phaseLabel, base + [("phase", "timers")])
        // The timers phase is entered in every pass of a mode with timers, due or not.
        #expect(timerPhase.values.count >= Int(timerWakes.totalValue))
    }
}
