import Logging
import Metrics

/// Where the monitors' reports go besides their handlers: swift-log and swift-metrics.
///
/// Logging: label `RunLoopMonitor`. A stall that began: `warning`; one that ended: `warning`
/// (`notice` when it was cut short by ``StallMonitor/stop()`` or the thread exited); a hot thread
/// (``CPUMonitor``): `warning`; a stall suppressed by the back-off: `debug`; a stack that could not
/// be taken, a store that could not be written: `error`; a watched loop whose thread exited:
/// `info`; similar stalls the back-off held back: `notice`. Metadata: `loop`, `thread`, `tid`,
/// `phase`, `mode`, `item`, `duration_ms`, `cpu_ms`, `stuck_in`, `fingerprint`.
///
/// Metrics (the names any swift-metrics backend the application bootstraps receives, e.g.
/// swift-prometheus or an OpenTelemetry exporter):
///
/// Names follow Prometheus's conventions (`_total` for counters, `_seconds` for durations: a
/// swift-metrics `Timer` records nanoseconds, which Prometheus backends export in seconds), and
/// every family about a loop labels it `loop` (the name given to ``StallMonitor/watch(_:name:)``
/// or ``IterationMetrics``, else the loop thread's name), so stall and iteration metrics join on
/// it. `stuck_in` and `fingerprint` are bounded (``MonitorMetrics/stuckInLabelLimit``). The same
/// families are kept in the process for ``MonitorMetrics/prometheusText()``. The table of every
/// metric is in the DocC article "Metrics".
///
/// | name | kind | dimensions | what |
/// |---|---|---|---|
/// | `runloop_stalls_total` | Counter | `loop`, `phase`, `stuck_in`, `fingerprint` | stalls that began (held-back ones too) |
/// | `runloop_stall_duration_seconds` | Timer | `loop`, `stuck_in` | each stall's total duration, when it ends |
/// | `runloop_stalls_suppressed_total` | Counter | `loop` | stalls the back-off did not report |
/// | `runloop_thread_cpu_ratio` | Gauge | `thread` | each thread's CPU share over the last window (``CPUMonitor``; threads, not loops) |
/// | `runloop_cpu_hot_total` | Counter | `thread` | hot-thread reports (``CPUMonitor``) |
public enum MonitorReporting {
    /// The logger label.
    public static let loggerLabel = "RunLoopMonitor"

    /// Metric names (see the table above).
    public enum MetricName {
        /// `runloop_stalls_total`
        public static let stalls = "runloop_stalls_total"
        /// `runloop_stall_duration_seconds`
        public static let stallDuration = "runloop_stall_duration_seconds"
        /// `runloop_stalls_suppressed_total`
        public static let stallsSuppressed = "runloop_stalls_suppressed_total"
        /// `runloop_thread_cpu_ratio`
        public static let threadCPURatio = "runloop_thread_cpu_ratio"
        /// `runloop_cpu_hot_total`
        public static let cpuHot = "runloop_cpu_hot_total"
    }

    static func metadata(_ report: StallReport) -> Logger.Metadata {
        var metadata: Logger.Metadata = [
            "loop": "\(report.loop)", "item": "\(report.item)", "thread": "\(report.threadName)", "tid": "\(report.threadID)", "phase": "\(report.phase)",
            "mode": "\(report.mode)", "duration_ms": "\(Int(report.duration.seconds * 1000))",
            "cpu_ms": "\(Int(report.threadCPUTime.seconds * 1000))",
        ]
        if let stuckIn = report.stuckIn { metadata["stuck_in"] = "\(stuckIn)" }
        if let fingerprint = report.fingerprint { metadata["fingerprint"] = "\(fingerprint)" }
        return metadata
    }
}
