import CBenchSupport
import Foundation
import RunLoopKit
import RunLoopScheduling

import class RunLoopKit.RunLoop

/// 17. What each RunLoopScheduling object with nothing to do costs a pass of the loop:
/// iterations/s with it on against off, and allocations per pass. RunLoopKit against itself.
struct SchedulingCostWorkload: Workload {
    var passes = 100_000
    var warmUp = 5_000

    var name: String { "schedcost" }
    var title: String { "Pass cost of idle scheduling objects" }
    var summary: String {
        "Each pass of the loop reaches beforeWaiting (a last observer wakes the loop with wakeUp(), so every pass sleeps in epoll_wait and is woken at once): \(passes.formatted()) passes with nothing attached (off), with one empty beforeWaiting observer (observer: the floor of any object that watches the loop), with an empty IdleTaskQueue, a CommitCoalescer with nothing pending, an empty IterationPool, a paused DisplayLink, and all four. Each repetition runs the variants in a palindrome (off … all, all … off) on fresh loop threads; a ratio is a variant's mean rate over the mean off rate; ns added = 1/rate(on) − 1/rate(off). Allocations: mallocs on the loop's thread over the timed passes."
    }

    private enum Variant: String, CaseIterable { case off, observer, idle, commit, pool, link, all }

    var metrics: [Metric] {
        [Metric("passes_per_s_off", "passes/s, nothing attached", .perSecond, .higherIsBetter)]
            + Variant.allCases.dropFirst().map {
                Metric("ratio_\($0.rawValue)", "ratio \($0.rawValue)/off", .count, .higherIsBetter)
            }
            + Variant.allCases.dropFirst().map {
                Metric("ns_\($0.rawValue)", "ns added per pass, \($0.rawValue)", .nanoseconds, .lowerIsBetter)
            }
            + Variant.allCases.map { Metric("allocs_\($0.rawValue)", "allocs/pass, \($0.rawValue)", .count, .lowerIsBetter) }
    }
    var implementations: [Impl] { [.runLoopKit] }

    /// The waker's state: touched only on the loop's thread.
    private final class Passes: @unchecked Sendable {
        var count = 0
        var target = 0
        var counting = false
        var allocations = 0
    }

    private func run(_ variant: Variant) -> (rate: Double, allocations: Double) {
        let (passes, warmUp) = (self.passes, self.warmUp)
        return BenchThread.run {
            let loop = RunLoop.current
            let keepAlive = RunLoopSource {}
            loop.add(keepAlive, forMode: .default)
            var idle: IdleTaskQueue?
            var commit: CommitCoalescer?
            var pool: IterationPool?
            var link: DisplayLink?
            var observer: RunLoopObserver?
            if variant == .observer {
                observer = RunLoopObserver(activities: .beforeWaiting, order: 0) { _, _ in }
                loop.add(observer!, forMode: .default)
            }
            if variant == .idle || variant == .all { idle = IdleTaskQueue(loop: loop) }
            if variant == .commit || variant == .all { commit = CommitCoalescer(loop: loop) }
            if variant == .pool || variant == .all { pool = IterationPool(loop: loop) }
            if variant == .link || variant == .all {
                link = DisplayLink(loop: loop) { _ in }
                link!.isPaused = true
            }
            let state = Passes()
            // Added last at the highest order: runs after every object's beforeWaiting observer.
            let waker = RunLoopObserver(activities: .beforeWaiting, order: Int.max) { _, _ in
                state.count += 1
                if state.counting && state.count == 1 { cbench_alloc_counter_start() }
                if state.count < state.target {
                    RunLoop.current.wakeUp()
                } else {
                    if state.counting { state.allocations = cbench_alloc_counter_stop() }
                    RunLoop.current.stop()
                }
            }
            loop.add(waker, forMode: .default)
            func pass(_ n: Int, counting: Bool = false) {
                state.count = 0
                state.target = n
                state.counting = counting
                loop.run(mode: .default, for: .seconds(600))
                precondition(state.count == n, "stopped after \(state.count) of \(n) passes")
            }
            pass(warmUp)
            let start = cbench_now_ns()
            pass(passes, counting: true)
            let elapsed = seconds(from: start, to: cbench_now_ns())
            waker.invalidate()
            keepAlive.invalidate()
            idle?.invalidate()
            commit?.invalidate()
            pool?.invalidate()
            link?.invalidate()
            observer?.invalidate()
            return (Double(passes) / elapsed, Double(state.allocations) / Double(passes))
        }
    }

    func runRunLoopKit() -> Measurement {
        precondition(cbench_alloc_counter_available(), "allocation counting is not available in this build")
        let order = Variant.allCases + Variant.allCases.reversed()
        var rates: [Variant: [Double]] = [:]
        var allocations: [Variant: Double] = [:]
        for variant in order {
            let (rate, allocs) = run(variant)
            rates[variant, default: []].append(rate)
            allocations[variant] = max(allocations[variant] ?? 0, allocs)
        }
        func mean(_ v: Variant) -> Double { rates[v]!.reduce(0, +) / Double(rates[v]!.count) }
        var figures: Measurement = ["passes_per_s_off": mean(.off)]
        for variant in Variant.allCases {
            if variant != .off {
                figures["ratio_\(variant.rawValue)"] = mean(variant) / mean(.off)
                figures["ns_\(variant.rawValue)"] = 1e9 / mean(variant) - 1e9 / mean(.off)
            }
            figures["allocs_\(variant.rawValue)"] = allocations[variant]
        }
        return figures
    }

    func runCF() -> Measurement { fatalError("\(name) is RunLoopKit only") }

    func targets(_ r: WorkloadResults) -> [TargetCheck] {
        guard let stats = r.stats[.runLoopKit] else { return [] }
        let allocs = Variant.allCases.compactMap { stats["allocs_\($0.rawValue)"]?.max }.max() ?? .nan
        return [
            TargetCheck(
                target: "0 allocations per pass with every object idle", met: allocs == 0,
                measured: String(format: "max %.3f", allocs))
        ]
    }

    func notes(_ r: WorkloadResults) -> [String] {
        [
            "RunLoopKit against itself; CFRunLoop and SwiftNIO have none of these objects. A pass here is a full sleep and wakeup (an eventfd write and epoll_wait), the cheapest pass that reaches beforeWaiting, so each object's share is as large as it can be; a pass that sleeps costs microseconds (see pingpong), against which the ns added are what matters. A paused DisplayLink's cost is the loop's: a mode with a descriptor asks epoll, without blocking, on every pass that does not sleep."
        ]
    }
}
