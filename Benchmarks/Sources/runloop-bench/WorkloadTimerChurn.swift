import CBenchSupport
import CoreFoundation
import Foundation
import NIOCore
import NIOPosix
import RunLoopKit

import class RunLoopKit.RunLoop

/// 10. Timer churn: add and cancel timers with a steady population of live ones.
struct TimerChurnWorkload: Workload {
    var operations = 1_000_000
    var live = 10_000
    /// CF's add and cancel are O(live) each (a sorted array, a linear search), so its cost per
    /// operation is the same at every count once `live` timers are in: by default CF runs this many
    /// operations and its time is scaled to `operations` (`--full` runs them all: ~18 s a rep here).
    var cfOperations = 100_000

    var name: String { "churn" }
    var title: String { "Timer churn" }
    var summary: String {
        "On the loop's thread, with \(live.formatted()) live timers 1,000–2,000 s ahead: \(operations.formatted()) times, add a new timer and cancel the oldest (invalidate / Scheduled.cancel()); random dates generated beforehand. Seconds.\(cfOperations < operations ? " CF runs \(cfOperations.formatted()) operations, scaled ×\(operations / cfOperations) (its cost per operation is constant at a fixed live count; --full runs all)." : "")"
    }
    var metrics: [Metric] { [Metric("churn_s", "add+cancel \(operations.formatted())", .seconds, .lowerIsBetter)] }

    private var offsets: [Int64] {
        randomOffsets(live + operations, in: 1_000_000_000_000..<2_000_000_000_000, seed: 0x5EED_0010)
    }

    func runRunLoopKit() -> Measurement {
        let (offsets, live, operations) = (self.offsets, self.live, self.operations)
        let host = RunLoopKitHost()
        defer { host.shutdown() }
        let s = host.sync { () -> Double in
            let loop = RunLoop.current
            let base = ContinuousClock.now
            var ring: [RunLoopTimer] = offsets[0..<live].map { RunLoopTimer(fireAt: base + .nanoseconds($0)) { _ in } }
            for timer in ring { loop.add(timer, forMode: .default) }
            let start = cbench_now_ns()
            for i in 0..<operations {
                let timer = RunLoopTimer(fireAt: base + .nanoseconds(offsets[live + i])) { _ in }
                loop.add(timer, forMode: .default)
                ring[i % live].invalidate()
                ring[i % live] = timer
            }
            let elapsed = seconds(from: start, to: cbench_now_ns())
            for timer in ring { timer.invalidate() }
            return elapsed
        }
        return ["churn_s": s]
    }

    func runCF() -> Measurement {
        let (offsets, live, operations) = (self.offsets, self.live, min(self.cfOperations, self.operations))
        let host = CFHost()
        defer { host.shutdown() }
        let s = host.sync { () -> Double in
            let loop = CFRunLoopGetCurrent()
            let base = cfNow()
            func make(_ offset: Int64) -> CFRunLoopTimer {
                CFRunLoopTimerCreateWithHandler(kCFAllocatorDefault, base + Double(offset) / 1e9, 0, 0, 0) { _ in }
            }
            var ring: [CFRunLoopTimer] = offsets[0..<live].map(make)
            for timer in ring { CFRunLoopAddTimer(loop, timer, kCFRunLoopDefaultMode) }
            let start = cbench_now_ns()
            for i in 0..<operations {
                let timer = make(offsets[live + i])
                CFRunLoopAddTimer(loop, timer, kCFRunLoopDefaultMode)
                CFRunLoopTimerInvalidate(ring[i % live])
                ring[i % live] = timer
            }
            let elapsed = seconds(from: start, to: cbench_now_ns())
            for timer in ring { CFRunLoopTimerInvalidate(timer) }
            return elapsed
        }
        return ["churn_s": s * Double(self.operations) / Double(operations)]
    }

    func runNIO() -> Measurement {
        let (offsets, live, operations) = (self.offsets, self.live, self.operations)
        let host = NIOHost()
        defer { host.shutdown() }
        let loop = host.loop
        let s = host.sync { () -> Double in
            let base = NIODeadline.now()
            var ring: [Scheduled<Void>] = offsets[0..<live].map {
                loop.scheduleTask(deadline: base + .nanoseconds($0)) {}
            }
            let start = cbench_now_ns()
            for i in 0..<operations {
                let task = loop.scheduleTask(deadline: base + .nanoseconds(offsets[live + i])) {}
                ring[i % live].cancel()
                ring[i % live] = task
            }
            let elapsed = seconds(from: start, to: cbench_now_ns())
            for task in ring { task.cancel() }
            return elapsed
        }
        return ["churn_s": s]
    }

    var implementations: [Impl] { [.runLoopKit, .cf, .nio, .floor] }
    var headline: String? { "churn_s" }

    /// The same-policy floor (floors.c): the insertion floor's adds, and a cancel that moves the
    /// timer's generation on, with the heap rebuilt from its live entries once stale ones
    /// outnumber them.
    func runFloor() -> Measurement {
        let (offsets, live, operations) = (self.offsets, self.live, self.operations)
        let ns = BenchThread.run {
            offsets.withUnsafeBufferPointer { cbench_churn_policy_floor($0.baseAddress, live, operations) }
        }
        precondition(ns > 0, "the timer churn floor failed")
        return ["churn_s": Double(ns) / 1e9]
    }

    func targets(_ r: WorkloadResults) -> [TargetCheck] {
        [.ratio("within 1.2× the same-policy floor", r.advantage("churn_s", over: .floor), atLeast: 1 / 1.2)]
    }
}
