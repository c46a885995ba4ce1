import CBenchSupport
import Foundation
import RunLoopKit
import RunLoopMonitor

import class RunLoopKit.RunLoop

/// 20. The trace recorder's cost: the `iterate` workload with and without a TraceRecorder on the
/// loop (A/B in one run), the cost per recorded event when every callout is a new event (an
/// all-activities observer), and the export of a million events.
struct TraceCostWorkload: Workload {
    var iterations = 1_000_000
    var warmUp = 10_000
    /// Events in the exported trace.
    var exportEvents = 1_000_000

    var name: String { "tracecost" }
    var title: String { "Trace recording cost and export" }
    var summary: String {
        "The iterate workload (a Source0 re-signals itself \(iterations.formatted()) times, no observer) on RunLoopKit with no recorder (off) and with a TraceRecorder (ring of 65,536 records) recording the loop (on); each repetition runs off, on, on, off on fresh loop threads, the ratio within the repetition. The same with an all-activities observer (each pass 7 distinct callouts, nothing folded): the added cost per recorded event. Allocations: mallocs on the loop's thread over the timed run. Export: a ring of \((exportEvents * 3 / 5).formatted()) records (about \(exportEvents.formatted()) events once phases are added) filled by a loop with an all-activities observer, then snapshot() + chromeTraceJSON(), and timelineHTML(), timed on the calling thread."
    }
    var metrics: [Metric] {
        [
            Metric("iter_per_s_off", "iterations/s, no recorder", .perSecond, .higherIsBetter),
            Metric("iter_per_s_on", "iterations/s, recording", .perSecond, .higherIsBetter),
            Metric("ratio_on_off", "ratio on/off (same repetition)", .count, .higherIsBetter),
            Metric("allocs_on", "allocs/iteration, recording", .count, .lowerIsBetter),
            Metric("ns_per_event", "ns per recorded event (observer variant, on - off)", .nanoseconds, .lowerIsBetter),
            Metric("allocs_per_event", "allocs per recorded event (observer variant)", .count, .lowerIsBetter),
            Metric("export_events", "events exported", .count, .higherIsBetter),
            Metric("export_json_s", "snapshot + JSON export", .seconds, .lowerIsBetter),
            Metric("export_html_s", "HTML page", .seconds, .lowerIsBetter),
            Metric("export_mb", "JSON size (MB)", .count, .lowerIsBetter),
        ]
    }
    var implementations: [Impl] { [.runLoopKit] }

    /// The export's source state; touched only on the loop's thread.
    private final class Spin: @unchecked Sendable {
        var count = 0
    }

    private func run(recording: Bool, observed: Bool, iterations: Int) -> (rate: Double, allocations: Double, events: UInt64) {
        let warmUp = self.warmUp
        return BenchThread.run {
            let loop = RunLoop.current
            let spin = SpinningSource()
            let observer = RunLoopObserver(activities: .allActivities) { _, _ in }
            if observed { loop.add(observer, forMode: .default) }
            let recorder = recording ? try! TraceRecorder(capacityPerLoop: 65_536) : nil
            recorder?.record(loop)
            spin.pass(warmUp)
            let before = recorder?.recordsWritten ?? 0
            let start = cbench_now_ns()
            spin.pass(iterations, counting: true)
            let elapsed = seconds(from: start, to: cbench_now_ns())
            let events = (recorder?.recordsWritten ?? 0) - before
            recorder?.stop()
            observer.invalidate()
            spin.invalidate()
            return (Double(iterations) / elapsed, Double(spin.allocations) / Double(iterations), events)
        }
    }

