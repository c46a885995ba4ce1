import Foundation
import RunLoopKit

import class RunLoopKit.RunLoop

/// Experiment 1 (seed 002): an all-activities observer logs one run of a loop that a repeating
/// timer wakes up, like the seed's "RunLoop 大哥要处理 Timer 了 ..." log.
struct ObserverLog: Experiment {
    let title = "Observer log of a loop woken by a repeating timer"
    let seed = Seed.cite(2)
    let seedSays = """
        Seed 002 adds a kCFRunLoopAllActivities observer that logs each activity ("RunLoop 大哥要处理 \
        Timer 了", "RunLoop 大哥没事干要睡觉了": about to process timers; nothing to do, going to sleep) \
        and a timer to wake the loop: a 5 s repeating NSTimer on the main thread, a 2 s one-shot on \
        a sub-thread whose loop it runs with [[NSRunLoop currentRunLoop] run]. The 100 ms interval \
        and the 350 ms run are ours, to keep the tour short.
        """
    let summary = """
        A thread adds an all-activities observer and a 100 ms repeating timer (the seed's is 5 s) \
        to its loop and runs it in .default for 350 ms. Each pass announces timers and sources, \
        finds nothing to do and sleeps in epoll_wait; the timerfd wakes it, the timer fires, and \
        it goes round again, until the timeout ends the run.
        """

    /// The interval of the repeating timer.
    static let interval = Duration.milliseconds(100)
    /// How long the loop runs.
    static let runFor = Duration.milliseconds(350)

    func run() {
        let (trace, result) = LoopThread.run(name: "observer-log") { loop in
            let trace = TourLog()
            let fires = SharedCounter()
            let observer = RunLoopObserver(activities: .allActivities) { _, activity in
                trace.log(Self.label(activity))
            }
            let timer = RunLoopTimer(after: Self.interval, repeating: Self.interval) { _ in
                trace.log("    -> timer fired (#\(fires.increment()))")
            }
            observer.label = "activity logger"
            timer.label = "100 ms repeating timer"
            loop.add(observer, forMode: .default)
            loop.add(timer, forMode: .default)
            let result = loop.run(mode: .default, for: Self.runFor)
            trace.log("run(mode: .default, for: \(TourLog.literal(Self.runFor))) returned .\(result)")
            timer.invalidate()
            observer.invalidate()
            return (trace, result)
        }

        Out.subheading("trace (thread 'observer-log')")
        var lastSleep: Duration?
        for event in trace.events {
            var text = event.text
            if text.hasPrefix("beforeWaiting") { lastSleep = event.at }
            if text.hasPrefix("afterWaiting"), let slept = lastSleep {
                text += " (slept \(TourLog.ms(event.at - slept)))"
            }
            Out.line("\(TourLog.ms(event.at, width: 8))  \(text)")
        }

        let texts = trace.events.map(\.text)
        func count(_ prefix: String) -> Int { texts.filter { $0.hasPrefix(prefix) }.count }
        let total = trace.events.last.map { TourLog.ms($0.at) } ?? "?"
        Out.subheading(
            "summary: \(count("beforeTimers")) passes, \(count("beforeWaiting")) sleeps, "
                + "\(count("afterWaiting")) wakeups, \(count("    -> timer fired")) timer fires; "
                + "the run returned .\(result) after \(total)")
    }

    /// The trace line for an activity: CF's name, then what the seed's observer says.
    static func label(_ activity: RunLoop.Activity) -> String {
        switch activity {
        case .entry: "entry          the run starts"
        case .beforeTimers: "beforeTimers   about to process timers"
        case .beforeSources: "beforeSources  about to process sources"
        case .beforeWaiting: "beforeWaiting  nothing to do: going to sleep"
        case .afterWaiting: "afterWaiting   woke up"
        case .exit: "exit           the run ends"
        default: "activity \(activity)"
        }
    }
}
