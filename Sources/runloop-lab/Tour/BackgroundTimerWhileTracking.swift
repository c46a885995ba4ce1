import Dispatch
import Foundation
import RunLoopKit
import Synchronization

import class RunLoopKit.RunLoop

/// Experiment 20 (seeds 000/001 and 002): while `RunLoop.main` tracks, a `PermanentThread`'s timer
/// keeps firing and posts UI updates through `DispatchQueue.main`; a GCD timer on the main queue
/// fires beside them. Both reach the main thread through the main queue, which the main loop
/// serves in its common modes only.
struct BackgroundTimerWhileTracking: Experiment {
    let title = "The main loop tracks: a background thread's timer, UI updates via DispatchQueue.main, a main-queue GCD timer"
    let seed = Seed.cite(0, 1, 2)
    let seedSays = """
        Seeds 000/001 (方案二, NSTimer 不准): run the timer on a sub-thread's loop so scrolling does \
        not stop it, and hop back to the main thread for the UI. Seed 002 creates a GCD timer on \
        dispatch_get_main_queue() (interval 0) and quotes CF's __CFRunLoopRun, which watches the main \
        queue's port only when the mode is one of _commonModes. Seed 002 also says \
        "当 UI 滑动则进入 UITrackingMode 模式,所以 NSThread 的方法会停止" (when the UI scrolls, the \
        NSThread's methods stop): that is mistaken, as the trace shows — a thread's loop has its own \
        mode; only the main loop switches to tracking.
        """
    let summary = """
        A PermanentThread 'bg-timer' runs a 50 ms RunLoopTimer in its own loop's .default; each \
        tick does DispatchQueue.main.async { update the UI }. A DispatchSourceTimer on the main queue \
        fires every 50 ms too. The main thread runs RunLoop.main in .default (200 ms), in .tracking \
        (a common mode, as on iOS; 300 ms), in a private mode 'LabModalMode' (not common; 200 ms), \
        then in .default again (100 ms). The background ticks never stop; the UI updates and the \
        GCD timer's handler run in .default and .tracking and wait in the private mode, until \
        .default serves the main queue again (GCD merges the timer's missed fires into one call).
        """

    static let interval = Duration.milliseconds(50)
    /// The main loop's runs: (label, mode, how long).
    static let privateMode: RunLoop.Mode = "LabModalMode"
    static let phases: [(String, RunLoop.Mode, Duration)] = [
        ("default", .default, .milliseconds(200)),
        ("tracking", .tracking, .milliseconds(300)),
        ("LabModalMode", privateMode, .milliseconds(200)),
        ("default again", .default, .milliseconds(100)),
    ]

