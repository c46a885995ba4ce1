import CBenchSupport
import CoreFoundation
import Foundation
import NIOCore
import NIOPosix
import RunLoopKit

import class RunLoopKit.RunLoop

/// 4. Timer firing: one-shot timers all due within 50 ms.
struct TimerFiringWorkload: Workload {
    var timers = 100_000
    var operations: (count: Int, name: String)? { (timers, "timer (added and fired)") }
    /// Fire dates are `margin` + [0, 50 ms) after the adding starts, so that every implementation
    /// has added all its timers before the first one is due (checked: a run that did not is flagged).
    var margin: Int64 = 600_000_000
    var window: Int64 = 50_000_000

    var name: String { "fire" }
    var title: String { "Timer firing" }
    var summary: String {
        "\(timers.formatted()) one-shot timers due within 50 ms (random, fixed seed), added on the loop's thread \(margin / 1_000_000) ms ahead; fires per second from the first due date to the last fire, on each implementation's own clock."
    }
    var metrics: [Metric] {
        [
            Metric("fires_per_s", "fires/s", .perSecond, .higherIsBetter),
            Metric(
                "firing_allocs_per_fire", "allocations per fire, from the last add to the last fire (every thread)", .count,
                .lowerIsBetter),
        ]
    }

    private final class Counter: @unchecked Sendable {
        var count = 0
        let target: Int
        let done = DispatchSemaphore(value: 0)
        /// Nanoseconds from the first due date to the last fire, on the implementation's clock.
        var span: Double = 0
        /// Whether the adding finished after the first timer was due.
        var overran = false
        let now: () -> Double
        var firstDue: Double = 0
        init(target: Int, now: @escaping () -> Double) {
            self.target = target
            self.now = now
        }
        /// The process's allocation count once every timer was added, and at the last fire: what
        /// firing allocates, apart from the timers themselves (-1 without the counter).
        var allocationsAdded = -1
        var allocationsFired = -1
        @inline(__always) func fired() {
            count += 1
            if count == target {
                allocationsFired = cbench_alloc_process_read()
                span = now() - firstDue
                done.signal()
            }
        }
    }

    private var offsets: [Int64] { randomOffsets(timers, in: margin..<(margin + window), seed: 0x5EED_0004) }

    private func result(_ c: Counter) -> Measurement {
        c.done.wait()
        var m: Measurement = ["fires_per_s": Double(timers) / (c.span / 1e9)]
        if c.overran { m["overran"] = 1 }
        if c.allocationsAdded >= 0 && c.allocationsFired >= 0 {
            m["firing_allocs_per_fire"] = Double(c.allocationsFired - c.allocationsAdded) / Double(timers)
        }
        return m
    }

    func runRunLoopKit() -> Measurement {
        let offsets = self.offsets
        let first = offsets.min()!
        let host = RunLoopKitHost()
        defer { host.shutdown() }
        let epoch = ContinuousClock.now
        let c = Counter(target: timers) { nanoseconds(ContinuousClock.now - epoch) }
        host.sync {
            let loop = RunLoop.current
            let base = ContinuousClock.now
            c.firstDue = nanoseconds(base - epoch) + Double(first)
            for offset in offsets {
                loop.add(RunLoopTimer(fireAt: base + .nanoseconds(offset)) { _ in c.fired() }, forMode: .default)
            }
            c.overran = c.now() >= c.firstDue
            c.allocationsAdded = cbench_alloc_process_read()
        }
        return result(c)
    }

    func runCF() -> Measurement {
        let offsets = self.offsets
        let first = offsets.min()!
        let host = CFHost()
        defer { host.shutdown() }
        let c = Counter(target: timers) { cfNow() * 1e9 }
        host.sync {
            let loop = CFRunLoopGetCurrent()
            let base = cfNow()
            c.firstDue = base * 1e9 + Double(first)
            for offset in offsets {
                let timer = CFRunLoopTimerCreateWithHandler(
                    kCFAllocatorDefault, base + Double(offset) / 1e9, 0, 0, 0
                ) { _ in c.fired() }
                CFRunLoopAddTimer(loop, timer, kCFRunLoopDefaultMode)
            }
            c.overran = c.now() >= c.firstDue
            c.allocationsAdded = cbench_alloc_process_read()
        }
        return result(c)
    }

    func runNIO() -> Measurement {
        let offsets = self.offsets
        let first = offsets.min()!
        let host = NIOHost()
        defer { host.shutdown() }
        let loop = host.loop
        let c = Counter(target: timers) { Double(NIODeadline.now().uptimeNanoseconds) }
        host.sync {
            let base = NIODeadline.now()
            c.firstDue = Double(base.uptimeNanoseconds) + Double(first)
            for offset in offsets {
                loop.scheduleTask(deadline: base + .nanoseconds(offset)) { c.fired() }
            }
            c.overran = c.now() >= c.firstDue
            c.allocationsAdded = cbench_alloc_process_read()
        }
        return result(c)
    }

    var implementations: [Impl] { [.runLoopKit, .cf, .nio, .floor] }
    var headline: String? { "fires_per_s" }

    /// The same-policy floor (floors.c): a timer object per timer, the loop's lock, a 4-ary heap,
    /// the timerfd re-armed for the earliest; due timers collected under the lock, fired outside
    /// it and freed.
    func runFloor() -> Measurement {
        var overran = false
        let span = offsets.withUnsafeBufferPointer { cbench_fire_policy_floor($0.baseAddress, $0.count, &overran) }
        precondition(span > 0, "the timer firing floor failed")
        var m: Measurement = ["fires_per_s": Double(timers) / (Double(span) / 1e9)]
        if overran { m["overran"] = 1 }
        return m
    }

    func targets(_ r: WorkloadResults) -> [TargetCheck] {
        [
            .ratio("≥ 10× CF", r.advantage("fires_per_s", over: .cf), atLeast: 10),
            .ratio("≥ 1.5× NIO", r.advantage("fires_per_s", over: .nio), atLeast: 1.5),
            .ratio("within 1.2× the same-policy floor", r.advantage("fires_per_s", over: .floor), atLeast: 1 / 1.2),
        ]
    }

    func notes(_ r: WorkloadResults) -> [String] {
        implementations.compactMap { impl in
            guard let overruns = r.stats[impl]?["overran"]?.samples.count else { return nil }
            return
                "warning: \(impl.rawValue) was still adding timers when the first was due in \(overruns) repetition(s)"
        }
    }
}
