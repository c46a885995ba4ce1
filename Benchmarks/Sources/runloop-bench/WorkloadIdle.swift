import CBenchSupport
import CoreFoundation
import Foundation
import NIOCore
import NIOPosix
import RunLoopKit

import class RunLoopKit.RunLoop

/// 7. Idle: kernel wakeups of a loop thread with one timer 10 s away.
struct IdleWorkload: Workload {
    var windowNs: UInt64 = 2_000_000_000

    var name: String { "idle" }
    var title: String { "Idle wakeups" }
    var summary: String {
        "A loop with one timer 10 s away, measured for \(windowNs / 1_000_000_000) s after it settled (100 ms): context switches of the loop thread (voluntary + nonvoluntary, /proc/self/task/TID/status) minus those of a control thread blocked in sem_wait over the same window."
    }
    var metrics: [Metric] { [Metric("wakeups", "wakeups in 2 s", .count, .lowerIsBetter)] }

    private func measure(tid: Int32) -> Measurement {
        ["wakeups": Double(wakeups(ofThread: tid, overNanoseconds: windowNs))]
    }

    func runRunLoopKit() -> Measurement {
        let host = RunLoopKitHost()
        defer { host.shutdown() }
        let timer = RunLoopTimer(after: .seconds(10)) { _ in }
        let tid = host.sync {
            RunLoop.current.add(timer, forMode: .default)
            return cbench_gettid()
        }
        defer { timer.invalidate() }
        return measure(tid: tid)
    }

    func runCF() -> Measurement {
        let host = CFHost()
        defer { host.shutdown() }
        let timer = Unchecked(CFRunLoopTimerCreateWithHandler(kCFAllocatorDefault, cfNow() + 10, 0, 0, 0) { _ in })
        let tid = host.sync {
            CFRunLoopAddTimer(CFRunLoopGetCurrent(), timer.value, kCFRunLoopDefaultMode)
            return cbench_gettid()
        }
        defer { CFRunLoopTimerInvalidate(timer.value) }
        return measure(tid: tid)
    }

    func runNIO() -> Measurement {
        let host = NIOHost()
        defer { host.shutdown() }
        let loop = host.loop
        let tid = host.sync {
            loop.scheduleTask(in: .seconds(10)) {}
            return cbench_gettid()
        }
        return measure(tid: tid)
    }

    func targets(_ r: WorkloadResults) -> [TargetCheck] {
        guard let mine = r.stats[.runLoopKit]?["wakeups"] else {
            return [TargetCheck(target: "0 wakeups while idle", met: false, measured: "no figure")]
        }
        return [
            TargetCheck(
                target: "0 wakeups while idle", met: mine.max <= 0,
                measured: String(format: "median %.0f, max %.0f", mine.median, mine.max))
        ]
    }
}

/// Kernel wakeups of thread `tid` over `window` ns, once it settled (100 ms): its context switches
/// (voluntary + nonvoluntary, /proc/self/task/TID/status) minus those of a control thread blocked
/// in sem_wait over the same window.
func wakeups(ofThread tid: Int32, overNanoseconds window: UInt64) -> Int {
    let control = cbench_control_thread_start()
    defer { cbench_control_thread_stop() }
    usleep(100_000)  // let the loop go back to sleep after the call that gave its tid
    let loop0 = cbench_thread_context_switches(tid)
    let control0 = cbench_thread_context_switches(control)
    let end = cbench_now_ns() + window
    while cbench_now_ns() < end { usleep(UInt32((end - min(end, cbench_now_ns())) / 1000)) }
    let loop1 = cbench_thread_context_switches(tid)
    let control1 = cbench_thread_context_switches(control)
    precondition(loop0 >= 0 && loop1 >= 0 && control0 >= 0 && control1 >= 0, "cannot read /proc/self/task/*/status")
    return (loop1 - loop0) - (control1 - control0)
}
