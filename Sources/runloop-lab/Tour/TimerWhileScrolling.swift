import Foundation
import RunLoopKit
import Synchronization

import class RunLoopKit.RunLoop

/// Experiment 2 (seeds 000, 004): a timer added for `.default` stops while the loop runs in
/// `.tracking` (a scroll view being dragged); a timer added for `.common` keeps firing.
struct TimerWhileScrolling: Experiment {
    let title = "NSTimer stops while scrolling"
    let seed = Seed.cite(0, 4)
    let seedSays = """
        Seed 000 (NSTimer 不准, 方案一) and seed 004: an NSTimer scheduled in the default mode stops \
        while a scroll view tracks, because the main loop then runs UITrackingRunLoopMode; adding \
        it for NSRunLoopCommonModes keeps it firing. The timings (50 ms timers, a 300 ms drag) are \
        ours.
        """
    let summary = """
        The loop makes .tracking a common mode (UIKit does this for the main loop, so .common = \
        default + tracking) and gets two 50 ms timers, one added for .default and one for .common. \
        It runs in .default; at 325 ms a callback runs it in .tracking for 300 ms (what UIKit does \
        while a finger drags a scroll view); then it is back in .default. Only the items of the \
        running mode fire: the .default timer stalls while tracking and fires once, late, when \
        tracking ends (missed ticks are skipped, not bunched); the .common timer never misses a beat.
        """

    /// The interval of both timers.
    static let interval = Duration.milliseconds(50)
    /// When the simulated scrolling starts, and how long it lasts.
    static let scrollAt = Duration.milliseconds(325)
    static let scrollFor = Duration.milliseconds(300)
    /// How long the outer `.default` run lasts (all three phases).
    static let runFor = Duration.milliseconds(925)

    /// One timer fire.
    struct Tick: Sendable {
        let timer: String
        let phase: Int
        let mode: RunLoop.Mode?
        let at: Duration
        let late: Duration
    }

    func run() {
        let (trace, ticks) = LoopThread.run(name: "scrolling") { loop in
            loop.addCommonMode(.tracking)
            let trace = TourLog()
            let phase = Atomic<Int>(1)
            let ticks = Mutex<[Tick]>([])

            func ticker(_ name: String) -> RunLoopTimer {
                RunLoopTimer(after: Self.interval, repeating: Self.interval) { timer in
                    let late = ContinuousClock.now - timer.fireDate
                    let tick = Tick(
                        timer: name, phase: phase.load(ordering: .relaxed), mode: loop.currentMode,
                        at: trace.elapsed, late: late)
                    ticks.locked { $0.append(tick) }
                }
            }
            let defaultTimer = ticker("default")
            let commonTimer = ticker("common")
            loop.add(defaultTimer, forMode: .default)
            loop.add(commonTimer, forMode: .common)

            let scroll = RunLoopTimer(after: Self.scrollAt) { _ in
                phase.store(2, ordering: .relaxed)
                trace.log("finger down: run(mode: .tracking, for: \(TourLog.literal(Self.scrollFor))) (nested)")
                let result = loop.run(mode: .tracking, for: Self.scrollFor)
                phase.store(3, ordering: .relaxed)
                trace.log("finger up: the .tracking run returned .\(result); back in \(loop.currentMode!)")
            }
            loop.add(scroll, forMode: .default)

            trace.log("run(mode: .default, for: \(TourLog.literal(Self.runFor)))")
            let result = loop.run(mode: .default, for: Self.runFor)
            trace.log("the .default run returned .\(result)")
            defaultTimer.invalidate()
            commonTimer.invalidate()
            return (trace, ticks.locked { $0 })
        }

        Out.subheading("trace (thread 'scrolling'); common modes = default + UITrackingRunLoopMode")
        trace.printEvents()
        Out.line("(ticks below: ms since start; \"late\" marks a fire at least half an interval after its date)")

        let phases = [
            (1, "phase 1: running in .default (before scrolling)"),
            (2, "phase 2: running in .tracking (scrolling)"),
            (3, "phase 3: running in .default again (after scrolling)"),
        ]
        for (number, name) in phases {
            Out.subheading(name)
            for timer in ["default", "common"] {
                let fired = ticks.filter { $0.timer == timer && $0.phase == number }
                let modes = Set(fired.compactMap { $0.mode?.rawValue }).sorted().joined(separator: ", ")
                var line = "timer added for .\(timer)".padding(toLength: 26, withPad: " ", startingAt: 0)
                line += "\(fired.count) ticks"
                if !fired.isEmpty { line += " (in \(modes))" }
                Out.line(line)
                let times = fired.map { tick in
                    let at = TourLog.ms(tick.at).dropLast(3)
                    return tick.late >= Self.interval / 2 ? "\(at) (late \(TourLog.ms(tick.late)))" : String(at)
                }
                Out.paragraph(
                    times.isEmpty ? "stalled: it is not in this mode" : "at " + times.joined(separator: ", "),
                    indent: 8)
            }
        }

        func total(_ timer: String, _ phase: Int) -> Int {
            ticks.filter { $0.timer == timer && $0.phase == phase }.count
        }
        Out.subheading(
            "summary: .default timer \(total("default", 1)) / \(total("default", 2)) / \(total("default", 3)) ticks, "
                + ".common timer \(total("common", 1)) / \(total("common", 2)) / \(total("common", 3)) ticks "
                + "(before / during / after scrolling)")
    }
}
