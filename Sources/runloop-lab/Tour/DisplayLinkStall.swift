import Foundation
import RunLoopKit
import RunLoopScheduling
import Synchronization

import class RunLoopKit.RunLoop

/// Experiment 13 (seeds 003, 004): a 60 Hz display link with an FPS counter; a 100 ms stall shows
/// as dropped frames, counted by the kernel's timerfd, in the frame after it and in the monitor's
/// window; a paused link does not wake the loop.
struct DisplayLinkStall: Experiment {
    let title = "A display link, an FPS counter and a 100 ms stall"
    let seed = Seed.cite(3, 4)
    let seedSays = """
        Seed 003: "CADisplayLink 是一个和屏幕刷新率一致的定时器,如果在两次屏幕刷新之间执行了一个长任务, \
        那其中就会有一帧被跳过去" (a display link is a timer in step with the screen; a long task \
        between two refreshes makes a frame be skipped). Seed 004 shows CADisplayLink's use. The FPS \
        counters YYFPSLabel and Matrix are outside anchors, named in no seed.
        """
    let summary = """
        CADisplayLink is a timer in step with the screen: a frame that takes too long makes the \
        next ones be skipped (seed 003), which FPS counters such as YYFPSLabel and Matrix (outside anchors, not seeds) count. \
        Here a DisplayLink at 60 Hz (an absolute timerfd: no drift) drives a FrameRateMonitor with \
        250 ms windows. At 400 ms a timer callback stalls the loop for 100 ms; the next frame \
        reports the frames the timerfd expired meanwhile, and the window's FPS drops. Then the \
        link is paused for 200 ms: it is disarmed, and the loop sleeps without a wakeup.
        """

    static let stallAt = Duration.milliseconds(400)
    static let stall = Duration.milliseconds(100)
    static let runFor = Duration.milliseconds(1_000)
    static let pauseFor = Duration.milliseconds(200)

    func run() {
        let (trace, reports, frames, wakeups) = LoopThread.run(name: "display") {
            loop -> (TourLog, [FrameRateMonitor.Report], Int, Int) in
            let trace = TourLog()
            let count = SharedCounter()
            let link = DisplayLink(loop: loop, framesPerSecond: 60) { frame in
                count.increment()
                if frame.droppedFrames > 0 {
                    let late = ContinuousClock.now - frame.timestamp
                    trace.log(
                        "    frame #\(frame.sequence): \(frame.droppedFrames) frames dropped before it "
                            + "(handled \(TourLog.ms(late)) after its timestamp)")
                }
            }
            let reports = Mutex<[FrameRateMonitor.Report]>([])
            let monitor = FrameRateMonitor(link: link, window: .milliseconds(250), label: "lab") { report in
                reports.locked { $0.append(report) }
                trace.log(
                    "    FrameRateMonitor: \(String(format: "%.1f", report.framesPerSecond)) fps over "
                        + "\(TourLog.ms(report.window)), \(report.frames) frames, \(report.droppedFrames) dropped, buckets "
                        + Self.buckets(report))
            }
            let stall = RunLoopTimer(after: Self.stallAt) { _ in
                trace.log("    -> timer: layoutAllCells() busy for \(TourLog.ms(Self.stall))")
                let end = ContinuousClock.now + Self.stall
                while ContinuousClock.now < end {}
            }
            loop.add(stall, forMode: .default)
            trace.log("DisplayLink(framesPerSecond: 60) added; run(mode: .default, for: \(TourLog.literal(Self.runFor)))")
            loop.run(mode: .default, for: Self.runFor)
            let frames = count.count

            link.isPaused = true
            let wakeups = SharedCounter()
            let observer = RunLoopObserver(activities: .afterWaiting) { _, _ in wakeups.increment() }
            loop.add(observer, forMode: .default)
            trace.log("link.isPaused = true; run(mode: .default, for: \(TourLog.literal(Self.pauseFor)))")
            loop.run(mode: .default, for: Self.pauseFor)
            // The run's own timeout is one wakeup.
            trace.log("paused: \(count.count - frames) frames, \(wakeups.count - 1) wakeups besides the run's timeout")
            observer.invalidate()
            link.invalidate()
            withExtendedLifetime(monitor) {}
            return (trace, reports.locked { $0 }, frames, wakeups.count - 1)
        }
        Out.subheading("trace (thread 'display')")
        trace.printEvents()
        let dropped = reports.reduce(0) { $0 + $1.droppedFrames }
        Out.subheading(
            "summary: \(frames) frames in \(TourLog.ms(Self.runFor)) (60 Hz would be 60), \(dropped) dropped in the "
                + "monitor's windows; \(wakeups) wakeups while paused")
    }

    /// The non-empty buckets of a report, in bucket order.
    static func buckets(_ report: FrameRateMonitor.Report) -> String {
        let parts = FrameRateMonitor.Bucket.allCases.compactMap { bucket in
            report.buckets[bucket].map { "\(bucket.rawValue) \($0)" }
        }
        return "{" + parts.joined(separator: ", ") + "}"
    }
}
