import CBenchSupport
import Foundation
import NIOCore
import NIOPosix
import RunLoopMonitor
@_spi(Benchmarks) import RunLoopMonitorNIO

/// What RunLoopMonitorNIO costs a SwiftNIO event loop: its metrics delegate's work per tick, and
/// ticks with it against ticks without.
struct NIOTickWorkload: Workload {
    var calls = 10_000_000
    var roundTrips = 100_000

    var name: String { "niotick" }
    var title: String { "RunLoopMonitorNIO's cost per NIO tick" }
    var summary: String {
        "(a) The delegate's work per tick (NIOEventLoopTicks, what processedTick(info:) does: find the loop's slot among 4 claimed ones, store the tick's end, count it), called \(calls.formatted()) times on one thread: ns per call, mallocs on that thread. (b) A 1-thread MultiThreadedEventLoopGroup made with no metrics delegate, with a no-op one, and with NIOEventLoopTicks watched by a running StallMonitor: \(roundTrips.formatted()) round trips of submit {}.wait() from another thread, each one tick of the loop; µs per round trip and mallocs per tick on the loop's thread (counted from a task on the loop). The variants alternate (none, noop, ticks, ticks, noop, none)."
    }
    var metrics: [Metric] {
        [
            Metric("ns_per_tick_call", "delegate work per tick (ns)", .nanoseconds, .lowerIsBetter),
            Metric("allocs_per_call", "delegate mallocs per tick", .count, .lowerIsBetter),
            Metric("us_rt_none", "round trip, no delegate (µs)", .microseconds, .lowerIsBetter),
            Metric("us_rt_noop", "round trip, no-op delegate (µs)", .microseconds, .lowerIsBetter),
            Metric("us_rt_ticks", "round trip, NIOEventLoopTicks + monitor (µs)", .microseconds, .lowerIsBetter),
            Metric("ratio_ticks_noop", "round trips/s ticks/no-op", .count, .higherIsBetter),
            Metric("allocs_tick_noop", "mallocs per tick on the loop, no-op delegate", .count, .lowerIsBetter),
            Metric("allocs_tick_ticks", "mallocs per tick on the loop, NIOEventLoopTicks", .count, .lowerIsBetter),
        ]
    }
    var implementations: [Impl] { [.nio] }

    func runRunLoopKit() -> Measurement { fatalError("\(name) is SwiftNIO only") }
    func runCF() -> Measurement { fatalError("\(name) is SwiftNIO only") }

    /// A metrics delegate that does nothing: NIO's own cost of having one (two clock reads).
    struct Noop: NIOEventLoopMetricsDelegate {
        func processedTick(info: NIOEventLoopTickInfo) {}
    }

    private enum Variant { case none, noop, ticks }

    /// µs per round trip and mallocs per tick on the loop's thread.
    private func roundTrips(_ variant: Variant) -> (us: Double, allocs: Double) {
        let ticks = NIOEventLoopTicks(capacity: 4)
        let group: MultiThreadedEventLoopGroup =
            switch variant {
            case .none: MultiThreadedEventLoopGroup(numberOfThreads: 1)
            case .noop: MultiThreadedEventLoopGroup(numberOfThreads: 1, metricsDelegate: Noop())
            case .ticks: MultiThreadedEventLoopGroup(numberOfThreads: 1, metricsDelegate: ticks)
            }
        defer { try? group.syncShutdownGracefully() }
        var monitor: StallMonitor?
        if variant == .ticks {
            let stallMonitor = StallMonitor(loops: [], threshold: .milliseconds(250), sampleInterval: .milliseconds(50), logger: nil)
            stallMonitor.watch(group, ticks: ticks)
            stallMonitor.start { _ in }
            monitor = stallMonitor
        }
        defer { monitor?.stop() }
        let loop = group.next()
        for _ in 0..<10_000 { try! loop.submit {}.wait() }
        try! loop.submit { cbench_alloc_counter_start() }.wait()
        let start = cbench_now_ns()
        for _ in 0..<roundTrips { try! loop.submit {}.wait() }
        let elapsed = cbench_now_ns() - start
        let allocations = try! loop.submit { cbench_alloc_counter_stop() }.wait()
        return (Double(elapsed) / 1e3 / Double(roundTrips), Double(allocations) / Double(roundTrips))
    }

    func runNIO() -> Measurement {
        precondition(cbench_alloc_counter_available(), "allocation counting is not available in this build")
        // (a) The delegate's own work, on this thread.
        let ticks = NIOEventLoopTicks(capacity: 8)
        let loops = (0..<4).map { _ in NSObject() }
        let ids = loops.map(ObjectIdentifier.init)
        for id in ids { ticks._recordTick(loopID: id, endUptimeNanoseconds: 1) }
        let calls = self.calls
        let (ns, callAllocs) = BenchThread.run { () -> (Double, Double) in
            cbench_alloc_counter_start()
            let start = cbench_now_ns()
            for index in 0..<calls { ticks._recordTick(loopID: ids[index & 3], endUptimeNanoseconds: UInt64(index)) }
            let elapsed = cbench_now_ns() - start
            let allocations = cbench_alloc_counter_stop()
            return (Double(elapsed) / Double(calls), Double(allocations) / Double(calls))
        }
        withExtendedLifetime(loops) {}
        // (b) Round trips, alternating.
        let none1 = roundTrips(.none), noop1 = roundTrips(.noop), ticks1 = roundTrips(.ticks)
        let ticks2 = roundTrips(.ticks), noop2 = roundTrips(.noop), none2 = roundTrips(.none)
        let none = (none1.us + none2.us) / 2, noop = (noop1.us + noop2.us) / 2, withTicks = (ticks1.us + ticks2.us) / 2
        return [
            "ns_per_tick_call": ns, "allocs_per_call": callAllocs,
            "us_rt_none": none, "us_rt_noop": noop, "us_rt_ticks": withTicks, "ratio_ticks_noop": noop / withTicks,
            "allocs_tick_noop": max(noop1.allocs, noop2.allocs), "allocs_tick_ticks": max(ticks1.allocs, ticks2.allocs),
        ]
    }

    func targets(_ r: WorkloadResults) -> [TargetCheck] {
        guard let stats = r.stats[.nio] else { return [] }
        var checks: [TargetCheck] = []
        if let allocs = stats["allocs_per_call"], let loopAllocs = stats["allocs_tick_ticks"], let noop = stats["allocs_tick_noop"] {
            checks.append(
                TargetCheck(
                    target: "0 allocations per tick from the delegate", met: allocs.max == 0 && loopAllocs.max <= noop.max,
                    measured: String(format: "%.3f per call; per tick on the loop %.3f with it, %.3f with a no-op", allocs.max, loopAllocs.max, noop.max)))
        }
        return checks
    }

    func notes(_ r: WorkloadResults) -> [String] {
        ["SwiftNIO only: the delegate is RunLoopMonitorNIO's; `none` and `noop` show what NIO itself spends on having a delegate (it reads the clock twice per tick)."]
    }
}
