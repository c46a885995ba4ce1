import CBenchSupport
import CoreFoundation
import Foundation
import NIOCore
import NIOPosix
import RunLoopKit
import RunLoopScheduling

import class RunLoopKit.RunLoop

/// 15. Frame lateness while 1,000 tasks of 2 ms drain: `IdleTaskQueue` against draining them in
/// one callback, against the seeds' ZXYRunloop (seeds 000/001: one task per pass at
/// beforeWaiting, a 0.001 s keep-alive timer, at most 20 tasks kept) and against
/// DWURunLoopWorkDistribution (an outside anchor: one task per pass, a 0.1 s keep-alive timer), on
/// RunLoopKit and CFRunLoop; NIO runs them as `execute` blocks.
struct IdleFeedWorkload: Workload {
    var tasks = 1_000
    var taskNs: UInt64 = 2_000_000
    var frameNs: Int64 = 16_000_000
    var startNs: Int64 = 50_000_000
    /// How long the DWU variant runs (it drains about 70 tasks a second: not all 1,000).
    var dwuWindowNs: Int64 = 1_500_000_000
    var budget: Duration = .milliseconds(4)
    /// ZXYRunloop's `maxQueue`: adding a task beyond it removes the oldest (seeds 000/001).
    var zxyCap = 20

    var name: String { "idlefeed" }
    var title: String { "Frame lateness while 1,000 × 2 ms tasks drain" }
    var summary: String {
        "A 16 ms repeating frame timer runs; 50 ms in, \(tasks.formatted()) tasks of 2 ms (busy) are handed to the loop: to an IdleTaskQueue (budget \(Int(nanoseconds(budget) / 1e6)) ms; RunLoopKit), all in one timer callback (callback; NIO: one execute block per task, its only way), the seeds' ZXYRunloop's way (zxy, seeds 000/001: a beforeWaiting observer at NSIntegerMax-999 in the default mode runs one task per pass, an empty 0.001 s repeating timer keeps the loop turning, and the task array keeps the \(zxyCap) newest: adding beyond maxQueue removes the oldest), or DWURunLoopWorkDistribution's way (an outside anchor, not a seed (dwu: a beforeWaiting observer at NSIntegerMax-999 runs one task per pass, a 0.1 s no-op timer keeps the loop awake; \(dwuWindowNs / 1_000_000) ms window). Lateness of each frame date k·16 ms: the time until the first fire at or after it (a frame dropped in a stall counts as late until the fire that ends the stall); measured until all tasks are done plus 100 ms. Dropped: frame dates with no fire of their own."
    }
    var metrics: [Metric] {
        [
            Metric("idle_p50", "IdleTaskQueue: lateness p50", .microseconds, .lowerIsBetter),
            Metric("idle_p99", "IdleTaskQueue: lateness p99", .microseconds, .lowerIsBetter),
            Metric("idle_max", "IdleTaskQueue: lateness max", .microseconds, .lowerIsBetter),
            Metric("idle_dropped", "IdleTaskQueue: frames dropped", .count, .lowerIsBetter),
            Metric("idle_drain", "IdleTaskQueue: time to drain all", .seconds, .lowerIsBetter),
            Metric("callback_p99", "one callback: lateness p99", .microseconds, .lowerIsBetter),
            Metric("callback_dropped", "one callback: frames dropped", .count, .lowerIsBetter),
            Metric("zxy_p99", "ZXYRunloop: lateness p99", .microseconds, .lowerIsBetter),
            Metric("zxy_dropped", "ZXYRunloop: frames dropped", .count, .lowerIsBetter),
            Metric("zxy_done", "ZXYRunloop: tasks run (of 1,000)", .count, .higherIsBetter),
            Metric("zxy_ticks_per_s", "ZXYRunloop: keep-alive fires per second", .perSecond, .lowerIsBetter),
            Metric("dwu_p99", "DWU: lateness p99", .microseconds, .lowerIsBetter),
            Metric("dwu_dropped", "DWU: frames dropped", .count, .lowerIsBetter),
            Metric("dwu_tasks_per_s", "DWU: tasks drained per second", .perSecond, .higherIsBetter),
        ]
    }

