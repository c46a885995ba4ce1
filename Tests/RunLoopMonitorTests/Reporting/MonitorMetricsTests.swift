import Foundation
@testable import RunLoopMonitor
import Testing

/// The handler-level signal: `stuck_in` and `fingerprint` labels, bounded; the fingerprint's
/// stability; the `/metrics` text; the readable report.
struct MonitorMetricsTests {
    static func frame(_ symbol: String, address: UInt64, module: String? = "Server", image: String = "/srv/Server") -> StackFrame {
        var frame = StackFrame(address: address, image: image, imageOffset: address, symbol: symbol)
        frame.module = module
        return frame
    }

    static func report(stuckIn: String?, fingerprint: String?) -> StallReport {
        var report = StallReport(
            id: "x", processID: 1, threadName: "NIO-ELT-0-#0", threadID: 2, mode: "?", phase: "tick", startedAt: Date(),
            duration: .milliseconds(312), threadCPUTime: .milliseconds(1), cpuMeasuredOver: .milliseconds(312), stacks: [],
            sampleCount: 16)
        report.stuckIn = stuckIn
        report.fingerprint = fingerprint
        return report
    }

    /// The same stall in two processes (its functions at other addresses: another build, ASLR):
    /// one fingerprint. Another handler: another one.
    @Test func theFingerprintHashesNamesNotAddresses() throws {
        let libc = "/lib/x86_64-linux-gnu/libc.so.6"
        func stack(_ base: UInt64, handler: String) -> [StackFrame] {
            [Self.frame("usleep", address: base + 1, module: nil, image: libc), Self.frame(handler, address: base + 2),
             Self.frame("closure #14 in routes()", address: base + 3), Self.frame("start_thread", address: base + 4, module: nil, image: libc)]
        }
        let here = CallTree([StackSample(count: 3, frames: stack(0x5000, handler: "handleSleep()"))]).fingerprint
        let there = CallTree([StackSample(count: 7, frames: stack(0x9_0000, handler: "handleSleep()"))]).fingerprint
        let other = CallTree([StackSample(count: 3, frames: stack(0x5000, handler: "handleJSON()"))]).fingerprint
        let fingerprint = try #require(here)
        #expect(fingerprint.count == 16 && fingerprint.allSatisfy(\.isHexDigit))
        #expect(here == there)
        #expect(here != other)
        // Stable across runs: a fixed hash (FNV-1a 64) of "closure #14 in routes()\nhandleSleep()".
        #expect(fingerprint == "7e4f3dc7e70336ca")
        #expect(CallTree([StackSample(count: 1, frames: [Self.frame("usleep", address: 1, module: nil, image: libc)])]).fingerprint == nil)
    }

    /// The first N distinct fingerprints keep their labels; later ones are `other`; a report
    /// without names is `unknown` and takes no room.
    @Test func labelsAreBoundedToTheFirstDistinctFingerprints() {
        var bound = MonitorMetrics.LabelBound(limit: 2)
        #expect(bound.labels(Self.report(stuckIn: "a()", fingerprint: "1")) == ("a()", "1"))
        #expect(bound.labels(Self.report(stuckIn: nil, fingerprint: nil)) == ("unknown", "none"))
        #expect(bound.labels(Self.report(stuckIn: "b()", fingerprint: "2")) == ("b()", "2"))
        #expect(bound.labels(Self.report(stuckIn: "c()", fingerprint: "3")) == ("other", "other"))
        #expect(bound.labels(Self.report(stuckIn: "a()", fingerprint: "1")) == ("a()", "1"))
        #expect(bound.labelled.count == 2)
    }

    /// Prometheus's text format: HELP and TYPE once per family, sorted labels, escaped values,
    /// cumulative buckets with +Inf, _sum and _count.
    @Test func theTextFormatIsPrometheus() {
        var registry = MonitorMetrics.Registry()
        registry.add("runloop_stalls_total", .counter, [("stuck_in", "say \"hi\"\\now"), ("loop", "l")], 1)
        registry.add("runloop_stalls_total", .counter, [("loop", "l"), ("stuck_in", "say \"hi\"\\now")], 2)
        registry.observe("runloop_stall_duration_seconds", [("loop", "l")], seconds: 0.3)
        registry.observe("runloop_stall_duration_seconds", [("loop", "l")], seconds: 2)
        let text = registry.render()
        #expect(text.contains("# TYPE runloop_stalls_total counter\n"))
        #expect(text.contains("runloop_stalls_total{loop=\"l\",stuck_in=\"say \\\"hi\\\"\\\\now\"} 3\n"))
        #expect(text.contains("# TYPE runloop_stall_duration_seconds histogram\n"))
        #expect(text.contains("runloop_stall_duration_seconds_bucket{loop=\"l\",le=\"0.25\"} 0\n"))
        #expect(text.contains("runloop_stall_duration_seconds_bucket{loop=\"l\",le=\"0.5\"} 1\n"))
        #expect(text.contains("runloop_stall_duration_seconds_bucket{loop=\"l\",le=\"2.5\"} 2\n"))
        #expect(text.contains("runloop_stall_duration_seconds_bucket{loop=\"l\",le=\"+Inf\"} 2\n"))
        #expect(text.contains("runloop_stall_duration_seconds_sum{loop=\"l\"} 2.3\n"))
        #expect(text.contains("runloop_stall_duration_seconds_count{loop=\"l\"} 2\n"))
        #expect(text.components(separatedBy: "# HELP runloop_stalls_total").count == 2)
    }

    /// The readable form names the loop, the blame, the duration and the top stack.
    @Test func aReportReadsAsText() {
        var report = Self.report(stuckIn: "handleSleep()", fingerprint: "0123456789abcdef")
        report.loop = "NIO-ELT-0-#0"
        report.endReason = .movedOn
        report.stacks = [StackSample(count: 16, frames: [Self.frame("usleep", address: 0x2000, module: nil), Self.frame("handleSleep()", address: 0x3000)])]
        let text = report.text
        #expect(text.hasPrefix("stall in 'NIO-ELT-0-#0' (thread NIO-ELT-0-#0, tid 2), phase tick"))
        #expect(text.contains("stuck in handleSleep() for 312 ms (ended: movedOn), CPU 1 ms of 312 ms watched (0 %)"))
        #expect(text.contains("fingerprint 0123456789abcdef, 16 samples, 1 distinct stack; the top one (16 of 16):"))
        #expect(text.contains("\n    handleSleep()"))
    }
}