    /// A trace of at least `exportEvents` records, then its export timed.
    private func export() -> (events: Int, json: Double, html: Double, megabytes: Double) {
        let recorder = try! TraceRecorder(capacityPerLoop: exportEvents * 3 / 5)
        let target = exportEvents
        BenchThread.run {
            let loop = RunLoop.current
            recorder.record(loop)
            let spin = Spin()
            let me = Box<RunLoopSource?>(nil)
            let source = RunLoopSource {
                spin.count += 1
                if recorder.recordsWritten < UInt64(target) { me.value!.signal() } else { RunLoop.current.stop() }
            }
            me.value = source
            loop.add(source, forMode: .default)
            let observer = RunLoopObserver(activities: .allActivities) { _, _ in }
            loop.add(observer, forMode: .default)
            source.signal()
            loop.run(mode: .default, for: .seconds(600))
            observer.invalidate()
            source.invalidate()
            me.value = nil
        }
        recorder.stop()
        let start = cbench_now_ns()
        let trace = recorder.snapshot()
        let json = trace.chromeTraceJSON()
        let jsonSeconds = seconds(from: start, to: cbench_now_ns())
        let events = trace.lanes.reduce(0) { $0 + $1.spans.count }
        let htmlStart = cbench_now_ns()
        let html = trace.timelineHTML(title: "export benchmark")
        let htmlSeconds = seconds(from: htmlStart, to: cbench_now_ns())
        precondition(html.utf8.count > json.count)
        return (events, jsonSeconds, htmlSeconds, Double(json.count) / 1e6)
    }

    func runRunLoopKit() -> Measurement {
        precondition(cbench_alloc_counter_available(), "allocation counting is not available in this build")
        let off1 = run(recording: false, observed: false, iterations: iterations)
        let on1 = run(recording: true, observed: false, iterations: iterations)
        let on2 = run(recording: true, observed: false, iterations: iterations)
        let off2 = run(recording: false, observed: false, iterations: iterations)
        let off = (off1.rate + off2.rate) / 2
        let on = (on1.rate + on2.rate) / 2
        let observedPasses = iterations / 4
        let observedOff = run(recording: false, observed: true, iterations: observedPasses)
        let observedOn = run(recording: true, observed: true, iterations: observedPasses)
        let perPassDelta = 1e9 / observedOn.rate - 1e9 / observedOff.rate
        let eventsPerPass = Double(observedOn.events) / Double(observedPasses)
        let exported = export()
        return [
            "iter_per_s_off": off, "iter_per_s_on": on, "ratio_on_off": on / off,
            "allocs_on": max(on1.allocations, on2.allocations),
            "ns_per_event": perPassDelta / max(eventsPerPass, 1),
            "allocs_per_event": observedOn.allocations / max(eventsPerPass, 1),
            "export_events": Double(exported.events), "export_json_s": exported.json,
            "export_html_s": exported.html, "export_mb": exported.megabytes,
        ]
    }

    func runCF() -> Measurement { fatalError("\(name) is RunLoopKit only") }

    func notes(_ r: WorkloadResults) -> [String] {
        [
            "RunLoopKit against itself; CFRunLoop and SwiftNIO record no such trace (CF has no tracing seam on Linux; NIO has NIOEventLoopMetricsDelegate, one report per tick), so they have no column. Repeated callouts of one source fold into one record per 64 calls, so the iterate variant writes ~15,600 records per million passes; the observer variant writes every callout."
        ]
    }

    func targets(_ r: WorkloadResults) -> [TargetCheck] {
        var checks: [TargetCheck] = []
        if let ratio = r.stats[.runLoopKit]?["ratio_on_off"] {
            checks.append(
                TargetCheck(
                    target: "recording costs ≤ 5% of iterate's iterations/s (ratio ≥ 0.95)", met: ratio.median >= 0.95,
                    measured: String(format: "median %.3f (%.3f–%.3f)", ratio.median, ratio.min, ratio.max)))
        }
        if let allocs = r.stats[.runLoopKit]?["allocs_per_event"], let onAllocs = r.stats[.runLoopKit]?["allocs_on"] {
            checks.append(
                TargetCheck(
                    target: "0 allocations per recorded event", met: allocs.max == 0 && onAllocs.max == 0,
                    measured: String(format: "%.4f per event, %.4f per iterate pass", allocs.max, onAllocs.max)))
        }
        if let export = r.stats[.runLoopKit]?["export_json_s"], let events = r.stats[.runLoopKit]?["export_events"] {
            checks.append(
                TargetCheck(
                    target: "export of ~1,000,000 events < 1 s (median)", met: export.median < 1 && events.min >= 990_000,
                    measured: String(format: "%.3f s for %.0f events (max %.3f s)", export.median, events.min, export.max)))
        }
        return checks
    }
}
