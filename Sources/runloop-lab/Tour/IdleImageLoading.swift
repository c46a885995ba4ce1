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
        "images" that take 3 ms each to decode (a busy loop) are loaded three times, on fresh \
        threads: all in one callback, as a table view that decodes in cellForRow does; then the \
        seeds' ZXYRunloop, its rules as written (a beforeWaiting observer in .default at order \
        Int.max - 999 runs one task per pass, an empty 0.001 s repeating timer keeps the loop \
        turning, the 21st task drops the oldest); then one task per image on RunLoopKit's \
        IdleTaskQueue (budget 4 ms), which runs them at beforeWaiting only when the loop would \
        otherwise sleep, starts a task only if one fits before the next frame is due, and needs no \
        keep-alive timer. ZXYRunloop's cap of 20 is meant for the visible cells: 80 of the 100 \
        images are dropped, by design.
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
        /// Images decoded (ZXYRunloop drops all but the 20 newest).
        let loadedCount: Int
        /// Fires of ZXYRunloop's 0.001 s keep-alive timer (nil for the other ways).
        let keepAliveFires: Int?
        let firstLoaded: Duration
        let lastLoaded: Duration
        /// The most images decoded between two frame fires.
        let mostBetweenFrames: Int
    }

    func run() {
        let burst = Self.load(name: "load-at-once", way: .atOnce)
        Self.show("all 100 images decoded in one timer callback", burst)
        let zxy = Self.load(name: "zxy-runloop", way: .zxyRunloop)
        Self.show("the seeds' ZXYRunloop: one task per pass, a 0.001 s keep-alive timer, 20 tasks at most", zxy)
        let idle = Self.load(name: "load-when-idle", way: .idleTaskQueue)
        Self.show("one IdleTaskQueue task per image (budget 4 ms)", idle)
        let burstDropped = burst.ticks.reduce(0) { $0 + $1.dropped }
        let idleDropped = idle.ticks.reduce(0) { $0 + $1.dropped }
        Out.subheading(
            "summary: \(burstDropped) frames dropped and a frame \(TourLog.ms(Self.worst(burst))) late at once; "
                + "ZXYRunloop \(zxy.ticks.reduce(0) { $0 + $1.dropped }) dropped, at most \(TourLog.ms(Self.worst(zxy))) late, "
                + "\(zxy.loadedCount) of \(Self.images) loaded, \(zxy.keepAliveFires ?? 0) keep-alive wakeups; "
                + "IdleTaskQueue \(idleDropped) dropped and at most \(TourLog.ms(Self.worst(idle))) late, "
                + "\(idle.loadedCount) of \(Self.images) loaded "
                + "(bound: one task, \(TourLog.ms(Self.decodeTime)))")
    }

    /// How the images are loaded.
    enum Way: Sendable { case atOnce, zxyRunloop, idleTaskQueue }

    static func load(name: String, way: Way) -> Outcome {
        LoopThread.run(name: name) { loop in
            let trace = TourLog()
            let ticks = Mutex<[Tick]>([])
            let previous = Mutex<ContinuousClock.Instant?>(nil)
            let frames = RunLoopTimer(after: frame, repeating: frame) { timer in
                let due = timer.fireDate
                let late = ContinuousClock.now - due
                let dropped = previous.locked { last in
                    defer { last = due }
                    guard let last else { return 0 }
                    return Int((due - last) / frame) - 1
                }
                ticks.locked { $0.append(Tick(at: trace.elapsed, late: late, dropped: dropped)) }
            }
            loop.add(frames, forMode: .common)

            let loaded = Mutex<[Duration]>([])
            let queue = IdleTaskQueue(loop: loop, budget: .milliseconds(4))
            let zxy = way == .zxyRunloop ? ZXYRunloop(loop: loop) : nil
            let start = RunLoopTimer(after: startAt) { _ in
                for image in 0..<images {
                    switch way {
                    case .idleTaskQueue:
                        queue.enqueue(key: image) { _ in
                            decodeImage()
                            loaded.locked { $0.append(trace.elapsed) }
                            return .done
                        }
                    case .zxyRunloop:
                        zxy?.addTask {
                            decodeImage()
                            loaded.locked { $0.append(trace.elapsed) }
                            return true
                        }
                    case .atOnce:
                        decodeImage()
                        loaded.locked { $0.append(trace.elapsed) }
                    }
                }
            }
            loop.add(start, forMode: .default)
            loop.run(mode: .default, for: runFor)
            frames.invalidate()
            queue.invalidate()
            zxy?.invalidate()
            let times = loaded.locked { $0 }
            let fired = ticks.locked { $0 }
            var most = 0
            for (index, tick) in fired.enumerated() {
                let since = index == 0 ? Duration.zero : fired[index - 1].at
                most = max(most, times.filter { $0 > since && $0 <= tick.at }.count)
            }
            return Outcome(
                ticks: fired, loadedCount: times.count, keepAliveFires: zxy?.keepAliveFires, firstLoaded: times.first ?? .zero, lastLoaded: times.last ?? .zero,
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
                + "lateness p50 \(TourLog.ms(p50)), max \(TourLog.ms(lateness.last ?? .zero))")
        Out.line(
            "\(outcome.loadedCount) of \(images) images loaded"
                + (outcome.keepAliveFires.map { "; the 0.001 s keep-alive timer fired \($0) times" } ?? ""))
        Out.line(
            "images loaded from \(TourLog.ms(outcome.firstLoaded)) to \(TourLog.ms(outcome.lastLoaded)); "
                + "at most \(outcome.mostBetweenFrames) between two frames")
    }
}

