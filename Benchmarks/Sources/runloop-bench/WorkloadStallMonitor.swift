import CBenchSupport
import Foundation
import RunLoopKit
import RunLoopMonitor

import class RunLoopKit.RunLoop

/// 12. The `iterate` workload with and without a StallMonitor watching the loop: RunLoopKit
/// against itself, A/B in one run.
struct StallMonitorWorkload: Workload {
    var iterations = 1_000_000
    /// Passes run before each measured run (and, with the monitor on, until it watches the loop).
    var warmUp = 10_000
    var threshold: Duration = .milliseconds(250)
    var sampleInterval: Duration = .milliseconds(50)

    var name: String { "stallmon" }
    var title: String { "Iteration cost under a StallMonitor" }
    var summary: String {
        "The iterate workload (a Source0 re-signals itself \(iterations.formatted()) times, no observer) on RunLoopKit with no monitor (off) and with a StallMonitor watching the loop (on: threshold \(Self.ms(threshold)), sample interval \(Self.ms(sampleInterval)), logger nil, started with an empty handler, watching before the timed run). To tell the monitor's cost from the seam's, a third variant holds only the phase watch a StallMonitor takes (RunLoop.watchPhases(), no monitor thread). Each repetition runs off, on, watch, watch, on, off, each on a fresh loop thread; a ratio is the repetition's mean rate of a variant over its mean off rate. Allocations: mallocs on the loop's thread (CBenchSupport's counter) from the first to the last pass of the timed run."
    }
    var metrics: [Metric] {
        [
            Metric("iter_per_s_off", "iterations/s, no monitor", .perSecond, .higherIsBetter),
            Metric("iter_per_s_on", "iterations/s, StallMonitor watching", .perSecond, .higherIsBetter),
            Metric("ratio_on_off", "ratio on/off (same repetition)", .count, .higherIsBetter),
            Metric("iter_per_s_watch", "iterations/s, phase watch only", .perSecond, .higherIsBetter),
            Metric("ratio_watch_off", "ratio watch only/off (same repetition)", .count, .higherIsBetter),
            Metric("allocs_off", "allocs/iteration, no monitor", .count, .lowerIsBetter),
            Metric("allocs_on", "allocs/iteration, StallMonitor watching", .count, .lowerIsBetter),
        ]
    }
    var implementations: [Impl] { [.runLoopKit] }

    private static func ms(_ d: Duration) -> String { "\(Int(nanoseconds(d) / 1e6)) ms" }

    /// What watches the loop in a run: nothing, a StallMonitor, or only the phase watch a
    /// StallMonitor holds (no monitor thread): what separates the seam's cost from the monitor's.
    private enum Variant { case off, monitor, watchOnly }

    /// One run on a fresh loop thread: iterations per second and allocations per pass.
    private func run(_ variant: Variant) -> (rate: Double, allocations: Double) {
        let (iterations, warmUp, threshold, interval) = (self.iterations, self.warmUp, threshold, sampleInterval)
        return BenchThread.run {
            let loop = RunLoop.current
            let spin = SpinningSource()
            let monitor =
                variant == .monitor
                ? StallMonitor(loop: loop, threshold: threshold, sampleInterval: interval, logger: nil) : nil
            monitor?.start { _ in }
            let watch = variant == .watchOnly ? loop.watchPhases() : nil
            spin.pass(warmUp)
            if variant == .watchOnly {
                // `busySince` is nil until the loop is watched and has stamped a pass.
                let deadline = cbench_now_ns() + 2_000_000_000
                while loop.phaseSnapshot.busySince == nil {
                    precondition(cbench_now_ns() < deadline, "the phase watch did not stamp within 2 s")
                    usleep(1_000)
                    spin.pass(warmUp)
                }
            } else if variant == .monitor {
                // The monitor reads only the phase word; let its threads start and look once.
                usleep(2 * 50_000)
                spin.pass(warmUp)
            }
            let start = cbench_now_ns()
            spin.pass(iterations, counting: true)
            let elapsed = seconds(from: start, to: cbench_now_ns())
            monitor?.stop()
            watch?.cancel()
            spin.invalidate()
            return (Double(iterations) / elapsed, Double(spin.allocations) / Double(iterations))
        }
    }

    func runRunLoopKit() -> Measurement {
        precondition(cbench_alloc_counter_available(), "allocation counting is not available in this build")
        // Off, on, watch, watch, on, off: a palindrome, so a steady drift of the machine's speed
        // within the repetition weighs on each variant alike.
        let off1 = run(.off)
        let on1 = run(.monitor)
        let watch1 = run(.watchOnly)
        let watch2 = run(.watchOnly)
        let on2 = run(.monitor)
        let off2 = run(.off)
        let off = (off1.rate + off2.rate) / 2
        let on = (on1.rate + on2.rate) / 2
        let watch = (watch1.rate + watch2.rate) / 2
        return [
            "iter_per_s_off": off, "iter_per_s_on": on, "ratio_on_off": on / off,
            "iter_per_s_watch": watch, "ratio_watch_off": watch / off,
            "allocs_off": max(off1.allocations, off2.allocations), "allocs_on": max(on1.allocations, on2.allocations),
        ]
    }

    func runCF() -> Measurement { fatalError("\(name) is RunLoopKit only") }

    func notes(_ r: WorkloadResults) -> [String] {
        [
            "RunLoopKit against itself (monitor off / on); CFRunLoop and SwiftNIO have no StallMonitor, so they have no column. The allocation figures are the larger of the repetition's two runs."
        ]
    }

    func targets(_ r: WorkloadResults) -> [TargetCheck] {
        var checks: [TargetCheck] = []
        if let ratio = r.stats[.runLoopKit]?["ratio_on_off"] {
            checks.append(
                TargetCheck(
                    target: "monitored/unmonitored iterations/s ≥ 0.98", met: ratio.median >= 0.98,
                    measured: String(format: "median %.3f (%.3f–%.3f)", ratio.median, ratio.min, ratio.max)))
        }
        if let allocs = r.stats[.runLoopKit]?["allocs_on"] {
            checks.append(
                TargetCheck(
                    target: "0 allocations per iteration on the loop's thread, monitor on", met: allocs.max == 0,
                    measured: String(format: "%.3f (max %.3f)", allocs.median, allocs.max)))
        }
        return checks
    }
}