    /// What one variant recorded. Touched only on the loop's thread while it runs, read after
    /// the thread is joined (or, for NIO, after a semaphore the loop signals last).
    private final class Log: @unchecked Sendable {
        var fires: [Int64] = []
        var done = 0
        var doneAt: Int64 = 0
        /// Keep-alive timer fires (ZXYRunloop).
        var ticks = 0
        let start = Int64(cbench_now_ns())
        init() { fires.reserveCapacity(4096) }
        @inline(__always) func now() -> Int64 { Int64(cbench_now_ns()) - start }
    }

    private func work() {
        let end = cbench_now_ns() + taskNs
        while cbench_now_ns() < end {}
    }

    /// Lateness of each frame date up to the last fire, in µs (see ``summary``), and the drop
    /// count. A fire up to 1 ms before a date serves it (the implementations' clocks and the
    /// log's differ by microseconds).
    private func figures(_ log: Log, prefix: String) -> Measurement {
        guard let last = log.fires.last else { return [:] }
        var late: [Double] = []
        var next = 0
        var point = frameNs
        while point <= last {
            while next < log.fires.count && log.fires[next] < point - 1_000_000 { next += 1 }
            late.append(Double(max(0, log.fires[next] - point)) / 1e3)
            point += frameNs
        }
        late.sort()
        var figures: Measurement = [
            prefix + "_p50": percentile(late, 50), prefix + "_p99": percentile(late, 99), prefix + "_max": late.last ?? .nan,
            prefix + "_dropped": Double(max(0, late.count - log.fires.count)),
        ]
        if prefix == "dwu" { figures["dwu_tasks_per_s"] = Double(log.done) / (Double(dwuWindowNs - startNs) / 1e9) }
        if prefix == "idle" { figures["idle_drain"] = Double(log.doneAt - startNs) / 1e9 }
        if prefix == "zxy" {
            figures["zxy_done"] = Double(log.done)
            figures["zxy_ticks_per_s"] = Double(log.ticks) / (Double(last) / 1e9)
        }
        return figures
    }

    private enum Way { case idle, callback, zxy, dwu }

    private func runLoopKit(_ way: Way) -> Log {
        let (tasks, frameNs, startNs, dwuWindowNs, budget, zxyCap) = (tasks, frameNs, startNs, dwuWindowNs, budget, zxyCap)
        let work = self.work
        return BenchThread.run {
            let loop = RunLoop.current
            let log = Log()
            let frame = RunLoopTimer(after: .nanoseconds(frameNs), repeating: .nanoseconds(frameNs)) { _ in
                log.fires.append(log.now())
            }
            loop.add(frame, forMode: .default)
            @Sendable func finished() {
                log.doneAt = log.now()
                loop.add(RunLoopTimer(after: .milliseconds(100)) { _ in RunLoop.current.stop() }, forMode: .default)
            }
            let queue = way == .idle ? IdleTaskQueue(loop: loop, budget: budget, capacity: tasks) : nil
            let pending = Box(tasks)
            let kick = RunLoopTimer(after: .nanoseconds(startNs)) { _ in
                switch way {
                case .idle:
                    for _ in 0..<tasks {
                        queue!.enqueue { _ in
                            work()
                            log.done += 1
                            if log.done == tasks { finished() }
                            return .done
                        }
                    }
                case .callback:
                    for _ in 0..<tasks { work() }
                    log.done = tasks
                    finished()
                case .zxy:
                    // addTask: beyond maxQueue, removeObjectAtIndex:0 (the oldest) each time.
                    pending.value = min(tasks, zxyCap)
                case .dwu: break
                }
            }
            loop.add(kick, forMode: .default)
            var extras: [RunLoopTimer] = []
            var observer: RunLoopObserver?
            if way == .zxy {
                pending.value = 0
                extras.append(RunLoopTimer(after: .milliseconds(1), repeating: .milliseconds(1)) { _ in log.ticks += 1 })
                observer = RunLoopObserver(activities: .beforeWaiting, order: Int.max - 999) { _, _ in
                    guard pending.value > 0 else { return }
                    pending.value -= 1
                    work()
                    log.done += 1
                    if pending.value == 0 { finished() }
                }
                loop.add(observer!, forMode: .default)
                for timer in extras { loop.add(timer, forMode: .default) }
            }
            if way == .dwu {
                let started = Box(false)
                extras.append(RunLoopTimer(after: .nanoseconds(startNs)) { _ in started.value = true })
                extras.append(RunLoopTimer(after: .milliseconds(100), repeating: .milliseconds(100)) { _ in })
                extras.append(RunLoopTimer(after: .nanoseconds(dwuWindowNs)) { _ in RunLoop.current.stop() })
                observer = RunLoopObserver(activities: .beforeWaiting, order: Int.max - 999) { _, _ in
                    guard started.value, pending.value > 0 else { return }
                    pending.value -= 1
                    work()
                    log.done += 1
                }
                loop.add(observer!, forMode: .default)
                for timer in extras { loop.add(timer, forMode: .default) }
            }
            loop.run(mode: .default, for: .seconds(60))
            frame.invalidate()
            queue?.invalidate()
            observer?.invalidate()
            for timer in extras { timer.invalidate() }
            return log
        }
    }

