import Dispatch
import Foundation
import RunLoopKit
import Synchronization

import class RunLoopKit.RunLoop

/// Experiment 14 (seeds 000, 001, 003): a GCD timer (`DispatchSourceTimer`) is not a loop item,
/// so it keeps firing while the loop runs in `.tracking`; a loop timer added for `.default` does
/// not.
struct GCDTimerWhileScrolling: Experiment {
    let title = "A GCD timer keeps firing while scrolling; a .default loop timer does not"
    let seed = Seed.cite(0, 1, 2, 3)
    let seedSays = """
        Seeds 000/001 (方案三): "GCD 的定时器是直接跟系统内核挂钩的,而且它不依赖于RunLoop,所以它非常 \
        的准时" (GCD's timer is tied to the kernel, does not depend on the run loop, so it is very \
        punctual); seed 003 lists GCD's timer beside CADisplayLink. Seed 002 creates one on \
        dispatch_get_main_queue() — that variant depends on the main loop after all (experiment \
        20). "Very punctual" is measured here, not assumed.
        """
    let summary = """
        The seeds' cure for "NSTimer stops while scrolling" besides .common: a dispatch timer, \
        which GCD fires from its own threads whatever mode the loop is in. A thread's loop gets a \
        50 ms RunLoopTimer for .default, and a 50 ms DispatchSourceTimer runs beside it on a \
        serial queue. The loop runs in .default; at 120 ms a callback runs it in .tracking for \
        300 ms (a finger dragging a scroll view). The trace counts each timer's fires before, \
        during and after tracking, and measures both timers' lateness (fire time minus its grid \
        point) outside tracking, where both fire (the .default timer's late first fire after \
        tracking left out): "very punctual" is a claim to measure. The \
        main-queue GCD timer is experiment 20.
        """

    static let interval = Duration.milliseconds(50)
    static let scrollAt = Duration.milliseconds(120)
    static let scrollFor = Duration.milliseconds(300)
    static let runFor = Duration.milliseconds(600)

    func run() {
        let trace = TourLog()
        let phase = Atomic<Int>(1)
        // (timer, phase) of each fire, in order.
        let fires = Mutex<[(String, Int)]>([])
        // Lateness of each fire outside tracking (both timers fire then): fire time minus grid point.
        let lateness = Mutex<(gcd: [Duration], loop: [Duration])>(([], []))
        let gcdStart = ContinuousClock.now
        let gcdCount = SharedCounter()
        let firesAfter = SharedCounter()
        let queue = DispatchQueue(label: "lab.gcd-timer")
        let gcd = DispatchSource.makeTimerSource(queue: queue)
        gcd.schedule(
            deadline: .now() + .milliseconds(50), repeating: .milliseconds(50), leeway: .milliseconds(1))
        gcd.setEventHandler {
            let current = phase.load(ordering: .relaxed)
            fires.locked { $0.append(("gcd", current)) }
            let grid = gcdStart + Self.interval * gcdCount.increment()
            if current != 2 { lateness.locked { $0.gcd.append(ContinuousClock.now - grid) } }
            if current == 2 { trace.log("    GCD timer fired on queue lab.gcd-timer (the loop is in .tracking)") }
        }

        // Both start together: the GCD timer now, the loop's 50 ms timer as its thread starts.
        gcd.resume()
        trace.log("DispatchSourceTimer resumed: every 50 ms on queue lab.gcd-timer")
        LoopThread.run(name: "gcd-vs-loop") { loop in
            let loopTimer = RunLoopTimer(after: Self.interval, repeating: Self.interval) { timer in
                let current = phase.load(ordering: .relaxed)
                fires.locked { $0.append(("loop", current)) }
                // fireDate is still the grid point being served while the handler runs.
                // The first fire after tracking is late by design (the run was elsewhere): not counted.
                if current == 1 || (current == 3 && firesAfter.increment() > 1) {
                    lateness.locked { $0.loop.append(ContinuousClock.now - timer.fireDate) }
                }
                trace.log("    RunLoopTimer (.default) fired in .\(loop.currentMode!.rawValue)")
            }
            loopTimer.label = "50 ms RunLoopTimer (.default)"
            loop.add(loopTimer, forMode: .default)
            let scroll = RunLoopTimer(after: Self.scrollAt) { _ in
                phase.store(2, ordering: .relaxed)
                trace.log("finger down: run(mode: .tracking, for: \(TourLog.literal(Self.scrollFor)))")
                loop.add(RunLoopSource {}, forMode: .tracking)  // a scroll view's source: .tracking is not empty
                let result = loop.run(mode: .tracking, for: Self.scrollFor)
                phase.store(3, ordering: .relaxed)
                trace.log("finger up: the .tracking run returned .\(result)")
            }
            scroll.label = "finger down"
            loop.add(scroll, forMode: .default)
            trace.log("run(mode: .default, for: \(TourLog.literal(Self.runFor)))")
            loop.run(mode: .default, for: Self.runFor)
            loopTimer.invalidate()
        }
        gcd.cancel()
        queue.sync {}

        Out.subheading("trace (thread 'gcd-vs-loop'; GCD's fires are logged only while tracking)")
        trace.printEvents()
        let all = fires.locked { $0 }
        func count(_ timer: String, _ phase: Int) -> Int { all.filter { $0 == (timer, phase) }.count }
        Out.subheading(
            "summary: GCD timer \(count("gcd", 1)) / \(count("gcd", 2)) / \(count("gcd", 3)) fires, "
                + "RunLoopTimer (.default) \(count("loop", 1)) / \(count("loop", 2)) / \(count("loop", 3)) fires "
                + "(before / during / after tracking)")
        let (gcdLate, loopLate) = lateness.locked { ($0.gcd.sorted(), $0.loop.sorted()) }
        func stats(_ values: [Duration]) -> String {
            guard let last = values.last else { return "no fires" }
            return "median \(TourLog.ms(values[values.count / 2])), max \(TourLog.ms(last)) over \(values.count) fires"
        }
        Out.subheading(
            "lateness outside tracking: DispatchSourceTimer \(stats(gcdLate)); RunLoopTimer \(stats(loopLate)) "
                + "(the 60 Hz table in BENCHMARKS.md measures many more fires)")
        Out.conclusion(
            "a dispatch timer is not a loop item: no mode switch stops it (its handler runs on a GCD thread, "
                + "so UI work must hop back to the main loop). The .default RunLoopTimer is silent while "
                + "tracking and fires once, late, when tracking ends.")
    }
}
