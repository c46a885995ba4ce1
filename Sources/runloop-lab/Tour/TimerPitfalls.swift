import Foundation
import RunLoopKit
import Synchronization

import class RunLoopKit.RunLoop

/// Experiment (seeds 000, 001, 002): NSTimer's pitfalls and RunLoopKit's fixes — a timer held up
/// by a long task skips the ticks it missed and keeps its phase; a timer with a weak target does
/// not keep its owner alive and invalidates itself when the owner is gone (the NSProxy fix, built
/// in); a delayed perform for `.default` waits while the loop is in `.tracking` (the seeds'
/// image-loading trick).
struct TimerPitfalls: Experiment {
    let title = "Timer pitfalls: long tasks, retain cycles, delayed performs"
    let seed = Seed.cite(0, 1, 2, 3)
    let seedSays = """
        Seeds 000/001: NSTimer is not punctual (a busy loop delays it; 问题一) and a repeating timer \
        retains its target (问题二, cured with a weak proxy). Seeds 002 and 003: \
        performSelector:afterDelay:inModes:@[NSDefaultRunLoopMode] (setImage:, downloadAndShowImage) \
        waits while the main loop tracks. Seed 003 adds that a timer that misses its point skips \
        it ("这个时间点的回调也会跳过去,不会延后执行"). The 20/75 ms timings are ours.
        """
    let summary = """
        (a) A 20 ms timer whose loop is busy for 75 ms in a block: the loop cannot fire it while \
        the block runs; afterwards it fires once, late, and its next fire date stays on its 20 ms \
        grid (missed ticks are skipped, not bunched). (b) An owner keeps a repeating timer whose \
        target is the owner: with NSTimer that is a retain cycle; RunLoopKit's weak-target timer \
        lets the owner go and invalidates itself at its next fire. (c) loop.perform(after:inModes: \
        [.default]) — performSelector:afterDelay:inModes:@[NSDefaultRunLoopMode] — waits while the \
        loop runs in .tracking and runs as soon as it is back in .default.
        """

    func run() {
        longTask()
        weakTarget()
        delayedPerform()
    }

    /// (a) A timer blocked by a long task.
    private func longTask() {
        let trace = LoopThread.run(name: "timer-busy") { loop -> TourLog in
            let trace = TourLog()
            let interval = Duration.milliseconds(20)
            let first = ContinuousClock.now + interval
            let ticks = Atomic(0)
            let timer = RunLoopTimer(fireAt: first, interval: interval) { timer in
                let tick = ticks.add(1, ordering: .relaxed).newValue
                let offset = ContinuousClock.now - first
                trace.log(
                    "tick \(tick): \(TourLog.ms(ContinuousClock.now - timer.fireDate)) after its fire date "
                        + "(\(TourLog.ms(offset)) after the first)")
                if tick == 2 {
                    loop.perform {
                        trace.log("a block busy for 75 ms starts (the loop can fire nothing meanwhile)")
                        let until = ContinuousClock.now + .milliseconds(75)
                        while ContinuousClock.now < until {}
                        trace.log("the block ends")
                    }
                }
                if tick == 2 || tick == 3 {
                    // The loop computes the next date after the handler returns; read it then.
                    loop.perform {
                        let k = (timer.fireDate - first) / interval
                        trace.log("  next fire date set after tick \(tick): first + \(Int(k.rounded())) × 20 ms")
                    }
                }
                if tick == 5 { timer.invalidate() }
            }
            loop.add(timer, forMode: .default)
            loop.run(mode: .default, for: .seconds(2))
            return trace
        }
        Out.subheading("(a) a 20 ms timer and a 75 ms task (thread 'timer-busy')")
        trace.printEvents()
        Out.conclusion(
            "tick 3 (due at first + 40 ms) fired once, late, when the task ended; the grid points "
                + "first + 60 and + 80 ms, missed meanwhile, were skipped (not fired in a burst), and the "
                + "timer went on at first + 100 ms: the phase was kept")
    }

    /// (b) A weak-target timer freed with its owner.
    private func weakTarget() {
        final class Owner: Sendable {
            let timer = Mutex<RunLoopTimer?>(nil)
            let trace: TourLog
            init(trace: TourLog) { self.trace = trace }
            func tick() { trace.log("owner.tick()") }
            deinit { trace.log("Owner deinit ran (the timer did not keep it alive)") }
        }
        let trace = LoopThread.run(name: "timer-weak") { loop -> TourLog in
            let trace = TourLog()
            weak var weakTimer: RunLoopTimer?
            do {
                let owner = Owner(trace: trace)
                let timer = loop.schedule(after: .milliseconds(10), repeating: .milliseconds(10), target: owner) {
                    owner, timer in
                    owner.tick()
                }
                owner.timer.locked { $0 = timer }  // owner → timer; timer → owner is weak
                weakTimer = timer
                trace.log("owner keeps a 10 ms timer scheduled for target: owner")
                loop.run(mode: .default, for: .milliseconds(25))
                trace.log("the owner's last reference is dropped")
            }
            trace.log("timer still scheduled: valid = \(weakTimer?.isValid ?? false)")
            let result = loop.run(mode: .default, for: .seconds(1))
            trace.log(
                "at its next fire the timer found its target gone: valid = \(weakTimer?.isValid ?? false), "
                    + "the run returned .\(result) (mode empty), timer freed = \(weakTimer == nil)")
            return trace
        }
        Out.subheading("(b) a timer whose target is its owner (thread 'timer-weak')")
        trace.printEvents()
        Out.conclusion(
            "no retain cycle: the owner was freed with a timer still scheduled, and the timer "
                + "invalidated itself instead of calling a dead target")
    }

    /// (c) A delayed perform held back during `.tracking`.
    private func delayedPerform() {
        let trace = LoopThread.run(name: "timer-image") { loop -> TourLog in
            let trace = TourLog()
            loop.add(RunLoopSource {}, forMode: .tracking)  // the scroll view's events
            let request = loop.perform(after: .milliseconds(10), inModes: [.default]) {
                trace.log("imageView.image = image  (in mode \(loop.currentMode!.rawValue))")
            }
            trace.log("perform(after: .milliseconds(10), inModes: [.default]) { set the image }")
            trace.log("finger down: run(mode: .tracking, for: .milliseconds(100))")
            loop.run(mode: .tracking, for: .milliseconds(100))
            trace.log("finger up: the image is still pending = \(request.isPending), although it was due at 10 ms")
            let result = loop.run(mode: .default, for: .seconds(1))
            trace.log("back in .default: the run returned .\(result)")
            return trace
        }
        Out.subheading("(c) the image-loading trick (thread 'timer-image')")
        trace.printEvents()
        Out.conclusion("the work for .default waited out the scrolling and ran at once when it ended")
    }
}