    func runRunLoopKit() -> Measurement {
        var figures = figures(runLoopKit(.idle), prefix: "idle")
        figures.merge(self.figures(runLoopKit(.callback), prefix: "callback")) { $1 }
        figures.merge(self.figures(runLoopKit(.zxy), prefix: "zxy")) { $1 }
        figures.merge(self.figures(runLoopKit(.dwu), prefix: "dwu")) { $1 }
        return figures
    }

    private func cf(_ way: Way) -> Log {
        let (tasks, frameNs, startNs, dwuWindowNs, zxyCap) = (tasks, frameNs, startNs, dwuWindowNs, zxyCap)
        let work = self.work
        return BenchThread.run {
            let loop = CFRunLoopGetCurrent()!
            let mode = kCFRunLoopDefaultMode!
            let log = Log()
            let frameS = Double(frameNs) / 1e9
            let frame = CFRunLoopTimerCreateWithHandler(nil, cfNow() + frameS, frameS, 0, 0) { _ in
                log.fires.append(log.now())
            }
            CFRunLoopAddTimer(loop, frame, mode)
            var timers: [CFRunLoopTimer?] = [frame]
            func once(after ns: Int64, _ body: @escaping (CFRunLoopTimer?) -> Void) {
                let timer = CFRunLoopTimerCreateWithHandler(nil, cfNow() + Double(ns) / 1e9, 0, 0, 0, body)
                CFRunLoopAddTimer(CFRunLoopGetCurrent(), timer, mode)
                timers.append(timer)
            }
            if way == .callback {
                once(after: startNs) { _ in
                    for _ in 0..<tasks { work() }
                    log.done = tasks
                    log.doneAt = log.now()
                    let stop = CFRunLoopTimerCreateWithHandler(nil, cfNow() + 0.1, 0, 0, 0) { _ in
                        CFRunLoopStop(CFRunLoopGetCurrent())
                    }
                    CFRunLoopAddTimer(CFRunLoopGetCurrent(), stop, mode)
                }
            }
            var observer: CFRunLoopObserver?
            if way == .zxy {
                let pending = Box(0)
                once(after: startNs) { _ in pending.value = min(tasks, zxyCap) }
                let keepAlive = CFRunLoopTimerCreateWithHandler(nil, cfNow() + 0.001, 0.001, 0, 0) { _ in log.ticks += 1 }
                CFRunLoopAddTimer(loop, keepAlive, mode)
                timers.append(keepAlive)
                observer = CFRunLoopObserverCreateWithHandler(
                    nil, CFRunLoopActivity.beforeWaiting.rawValue, true, Int.max - 999
                ) { _, _ in
                    guard pending.value > 0 else { return }
                    pending.value -= 1
                    work()
                    log.done += 1
                    guard pending.value == 0 else { return }
                    log.doneAt = log.now()
                    let stop = CFRunLoopTimerCreateWithHandler(nil, cfNow() + 0.1, 0, 0, 0) { _ in
                        CFRunLoopStop(CFRunLoopGetCurrent())
                    }
                    CFRunLoopAddTimer(CFRunLoopGetCurrent(), stop, mode)
                }
                CFRunLoopAddObserver(loop, observer, mode)
            }
            if way == .dwu {
                let started = Box(false)
                let pending = Box(tasks)
                once(after: startNs) { _ in started.value = true }
                once(after: dwuWindowNs) { _ in CFRunLoopStop(CFRunLoopGetCurrent()) }
                let keepAlive = CFRunLoopTimerCreateWithHandler(nil, cfNow() + 0.1, 0.1, 0, 0) { _ in }
                CFRunLoopAddTimer(loop, keepAlive, mode)
                timers.append(keepAlive)
                observer = CFRunLoopObserverCreateWithHandler(
                    nil, CFRunLoopActivity.beforeWaiting.rawValue, true, Int.max - 999
                ) { _, _ in
                    guard started.value, pending.value > 0 else { return }
                    pending.value -= 1
                    work()
                    log.done += 1
                }
                CFRunLoopAddObserver(loop, observer, mode)
            }
            CFRunLoopRunInMode(mode, 60, false)
            for timer in timers { CFRunLoopTimerInvalidate(timer) }
            if let observer { CFRunLoopObserverInvalidate(observer) }
            return log
        }
    }

