import Foundation
import RunLoopKit
import RunLoopScheduling
import Synchronization

import class RunLoopKit.RunLoop

/// Experiment 10 (seeds 000, 001): 100 images decoded in one callback drop a scroll's frames;
/// decoded one per idle iteration with `IdleTaskQueue`, none is dropped.
struct IdleImageLoading: Experiment {
    let title = "Loading 100 images while frames run: all at once vs one per idle iteration"
    let seed = Seed.cite(0, 1)
    let seedSays = """
        Seeds 000/001 (ZXYRunloop): "每次Runloop循环就让它从数组里面去一个加载图片等任务出来执行" (each \
        loop iteration takes one image-loading task from the array). ZXYRunloop's rules: a \
        kCFRunLoopBeforeWaiting observer in kCFRunLoopDefaultMode at order NSIntegerMax - 999 runs \
        tasks until one returns YES (one image per pass); an empty repeating NSTimer every 0.001 s \
        keeps the loop turning; maxQueue = 20 drops the oldest task past 20 ("为了保证加载到图片最大数 \
        是20"). DWURunLoopWorkDistribution (a 0.1 s keep-alive timer) is not in the seeds: it is an \
        outside anchor.
        """
    let summary = """
        A 16 ms repeating timer in the common modes stands for the screen's frames. At 50 ms, 100 \
        "images" that take 3 ms each to decode (a busy loop) are loaded twice, on fresh threads: \
        first all in one callback, as a table view that decodes in cellForRow does; then one task \
        per image on an IdleTaskQueue (budget 4 ms), which runs them at beforeWaiting only when \
        the loop would otherwise sleep and starts a task only if one fits before the next frame is due, like the \
        seeds' DWURunLoopWorkDistribution but without its 0.1 s keep-alive timer.
        """

    static let frame = Duration.milliseconds(16)
    static let images = 100
    static let decodeTime = Duration.milliseconds(3)
    static let startAt = Duration.milliseconds(50)
    static let runFor = Duration.milliseconds(600)

    /// One fire of the frame timer.
    struct Tick: Sendable {
        let at: Duration
        let late: Duration
        /// Frame dates skipped since the previous fire.
        let dropped: Int
    }

    /// What one way of loading did to the frames.
    struct Outcome: Sendable {
        let ticks: [Tick]
        let firstLoaded: Duration
        let lastLoaded: Duration
        /// The most images decoded between two frame fires.
        let mostBetweenFrames: Int
    }

    func run() {
        let burst = Self.load(name: "load-at-once", idle: false)
        Self.show("all 100 images decoded in one timer callback", burst)
        let idle = Self.load(name: "load-when-idle", idle: true)
        Self.show("one IdleTaskQueue task per image (budget 4 ms)", idle)
        let burstDropped = burst.ticks.reduce(0) { $0 + $1.dropped }
        let idleDropped = idle.ticks.reduce(0) { $0 + $1.dropped }
        Out.subheading(
            "summary: \(burstDropped) frames dropped and a frame \(Trace.ms(Self.worst(burst))) late at once; "
                + "\(idleDropped) dropped and at most \(Trace.ms(Self.worst(idle))) late when idle "
                + "(bound: one task, \(Trace.ms(Self.decodeTime)))")
    }

    static func load(name: String, idle: Bool) -> Outcome {
        LoopThread.run(name: name) { loop in
            let trace = Trace()
            let ticks = Mutex<[Tick]>([])
            let previous = Mutex<ContinuousClock.Instant?>(nil)
            let frames = RunLoopTimer(after: frame, repeating: frame) { timer in
                let due = timer.fireDate
                let late = ContinuousClock.now - due
                let dropped = previous.withLock { last in
                    defer { last = due }
                    guard let last else { return 0 }
                    return Int((due - last) / frame) - 1
                }
                ticks.withLock { $0.append(Tick(at: trace.elapsed, late: late, dropped: dropped)) }
            }
            loop.add(frames, forMode: .common)

            let loaded = Mutex<[Duration]>([])
            let queue = IdleTaskQueue(loop: loop, budget: .milliseconds(4))
            let start = RunLoopTimer(after: startAt) { _ in
                for image in 0..<images {
                    if idle {
                        queue.enqueue(key: image) { _ in
                            decodeImage()
                            loaded.withLock { $0.append(trace.elapsed) }
                            return .done
                        }
                    } else {
                        decodeImage()
                        loaded.withLock { $0.append(trace.elapsed) }
                    }
                }
            }
            loop.add(start, forMode: .default)
            loop.run(mode: .default, for: runFor)
            frames.invalidate()
            queue.invalidate()
            let times = loaded.withLock { $0 }
            let fired = ticks.withLock { $0 }
            var most = 0
            for (index, tick) in fired.enumerated() {
                let since = index == 0 ? Duration.zero : fired[index - 1].at
                most = max(most, times.filter { $0 > since && $0 <= tick.at }.count)
            }
            return Outcome(
                ticks: fired, firstLoaded: times.first ?? .zero, lastLoaded: times.last ?? .zero,
                mostBetweenFrames: most)
        }
    }

    /// A 3 ms decode: the thread is busy, as a real decode keeps it.
    static func decodeImage() {
        let end = ContinuousClock.now + decodeTime
        while ContinuousClock.now < end {}
    }

    static func worst(_ outcome: Outcome) -> Duration { outcome.ticks.map(\.late).max() ?? .zero }

    static func show(_ title: String, _ outcome: Outcome) {
        Out.subheading(title)
        let ticks = outcome.ticks
        var strip = ""
        for tick in ticks {
            strip += String(repeating: "x", count: tick.dropped)
            strip += tick.late >= .milliseconds(4) ? "L" : "."
        }
        Out.line("frames (. on time, L late by 4 ms or more, x dropped):")
        Out.paragraph(strip, indent: 6)
        let lateness = ticks.map(\.late).sorted()
        let p50 = lateness.isEmpty ? .zero : lateness[lateness.count / 2]
        Out.line(
            "\(ticks.count) frames fired, \(ticks.reduce(0) { $0 + $1.dropped }) dropped, "
                + "\(ticks.filter { $0.late >= .milliseconds(4) }.count) late by 4 ms or more; "
                + "lateness p50 \(Trace.ms(p50)), max \(Trace.ms(lateness.last ?? .zero))")
        Out.line(
            "images loaded from \(Trace.ms(outcome.firstLoaded)) to \(Trace.ms(outcome.lastLoaded)); "
                + "at most \(outcome.mostBetweenFrames) between two frames")
    }
}