    func run() {
        guard Thread.isMainThread, RunLoop.main.servesMainDispatchQueue else {
            Out.conclusion("skipped: the tour is not on the main thread, or libdispatch has no main-queue handle here")
            return
        }
        let main = RunLoop.main
        LabTrace.recordIfTracing(main)
        let trace = TourLog()
        let tally = Tally(trace: trace)
        let note = tally.note

        // As on iOS, .tracking is a common mode of the main loop (UIKit makes it one). A mode never
        // leaves the common modes (as in CF): it stays common for the rest of the tour.
        main.addCommonMode(.tracking)
        // Each of the main loop's modes needs an item, or its run ends at once (.finished); a
        // scroll view's or a modal panel's own sources would be these.
        let keepAlive = RunLoopSource {}
        keepAlive.label = "the mode's own input (never signalled)"
        main.add(keepAlive, forMode: .tracking)
        main.add(keepAlive, forMode: Self.privateMode)

        let worker = PermanentThread(name: "bg-timer")
        LabTrace.recordIfTracing(worker.loop)
        let ticks = SharedCounter()
        let tick = RunLoopTimer(after: Self.interval, repeating: Self.interval) { _ in
            let number = ticks.increment()
            let workerMode = worker.loop.currentMode?.rawValue ?? "?"
            note("tick", "bg-timer: tick \(number) on its own loop (.\(workerMode)); DispatchQueue.main.async { update \(number) }")
            DispatchQueue.main.async {
                note("update", "    main: UI update \(number) applied (RunLoop.main in .\(main.currentMode?.rawValue ?? "?"))")
            }
        }
        tick.label = "bg-timer's 50 ms timer"
        worker.loop.add(tick, forMode: .default)

        let gcd = DispatchSource.makeTimerSource(queue: .main)
        gcd.schedule(deadline: .now() + .milliseconds(25), repeating: .milliseconds(50), leeway: .milliseconds(1))
        gcd.setEventHandler {
            let merged = gcd.data
            note(
                "gcd",
                "    main: GCD main-queue timer fired\(merged > 1 ? " (\(merged) fires merged into this call)" : "") "
                    + "(RunLoop.main in .\(main.currentMode?.rawValue ?? "?"))")
        }
        gcd.resume()

        for (index, (label, mode, length)) in Self.phases.enumerated() {
            tally.phase.store(index, ordering: .releasing)
            trace.log("main thread: run(mode: .\(mode.rawValue), for: \(TourLog.literal(length)))  [\(label)]")
            // A run returns early after handling a source only when asked to; repeat until the
            // time is up (a stop by the libdispatch side is not expected, but harmless).
            let end = ContinuousClock.now + length
            while ContinuousClock.now < end { main.run(mode: mode, for: end - .now) }
        }
        tally.phase.store(Self.phases.count, ordering: .releasing)
        gcd.cancel()
        tick.invalidate()
        worker.stop()
        main.remove(keepAlive, forMode: .tracking)
        main.remove(keepAlive, forMode: Self.privateMode)
        keepAlive.invalidate()

        Out.subheading("trace (two lines per kind and run; the table counts all)")
        trace.printEvents()
        let all = tally.events.locked { $0 }
        func count(_ kind: String, _ phase: Int) -> Int { all.filter { $0 == (kind, phase) }.count }
        Out.subheading("per run of the main loop:  bg-timer ticks   UI updates applied   GCD main-queue handler calls")
        var rows: [String] = []
        for (index, (label, _, length)) in Self.phases.enumerated() {
            let row =
                "\(label.padding(toLength: 14, withPad: " ", startingAt: 0)) \(TourLog.ms(length, width: 6))"
                + "   \(String(format: "%5d", count("tick", index)))"
                + "   \(String(format: "%18d", count("update", index)))"
                + "   \(String(format: "%28d", count("gcd", index)))"
            rows.append(row)
            Out.line(row)
        }
        Out.subheading(
            "summary: ticks \(Self.phases.indices.map { "\(count("tick", $0))" }.joined(separator: " / ")), "
                + "UI updates \(Self.phases.indices.map { "\(count("update", $0))" }.joined(separator: " / ")), "
                + "GCD calls \(Self.phases.indices.map { "\(count("gcd", $0))" }.joined(separator: " / ")) "
                + "(default / tracking / LabModalMode / default again)")
        Out.conclusion(
            "the background thread's timer is on its own loop, which never tracks: it ticks through every "
                + "mode of the main loop (seed 002's \"NSThread 的方法会停止\" is mistaken). Its UI updates and "
                + "the main-queue GCD timer depend on the main loop serving DispatchQueue.main, which it does "
                + "in the common modes .default and .tracking, not in a private mode: there they wait, and "
                + "the next common-mode run serves them in a burst.")
    }
}

/// The events of experiment 20, counted per run of the main loop; the first two of each kind per
/// run go to the trace.
private final class Tally: Sendable {
    /// The main loop's run in progress (an index into the phases), set by the main thread.
    let phase = Atomic<Int>(0)
    /// (kind, phase) of each event.
    let events = Mutex<[(String, Int)]>([])
    private let trace: TourLog

    init(trace: TourLog) { self.trace = trace }

    /// Counts an event of `kind` in the current run; logs `text` if it is one of the run's first two.
    @Sendable func note(_ kind: String, _ text: String) {
        let current = phase.load(ordering: .acquiring)
        let shown = events.locked { list -> Bool in
            list.append((kind, current))
            return list.filter { $0 == (kind, current) }.count <= 2
        }
        // Two lines per kind and run are enough to see the pattern; the table counts them all.
        if shown { trace.log(text) }
    }
}