    func runCF() -> Measurement {
        var figures = figures(cf(.callback), prefix: "callback")
        figures.merge(self.figures(cf(.zxy), prefix: "zxy")) { $1 }
        figures.merge(self.figures(cf(.dwu), prefix: "dwu")) { $1 }
        return figures
    }

    /// NIO has no idle priority: the tasks are `execute` blocks, which NIO runs in one batch
    /// before it looks at its timers again. The frame timer is a task rescheduled on the 16 ms
    /// grid, skipping missed dates.
    func runNIO() -> Measurement {
        let host = NIOHost()
        defer { host.shutdown() }
        let loop = host.loop
        let (tasks, frameNs, startNs) = (tasks, frameNs, startNs)
        let work = self.work
        let log = Log()
        let finished = DispatchSemaphore(value: 0)
        let stopped = Box(false)
        host.sync {
            @Sendable func schedule(_ k: Int64) {
                loop.scheduleTask(deadline: .uptimeNanoseconds(UInt64(log.start + k * frameNs))) {
                    guard !stopped.value else { return }
                    let now = log.now()
                    log.fires.append(now)
                    schedule(max(k + 1, now / frameNs + 1))
                }
            }
            schedule(1)
            loop.scheduleTask(deadline: .uptimeNanoseconds(UInt64(log.start + startNs))) {
                for _ in 0..<tasks {
                    loop.execute {
                        work()
                        log.done += 1
                        guard log.done == tasks else { return }
                        log.doneAt = log.now()
                        loop.scheduleTask(in: .milliseconds(100)) {
                            stopped.value = true
                            finished.signal()
                        }
                    }
                }
            }
        }
        finished.wait()
        return figures(log, prefix: "callback")
    }

    func targets(_ r: WorkloadResults) -> [TargetCheck] {
        guard let p99 = r.stats[.runLoopKit]?["idle_p99"] else {
            return [TargetCheck(target: "IdleTaskQueue p99 ≤ budget + one task", met: false, measured: "no figure")]
        }
        let bound = nanoseconds(budget) / 1e3 + Double(taskNs) / 1e3
        return [
            TargetCheck(
                target: "IdleTaskQueue frame lateness p99 ≤ budget + one task (\(Int(bound / 1e3)) ms)",
                met: p99.max <= bound,
                measured: String(format: "median %.2f ms, max of reps %.2f ms", p99.median / 1e3, p99.max / 1e3)),
            TargetCheck(
                target: "IdleTaskQueue drops no frame", met: (r.stats[.runLoopKit]?["idle_dropped"]?.max ?? 1) == 0,
                measured: String(format: "max %.0f", r.stats[.runLoopKit]?["idle_dropped"]?.max ?? .nan)),
        ]
    }

    func notes(_ r: WorkloadResults) -> [String] {
        [
            "IdleTaskQueue is RunLoopKit's only; CFRunLoop runs the callback and DWU variants; NIO's row is 1,000 execute blocks under callback (it has no idle priority). An idle period ends when the next frame is due and starts another task only if one of the average length fits before it, so a frame waits at most for the one task in progress, and usually for none.",
            "ZXYRunloop is the seeds' baseline (seeds 000/001), run by its rules as written: its keep-alive timer wakes the loop about a thousand times a second whether or not there is work, and its 20-task cap keeps only the 20 newest of the 1,000 tasks handed in at once (it is meant for the visible cells: the others are dropped, not deferred), so it runs 20 and is done. A frame waits at most for the one 2 ms task of the pass.",
            "DWURunLoopWorkDistribution is an outside anchor, not a seed. DWU runs one task per pass: it drains about 60 + 10 tasks a second (the frame timer's and its keep-alive timer's wakeups), 1,000 tasks in about 14 s; its window stops it before that.",
        ]
    }
}
