import Foundation
import RunLoopKit
import RunLoopScheduling

import class RunLoopKit.RunLoop

/// Experiment 17 (seeds 002, 003): the seeds' `po [NSRunLoop mainRunLoop]`, on `RunLoop.main`
/// set up with what UIKit puts there.
struct MainLoopDescription: Experiment {
    let title = "po RunLoop.main: the main loop's modes, common modes, sources, timers and observers"
    let seed = Seed.cite(2, 3)
    let seedSays = """
        Seeds 002/003 print the main loop (po [NSRunLoop mainRunLoop] / NSLog of [NSRunLoop \
        currentRunLoop]): common modes, the event queue's Source0, the Source1 ports, and the pool, \
        gesture and Core Animation observers (seed 002 gives the pool's orders ±2147483647). The \
        orders 1999000 and 2000000 and _beforeCACommitHandler are iOS's, from outside the seeds.
        """
    let summary = """
        The seeds print the main loop in the debugger: common modes {UITrackingRunLoopMode, \
        kCFRunLoopDefaultMode}, the Source0 that handles the event queue, the Source1 ports of \
        the event fetch thread and the display, and the observers at their orders \
        (_wrapRunLoopWithAutoreleasePoolHandler at -2147483647 and 2147483647, ...; iOS's \
        _beforeCACommitHandler at 1999000 and CA::Transaction::observer_callback at 2000000 come \
        from outside the seeds, which give no order for them). Here RunLoop.main gets the same items, labelled with the iOS callouts they stand for, and \
        its description is printed; then the items are removed.
        """

    func run() {
        let loop = RunLoop.main
        loop.addCommonMode(.tracking)
        let eventQueue = RunLoopSource(order: -1) {}
        eventQueue.label = "__handleEventQueue"
        let eventPort = MessagePort<Int>(order: 0) { _ in }
        eventPort.label = "__IOHIDEventSystemClientQueueCallback"
        let displayPort = MessagePort<Int>(order: 0) { _ in }
        displayPort.label = "__ZL22displayLinkTimerCallback (display link)"
        let delayed = RunLoopTimer(after: .seconds(3)) { _ in }
        delayed.label = "performSelector:afterDelay: 3 s"
        var observers: [RunLoopObserver] = []
        func observe(_ label: String, _ activities: RunLoop.Activity, _ order: Int) {
            let observer = RunLoopObserver(activities: activities, order: order) { _, _ in }
            observer.label = label
            observers.append(observer)
            loop.add(observer, forMode: .common)
        }
        observe("_wrapRunLoopWithAutoreleasePoolHandler (push)", .entry, IterationPool.uiKitOrders.push)
        observe("_UIGestureRecognizerUpdateObserver", .beforeWaiting, 0)
        observe("_beforeCACommitHandler", .beforeWaiting, 1_999_000)
        observe("_ZN2CA11Transaction17observer_callback", [.beforeWaiting, .exit], 2_000_000)
        observe("_wrapRunLoopWithAutoreleasePoolHandler (pop)", [.beforeWaiting, .exit], IterationPool.uiKitOrders.pop)
        loop.add(eventQueue, forMode: .common)
        loop.add(eventPort, forMode: .common)
        loop.add(displayPort, forMode: .common)
        loop.add(delayed, forMode: .default)

        Out.subheading("print(RunLoop.main) (the main queue's own Source1 is RunLoopKit's and not listed)")
        for line in loop.description.split(separator: "\n", omittingEmptySubsequences: false) {
            Out.line(String(line))
        }

        for observer in observers { observer.invalidate() }
        eventQueue.invalidate()
        _ = eventPort.invalidate()
        _ = displayPort.invalidate()
        delayed.invalidate()
        Out.conclusion(
            "items added for .common appear in every common mode (default and tracking), in order; "
                + "the timer added for .default only there. Modes are made on first use: a mode nobody "
                + "added to does not exist.")
    }
}
