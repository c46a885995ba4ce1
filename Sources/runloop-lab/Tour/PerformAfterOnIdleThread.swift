import Foundation
import RunLoopKit

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
        The seed's puzzle: inside dispatch_async to a global queue, performSelector:afterDelay:0 \
        never calls its selector. A delayed perform is a one-shot timer added to the calling \
        thread's loop in .default; on a thread that never runs its loop nobody fires it, and when \
        the thread ends its loop is torn down with the timer in it. The same call followed by a \
        run of the loop fires it.
        """

    func run() {
        let trace = Trace()
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

        Out.subheading("trace")
        trace.printEvents()
        Out.subheading("thread 'no-run''s loop when its work ended: the timer waits in .default, which nobody runs")
        for line in dump.split(separator: "\n") where line.contains("timer") || line.contains("next fire") {
            Out.line(String(line))
        }
        Out.subheading(
            "summary: without a run the block \(ran.isSet ? "ran" : "never ran"); "
                + "with a run it \(ranWithRun.isSet ? "ran" : "never ran")")
        Out.conclusion(
            "a delayed perform needs the target thread's loop to run in one of its modes until the timer "
                + "is due. GCD's pool threads never run theirs: use asyncAfter there, or perform on a thread "
                + "that runs its loop (a PermanentThread, or the main loop).")
    }
}