/// The seeds' ZXYRunloop (seeds 000/001), its rules as written, on RunLoopKit: tasks in an array
/// (the 21st drops the oldest: `maxQueue = 20`); a `kCFRunLoopBeforeWaiting` observer in
/// `kCFRunLoopDefaultMode` at order `NSIntegerMax - 999` runs tasks until one returns YES, so one
/// image per pass; an empty `NSTimer` every 0.001 s (scheduledTimer: the default mode) keeps the
/// loop turning while tasks wait, and all the time after.
final class ZXYRunloop: Sendable {
    /// The seed's `maxQueue`.
    static let maxQueue = 20
    /// The seed's `RunloopBlock`: returns whether it did its work (YES ends the pass's loop).
    typealias Task = @Sendable () -> Bool

    /// The seed's `tasks` array, shared with the observer's callback.
    private final class Tasks: Sendable {
        let list = Mutex<[Task]>([])
    }

    private let tasks = Tasks()
    private let observer: RunLoopObserver
    private let timer: RunLoopTimer
    private let fires = SharedCounter()

    /// The seed's `init` and `addRunloopObserver`, on `loop`.
    init(loop: RunLoop) {
        let tasks = self.tasks
        observer = RunLoopObserver(activities: .beforeWaiting, order: Int.max - 999) { _, _ in
            // The seed's Callback: run tasks until one says it did its work.
            var result = false
            while !result, let task = tasks.list.locked({ $0.isEmpty ? nil : $0.removeFirst() }) {
                result = task()
            }
        }
        observer.label = "ZXYRunloop's beforeWaiting observer"
        let fires = self.fires
        timer = RunLoopTimer(after: .milliseconds(1), repeating: .milliseconds(1)) { _ in fires.increment() }
        timer.label = "ZXYRunloop's 0.001 s keep-alive timer"
        loop.add(observer, forMode: .default)
        loop.add(timer, forMode: .default)
    }

    /// The seed's `addTask:withId:`: appends, then drops the oldest past ``maxQueue``.
    func addTask(_ task: @escaping Task) {
        tasks.list.locked { tasks in
            tasks.append(task)
            if tasks.count > Self.maxQueue { tasks.removeFirst() }
        }
    }

    /// How often the keep-alive timer has fired (each fire is a wakeup of the loop).
    var keepAliveFires: Int { fires.count }

    /// Removes the observer and the timer.
    func invalidate() {
        observer.invalidate()
        timer.invalidate()
    }
}
