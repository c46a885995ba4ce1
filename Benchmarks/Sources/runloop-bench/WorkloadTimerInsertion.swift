import CBenchSupport
import CoreFoundation
import Foundation
import NIOCore
import NIOPosix
import RunLoopKit

import class RunLoopKit.RunLoop

/// 3. Timer insertion: add timers with random fire dates 1,000–2,000 s ahead.
struct TimerInsertionWorkload: Workload {
    var sizes = [1_000, 10_000, 100_000]

    var name: String { "insert" }
    var title: String { "Timer insertion" }
    var summary: String {
        "On the loop's thread, inside the running loop: create and add \(sizes.map { $0.formatted() }.joined(separator: " / ")) timers (NIO: scheduleTask(deadline:)) with random fire dates 1,000–2,000 s ahead, generated beforehand from a fixed seed; only the create+add calls are timed. A fresh loop for each size."
    }
    var metrics: [Metric] {
        sizes.map { Metric(key($0), "insert \($0.formatted())", .seconds, .lowerIsBetter) }
    }

    private func key(_ n: Int) -> String { "insert_\(n)_s" }

    private func offsets(_ n: Int) -> [Int64] {
        randomOffsets(n, in: 1_000_000_000_000..<2_000_000_000_000, seed: 0x5EED_0003 &+ UInt64(n))
    }

    /// The timer added and the CPU and allocations per timer, from the largest size's run.
    var operations: (count: Int, name: String)? { (sizes.max()!, "timer added") }

    /// Runs `body` for each size; the largest size's CPU time (the adding thread's) and
    /// allocations (every thread's) per timer are the CPU and allocation figures.
    private func each(_ body: (Int, [Int64]) -> Timed) -> Measurement {
        var m = Measurement()
        let big = sizes.max()!
        for n in sizes {
            let run = body(n, offsets(n))
            m[key(n)] = run.seconds
            if n == big {
                m[Self.cpuKey] = Double(run.cpuNs) / Double(n)
                if run.allocations >= 0 { m[Self.allocsKey] = Double(run.allocations) / Double(n) }
            }
        }
        return m
    }

    func runRunLoopKit() -> Measurement {
        each { _, offsets in
            let host = RunLoopKitHost()
            defer { host.shutdown() }
            return host.sync {
                let loop = RunLoop.current
                let base = ContinuousClock.now
                return timed {
                    for offset in offsets {
                        loop.add(RunLoopTimer(fireAt: base + .nanoseconds(offset)) { _ in }, forMode: .default)
                    }
                }
            }
        }
    }

    func runCF() -> Measurement {
        each { _, offsets in
            let host = CFHost()
            defer { host.shutdown() }
            return host.sync {
                let loop = CFRunLoopGetCurrent()
                let base = cfNow()
                return timed {
                    for offset in offsets {
                        let timer = CFRunLoopTimerCreateWithHandler(
                            kCFAllocatorDefault, base + Double(offset) / 1e9, 0, 0, 0
                        ) { _ in }
                        CFRunLoopAddTimer(loop, timer, kCFRunLoopDefaultMode)
                    }
                }
            }
        }
    }

    func runNIO() -> Measurement {
        each { _, offsets in
            let host = NIOHost()
            defer { host.shutdown() }
            let loop = host.loop
            return host.sync {
                let base = NIODeadline.now()
                return timed {
                    for offset in offsets {
                        loop.scheduleTask(deadline: base + .nanoseconds(offset)) {}
                    }
                }
            }
        }
    }

    var implementations: [Impl] { [.runLoopKit, .cf, .nio, .floor] }
    var headline: String? { key(sizes.max()!) }

    /// The same-policy floor (floors.c): per timer an allocation, the loop's lock, a push onto a
    /// 4-ary heap, and a timerfd re-arm when it is the new earliest.
    func runFloor() -> Measurement {
        each { _, offsets in
            BenchThread.run {
                var ns: UInt64 = 0
                var run = timed {
                    ns = offsets.withUnsafeBufferPointer { cbench_insert_policy_floor($0.baseAddress, $0.count) }
                }
                precondition(ns > 0, "the timer insertion floor failed")
                // The floor's own span: without making and closing its descriptors.
                run.seconds = Double(ns) / 1e9
                return run
            }
        }
    }

    func targets(_ r: WorkloadResults) -> [TargetCheck] {
        let big = sizes.max()!
        let small = sizes.min()!
        var checks = [
            TargetCheck.ratio(
                "\(big.formatted()) timers within 1.2× the same-policy floor", r.advantage(key(big), over: .floor),
                atLeast: 1 / 1.2),
            TargetCheck.ratio(
                "\(big.formatted()) timers ≥ 20× faster than CF", r.advantage(key(big), over: .cf), atLeast: 20),
            TargetCheck.ratio(
                "\(big.formatted()) timers ≥ 2× faster than NIO", r.advantage(key(big), over: .nio), atLeast: 2),
        ]
        // n log n: the per-timer cost may grow with log n. Allowed: twice the log factor (cache
        // misses grow too); linear growth of the per-timer cost (a sorted array) is far above it.
        if let tBig = r.median(.runLoopKit, key(big)), let tSmall = r.median(.runLoopKit, key(small)) {
            let perTimerGrowth = (tBig / Double(big)) / (tSmall / Double(small))
            let logFactor = log(Double(big)) / log(Double(small))
            checks.append(
                TargetCheck(
                    target:
                        "growth close to n log n (per-timer cost \(small.formatted())→\(big.formatted()) ≤ 2 × log factor \(String(format: "%.2f", logFactor)))",
                    met: perTimerGrowth <= 2 * logFactor,
                    measured: String(format: "per-timer cost grew %.2f×", perTimerGrowth)))
        }
        return checks
    }

    func notes(_ r: WorkloadResults) -> [String] {
        var lines = ["per-timer cost (median time / n):"]
        for impl in implementations {
            let costs = sizes.map { n -> String in
                guard let t = r.median(impl, key(n)) else { return "—" }
                return "\(n.formatted()): \(Format.nanos(t * 1e9 / Double(n)))"
            }
            lines.append(
                "  \(impl.rawValue.padding(toLength: 11, withPad: " ", startingAt: 0)) \(costs.joined(separator: ", "))"
            )
        }
        return lines
    }
}
