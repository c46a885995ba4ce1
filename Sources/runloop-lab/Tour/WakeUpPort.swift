import Foundation
import RunLoopKit

import class RunLoopKit.RunLoop

/// Experiment 19 (seed 002, `_wakeUpPort`): another thread calls `wakeUp()` on a sleeping loop;
/// the loop's iteration reports name what ended each sleep.
struct WakeUpPort: Experiment {
    let title = "wakeUp() from another thread: the wake-up port ends a sleep"
    let seed = Seed.cite(2)
    let seedSays = """
        CFRunLoopWakeUp sends a trivial message to the loop's _wakeUpPort (eventfd_write on \
        Linux, as the seed's copy of CF shows): "在iOS 中,除了 source1 可以自己唤醒 RunLoop 之外,\
        其他的事件都需要用户手动唤醒 RunLoop" (on iOS, only a Source1 wakes the loop by itself; \
        everything else must wake it by hand). Its experiment listens on the wake-up port with a \
        dispatch source and calls CFRunLoopWakeUp(CFRunLoopGetCurrent()) in touchesBegan.
        """
    let summary = """
        A thread's loop, kept alive by a Source0 that is never signalled, runs run(mode: .default, \
        for: 1 s, returnAfterSourceHandled: true) with a 150 ms one-shot timer; a thread 'waker' \
        waits until the loop sleeps and calls loop.wakeUp(), twice, then signals the Source0 and \
        calls wakeUp() (the seed's rule: a Source0 needs a hand wake). An iteration reporter prints \
        each pass's wake reason and sleep. A bare wakeUp() is not a handled source: the loop \
        sleeps again and the run goes on; the timer's pass says timer; the signalled Source0 ends \
        the run with .handledSource.
        """

    func run() {
        let trace = TourLog()
        // The Source0 the sleeper makes, for the waker to signal.
        let sleeperSource = SharedSlot<RunLoopSource>()
        let sleeper = LoopThread(name: "sleeper") { loop in
            // The seed's keep-alive port: a Source0 nobody signals until the end.
            let handled = RunLoopSource {
                trace.log("    the Source0 ran (signalled, then woken by hand)")
            }
            handled.label = "keep-alive Source0"
            loop.add(handled, forMode: .default)
            let timer = RunLoopTimer(after: .milliseconds(150)) { _ in trace.log("    150 ms timer fired") }
            timer.label = "150 ms one-shot timer"
            loop.add(timer, forMode: .default)
            let observer = RunLoopObserver(activities: [.beforeWaiting, .afterWaiting]) { _, activity in
                trace.log(activity == .beforeWaiting ? "beforeWaiting" : "afterWaiting")
            }
            loop.add(observer, forMode: .default)
            // One line per pass that slept: what ended the sleep, read from the loop's own report.
            let reporter = loop.addIterationReporter { report in
                guard report.wakeReason != .none else { return }
                trace.log("    pass \(report.generation): woke by .\(report.wakeReason) after sleeping \(TourLog.ms(report.slept))")
            }
            sleeperSource.set(handled)
            trace.log("run(mode: .default, for: .seconds(1), returnAfterSourceHandled: true)")
            let result = loop.run(mode: .default, for: .seconds(1), returnAfterSourceHandled: true)
            trace.log("the run returned .\(result)")
            reporter.cancel()
            observer.invalidate()
            handled.invalidate()
        }
        let loop = sleeper.loop
        let waker = LoopThread(name: "waker") { _ in
            loop.waitUntilAsleep()
            trace.log("thread 'waker': loop.wakeUp() (nothing to do)")
            loop.wakeUp()
            // The loop goes back to sleep: wait for it, then wake it again. The second sleep ends
            // at the timer, so the third wakeUp() waits for the sleep after the timer.
            Self.waitForNextSleep(loop, after: trace, count: 2)
            trace.log("thread 'waker': loop.wakeUp() again")
            loop.wakeUp()
            Self.waitForNextSleep(loop, after: trace, count: 4)
            trace.log("thread 'waker': source.signal(), then loop.wakeUp()")
            sleeperSource.current?.signal()
            loop.wakeUp()
        }
        waker.join()
        sleeper.join()

        Out.subheading("trace (thread 'sleeper'; lines indented are its callouts and iteration reports)")
        trace.printEvents()
        let texts = trace.events.map(\.text)
        let byWakeUp = texts.filter { $0.contains("woke by .wakeUp") }.count
        let byTimer = texts.filter { $0.contains("woke by .timer") }.count
        let returned = texts.last(where: { $0.hasPrefix("the run returned") }) ?? "?"
        Out.subheading("summary: \(byWakeUp) sleeps ended by .wakeUp, \(byTimer) by .timer; \(returned)")
        Out.conclusion(
            "wakeUp() writes the loop's eventfd (CF's _wakeUpPort on Linux): the sleep ends, the pass "
                + "reports .wakeUp, and with nothing to do the loop sleeps again; it is not a handled "
                + "source. A signalled Source0 does not wake the loop by itself (CF semantics); the "
                + "wakeUp() after signal() does, and the run returns after the Source0.")
    }

    /// Waits until the trace holds `count` `beforeWaiting` lines and the loop is asleep again.
    private static func waitForNextSleep(_ loop: RunLoop, after trace: TourLog, count: Int) {
        while trace.events.filter({ $0.text == "beforeWaiting" }).count < count { usleep(200) }
        loop.waitUntilAsleep()
    }
}
