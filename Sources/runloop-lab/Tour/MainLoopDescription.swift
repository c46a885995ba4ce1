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
        bareMainLoop()
        mainLoopWithUIKitsItems()
    }

    /// (a) Seed 002's `main.m`: `NSLog(@"%@", NSRunLoop.currentRunLoop)` before
    /// `UIApplicationMain`, on a main loop nothing was added to yet.
    private func bareMainLoop() {
        Out.subheading("(a) seed 002's main.m: NSLog(@\"%@\", NSRunLoop.currentRunLoop) before UIApplicationMain")
        Out.line("seed 002 (CFRunLoop on iOS, quoted): <CFRunLoop 0x6000015f0000 ...>{wakeup port = 0x1103, stopped = false,")
        Out.line("  ignoreWakeUps = true, current mode = (none), common modes = {kCFRunLoopDefaultMode}, common mode items = (null),")
        Out.line("  modes = {<CFRunLoopMode ...>{name = kCFRunLoopDefaultMode, port set = 0x1003, ..., timer port = 0xe03,")
        Out.line("  sources0 = (null), sources1 = (null), observers = (null), timers = (null),")
        Out.line("  currently ... / soft deadline in: 1.84464867e+10 sec (@ -1) / hard deadline in: 1.84464867e+10 sec (@ -1)}}}")
        Out.line("seed 002: \"main.m 中,还没有 return 的时候当前 RunLoop 的内部结构中存在一个 wakeup port 的端口\"")
        Out.line("  (before main returns, the loop already has a wakeup port). RunLoopKit's RunLoop.main here:")
        for line in RunLoop.main.description.split(separator: "\n", omittingEmptySubsequences: false) {
            Out.line("  " + String(line))
        }
        Out.conclusion(
            "the same skeleton: the wake-up port is an eventfd (a Mach port on iOS), the mode's port set an "
                + "epoll descriptor, the timer port a timerfd; not stopped, ignoring wake-ups until a run "
                + "starts, no current mode, kCFRunLoopDefaultMode (in the tour, also the modes earlier "
                + "experiments ran the main loop in: modes are never removed), and no deadline. Its only item, "
                + "the main queue's Source1, is RunLoopKit's own and not listed (CF does not list its "
                + "dispatch port either).")
    }

    /// (b) The main loop with the items UIKit adds, as the seeds print it in the debugger.
    private func mainLoopWithUIKitsItems() {
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

        Out.subheading("(b) print(RunLoop.main) with UIKit's items (the main queue's own Source1 is RunLoopKit's and not listed)")
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
