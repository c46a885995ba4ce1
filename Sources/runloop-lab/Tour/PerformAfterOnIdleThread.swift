import Foundation
import RunLoopKit
import Synchronization

import class RunLoopKit.RunLoop

/// Experiment 15 (seed 004): `perform(after:)` — `performSelector:withObject:afterDelay:` — on a
/// thread whose loop is never run does nothing.
struct PerformAfterOnIdleThread: Experiment {
    let title = "perform(after:) on a thread whose loop never runs"
    let seed = Seed.cite(3, 4)
    let seedSays = """
        Seed 003: performSelector:afterDelay: "内部会创建一个Timer到当前线程的runloop中(如果当前线程没 \
        runloop则方法无效...)" (makes a timer in the current thread's loop; without a running loop it \
        does nothing) — right. Seed 004 states the rule for performSelector:onThread: — "其内部会 \
        创建一个 Timer" (it makes a timer): that is mistaken; on Darwin it is a version-0 source, and \
        RunLoopKit's perform(inModes:) is a performed item, not a timer, as shown below. Neither seed \
        frames it with dispatch_async to a global queue; that framing is ours.
        """
    let summary = """
        A delayed perform is a one-shot timer added to the calling \
        thread's loop in .default; on a thread that never runs its loop nobody fires it, and when \
        the thread ends its loop is torn down with the timer in it. The same call followed by a \
        run of the loop fires it. Last, seed 004's claim: the main thread performs a block on \
        a sleeping thread's loop with perform(inModes:waitUntilDone: false) \
        (performSelector:onThread:) and reads that loop's next timer date before and after: no \
        timer is added; the call wakes the loop, which runs the block.
        """

    func run() {
        let trace = TourLog()
        let ran = SharedFlag(false)
        let dump = LoopThread.run(name: "no-run") { loop -> String in
            trace.log("thread 'no-run': loop.perform(after: .zero) { ... }, then the thread's work ends")
            loop.perform(after: .zero) {
                ran.set(true)
                trace.log("    the delayed block ran")
            }
            return loop.description
        }
        usleep(100_000)
        trace.log("100 ms later: the block \(ran.isSet ? "ran" : "never ran"); thread 'no-run' has exited")

        let ranWithRun = SharedFlag(false)
        LoopThread.run(name: "runs-its-loop") { loop in
            trace.log("thread 'runs-its-loop': the same call, then loop.run(mode: .default, for: .milliseconds(50))")
            loop.perform(after: .zero) {
                ranWithRun.set(true)
                trace.log("    the delayed block ran (in .\(loop.currentMode!.rawValue))")
            }
            let result = loop.run(mode: .default, for: .milliseconds(50))
            trace.log("run returned .\(result)")
        }

        // Seed 004: "performSelector:onThread: ... 其内部会创建一个 Timer" — check the loop's timers.
        let timerDates = Mutex<[String]>([])
        let target = LoopThread(name: "on-thread") { loop in
            // A keep-alive source, as the seeds' NSMachPort, so the loop sleeps until woken.
            let keepAlive = RunLoopSource {}
            loop.add(keepAlive, forMode: .default)
            let result = loop.run(mode: .default, for: .seconds(1), returnAfterSourceHandled: true)
            trace.log("thread 'on-thread': its run returned .\(result)")
            keepAlive.invalidate()
        }
        let loop = target.loop
        loop.waitUntilAsleep()
        let before = loop.nextTimerFireDate(forMode: .default)
        trace.log("main: on-thread's next timer before: \(before.map { "\($0)" } ?? "none"); perform(inModes: [.default], waitUntilDone: false) { ... }")
        let performed = SharedFlag(false)
        try? loop.perform(inModes: [.default], waitUntilDone: false) {
            performed.set(true)
            trace.log("    the performed block ran on 'on-thread' (phase \(RunLoop.current.phaseSnapshot.phase))")
            RunLoop.current.stop()
        }
        let after = loop.nextTimerFireDate(forMode: .default)
        timerDates.locked { $0 = [before.map { "\($0)" } ?? "none", after.map { "\($0)" } ?? "none"] }
        trace.log("main: on-thread's next timer right after the call: \(after.map { "\($0)" } ?? "none")")
        target.join()

        Out.subheading("trace")
        trace.printEvents()
        Out.subheading("thread 'no-run''s loop when its work ended: the timer waits in .default, which nobody runs")
        for line in dump.split(separator: "\n") where line.contains("timer") || line.contains("next fire") {
            Out.line(String(line))
        }
        let dates = timerDates.locked { $0 }
        Out.subheading(
            "summary: without a run the block \(ran.isSet ? "ran" : "never ran"); "
                + "with a run it \(ranWithRun.isSet ? "ran" : "never ran"); "
                + "perform on a thread added \(dates.last == "none" ? "no timer" : "a timer") and "
                + "\(performed.isSet ? "ran" : "never ran")")
        Out.conclusion(
            "a delayed perform needs the target thread's loop to run in one of its modes until the timer "
                + "is due. GCD's pool threads never run theirs: use asyncAfter there, or perform on a thread "
                + "that runs its loop (a PermanentThread, or the main loop). Seed 004's \"performSelector:onThread: "
                + "makes a timer\" is mistaken: on Darwin it is a version-0 source; here the loop runs the "
                + "perform in the phase shown above, after a wakeup, and its timers are untouched.")
    }
}
