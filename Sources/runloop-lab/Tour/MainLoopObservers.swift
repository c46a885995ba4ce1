import Foundation
import RunLoopKit
import RunLoopScheduling

import class RunLoopKit.RunLoop

/// Experiment 11 (seeds 002, 003): the iOS main loop's observers, rebuilt with RunLoopScheduling
/// at UIKit's and Core Animation's orders, dumped like `po [NSRunLoop mainRunLoop]`, and the order
/// they run in during one iteration.
struct MainLoopObservers: Experiment {
    let title = "The iOS main loop's observers: pool push, commit, pool pop"
    let seed = Seed.cite(2, 3)
    let seedSays = """
        Seed 002: the main loop's pool observers (_wrapRunLoopWithAutoReleasePoolHandler: push at \
        entry, order -2147483647; pop and push at beforeWaiting, pop at exit, order 2147483647), \
        _UIGestureRecognizerUpdateObserver at beforeWaiting, and Core Animation's \
        _ZN2CA11Transaction17observer_callback at beforeWaiting and exit (no order given); seed 003 \
        names the gesture observer too. From outside the seeds (iOS's main loop as dumped on a \
        device): the orders 1999000 and 2000000 and the layout observer _beforeCACommitHandler.
        """
    let summary = """
        A thread's loop gets what UIKit puts on the main loop: an IterationPool at UIKit's orders \
        (push at entry, -2147483647; drain at beforeWaiting and exit, 2147483647), a gesture \
        observer at 0, a layout CommitCoalescer at 1999000 (_beforeCACommitHandler) and a display \
        CommitCoalescer at 2000000 (CA::Transaction::observer_callback) — these two orders and \
        _beforeCACommitHandler are iOS's, from outside the seeds. The loop's description \
        lists them like the seeds' `po [NSRunLoop mainRunLoop]`. Then a 10 ms timer plays a touch: \
        it marks a cell for layout, hands the pool a cell object and a deferred closure; the trace \
        shows who runs when in that iteration and at the run's exit.
        """

    /// What each observer order stands for (UIKit's callout on iOS, then ours).
    static let callouts: [Int: String] = [
        IterationPool.uiKitOrders.push: "IterationPool push (iOS: _wrapRunLoopWithAutoreleasePoolHandler)",
        0: "gesture update (iOS: _UIGestureRecognizerUpdateObserver)",
        1_999_000: "layout CommitCoalescer (iOS: _beforeCACommitHandler)",
        2_000_000: "display CommitCoalescer (iOS: _ZN2CA11Transaction17observer_callback)",
        IterationPool.uiKitOrders.pop: "IterationPool drain (iOS: _wrapRunLoopWithAutoreleasePoolHandler)",
    ]

    /// A cell whose release the trace shows.
    final class Cell: Sendable {
        let trace: TourLog
        init(trace: TourLog) { self.trace = trace }
        deinit { trace.log("    IterationPool drain: cell object released (deinit)") }
    }

    func run() {
        let (dump, trace) = LoopThread.run(name: "main-loop") { loop -> (String, TourLog) in
            loop.addCommonMode(.tracking)
            let trace = TourLog()
            let pool = IterationPool(
                loop: loop, pushOrder: IterationPool.uiKitOrders.push, popOrder: IterationPool.uiKitOrders.pop)
            let gesture = RunLoopObserver(activities: .beforeWaiting, order: 0) { _, _ in
                trace.log("    gesture update (order 0)")
            }
            loop.add(gesture, forMode: .common)
            let layout = CommitCoalescer(loop: loop, order: 1_999_000)
            let display = CommitCoalescer(loop: loop, order: CommitCoalescer.defaultOrder)
            let dump = loop.description

            // The activity log runs first; a second log beside the pool's push (same order, added
            // after it) shows when the push ran.
            let activities = RunLoopObserver(activities: .allActivities, order: Int.min) { _, activity in
                trace.log(ObserverLog.label(activity))
            }
            loop.add(activities, forMode: .common)
            let pushed = RunLoopObserver(activities: .entry, order: IterationPool.uiKitOrders.push) { _, _ in
                trace.log("    IterationPool push (order -2147483647): a level for this run")
            }
            loop.add(pushed, forMode: .common)
            let drained = RunLoopObserver(activities: [.beforeWaiting, .exit], order: IterationPool.uiKitOrders.pop) {
                _, activity in
                trace.log("    IterationPool drain done (order 2147483647)" + (activity == .exit ? ": level popped" : ""))
            }
            loop.add(drained, forMode: .common)

            let touch = RunLoopTimer(after: .milliseconds(10)) { _ in
                trace.log("    -> timer fired: a touch moves cell 3")
                layout.setNeedsCommit(key: "cell-3") {
                    trace.log("    layout commit (order 1999000): cell 3 laid out; it needs display")
                    display.setNeedsCommit(key: "cell-3") {
                        trace.log("    display commit (order 2000000): cell 3 drawn, in the same iteration")
                    }
                }
                pool.release(Cell(trace: trace))
                pool.defer { trace.log("    IterationPool drain: deferred closure runs (last in, first out)") }
            }
            loop.add(touch, forMode: .default)
            // Observers do not keep a mode alive: without a second timer the run would end (with
            // its exit's commits and drain) right after the touch.
            let touchEnds = RunLoopTimer(after: .milliseconds(20)) { _ in
                trace.log("    -> timer fired: the touch ends; nothing left in the mode")
            }
            loop.add(touchEnds, forMode: .default)
            let result = loop.run(mode: .default, for: .milliseconds(30))
            trace.log("run(mode: .default, for: .milliseconds(30)) returned .\(result) (no source or timer left)")
            for observer in [gesture, activities, pushed, drained] { observer.invalidate() }
            layout.invalidate()
            display.invalidate()
            pool.invalidate()
            return (dump, trace)
        }

        Out.subheading("print(loop.description) — the observers of kCFRunLoopDefaultMode, named")
        Self.printObservers(of: dump)
        Out.subheading("one run: entry, a sleep, the touch's iteration, the touch's end and exit")
        trace.printEvents()
    }

    /// Prints the default mode's observer lines of `dump`, each with the callout its order stands for.
    static func printObservers(of dump: String) {
        var inDefault = false
        var inObservers = false
        for line in dump.split(separator: "\n", omittingEmptySubsequences: false) {
            let text = line.trimmingCharacters(in: .whitespaces)
            if text.hasPrefix("<RunLoopMode") { inDefault = text.contains("'kCFRunLoopDefaultMode'") }
            if inDefault && text == "observers = {" {
                inObservers = true
                Out.line("observers = (")
                continue
            }
            guard inObservers else { continue }
            if text.hasPrefix("}") {
                Out.line(")")
                return
            }
            // "order N, activities A, repeats R"
            let order = text.split(separator: ",").first.flatMap { Int($0.split(separator: " ").last ?? "") }
            let callout = order.flatMap { callouts[$0] } ?? "?"
            Out.line("  {\(text), callout = \(callout)}")
        }
    }
}
