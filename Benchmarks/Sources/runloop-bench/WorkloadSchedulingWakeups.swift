import CBenchSupport
import CoreFoundation
import Foundation
import RunLoopKit
import RunLoopScheduling

import class RunLoopKit.RunLoop

/// 16. Wakeups of a loop that has RunLoopScheduling's objects with nothing to do: an empty idle
/// queue, a paused display link, a coalescer and a release pool with nothing pending.
struct SchedulingWakeupsWorkload: Workload {
    var windowNs: UInt64 = 2_000_000_000

    var name: String { "schedwake" }
    var title: String { "Wakeups with nothing to schedule" }
    var summary: String {
        "RunLoopKit: a loop with an empty IdleTaskQueue, a paused 60 Hz DisplayLink, a CommitCoalescer and an IterationPool with nothing pending (and one timer 10 s away, as in the idle workload). CFRunLoop: DWURunLoopWorkDistribution with an empty task list (its beforeWaiting observer and 0.1 s keep-alive timer). Wakeups: the loop thread's context switches over \(windowNs / 1_000_000_000) s minus a blocked control thread's."
    }
    var metrics: [Metric] { [Metric("wakeups", "wakeups in 2 s", .count, .lowerIsBetter)] }
    var implementations: [Impl] { [.runLoopKit, .cf] }

    func runRunLoopKit() -> Measurement {
        let host = RunLoopKitHost()
        defer { host.shutdown() }
        let loop = host.loop
        let timer = RunLoopTimer(after: .seconds(10)) { _ in }
        let (tid, objects) = host.sync { () -> (Int32, (IdleTaskQueue, DisplayLink, CommitCoalescer, IterationPool)) in
            loop.add(timer, forMode: .default)
            let link = DisplayLink(loop: loop) { _ in }
            link.isPaused = true
            let objects = (IdleTaskQueue(loop: loop), link, CommitCoalescer(loop: loop), IterationPool(loop: loop))
            return (cbench_gettid(), objects)
        }
        defer {
            timer.invalidate()
            objects.0.invalidate()
            objects.1.invalidate()
            objects.2.invalidate()
            objects.3.invalidate()
        }
        return ["wakeups": Double(wakeups(ofThread: tid, overNanoseconds: windowNs))]
    }

    func runCF() -> Measurement {
        let host = CFHost()
        defer { host.shutdown() }
        let parts = host.sync { () -> (Int32, Unchecked<(CFRunLoopTimer?, CFRunLoopObserver?)>) in
            let loop = CFRunLoopGetCurrent()
            let keepAlive = CFRunLoopTimerCreateWithHandler(nil, cfNow() + 0.1, 0.1, 0, 0) { _ in }
            let tasks = Box<[() -> Bool]>([])
            let observer = CFRunLoopObserverCreateWithHandler(
                nil, CFRunLoopActivity.beforeWaiting.rawValue, true, Int.max - 999
            ) { _, _ in
                while let task = tasks.value.first {
                    tasks.value.removeFirst()
                    if task() { break }
                }
            }
            CFRunLoopAddTimer(loop, keepAlive, kCFRunLoopDefaultMode)
            CFRunLoopAddObserver(loop, observer, kCFRunLoopDefaultMode)
            return (cbench_gettid(), Unchecked((keepAlive, observer)))
        }
        defer {
            CFRunLoopTimerInvalidate(parts.1.value.0)
            CFRunLoopObserverInvalidate(parts.1.value.1)
        }
        return ["wakeups": Double(wakeups(ofThread: parts.0, overNanoseconds: windowNs))]
    }

    func targets(_ r: WorkloadResults) -> [TargetCheck] {
        guard let mine = r.stats[.runLoopKit]?["wakeups"] else {
            return [TargetCheck(target: "0 wakeups with nothing to schedule", met: false, measured: "no figure")]
        }
        return [
            TargetCheck(
                target: "0 wakeups with nothing to schedule", met: mine.max <= 0,
                measured: String(format: "median %.0f, max %.0f", mine.median, mine.max))
        ]
    }

    func notes(_ r: WorkloadResults) -> [String] {
        ["CFRunLoop's column is DWURunLoopWorkDistribution's keep-alive timer, which wakes its loop 10 times a second whether or not tasks wait."]
    }
}
