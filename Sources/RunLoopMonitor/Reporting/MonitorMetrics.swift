import Metrics
import RunLoopKit
import Synchronization

/// The monitors' own metric families, kept in the process as well as sent to swift-metrics, so
/// that a server can answer `/metrics` without bootstrapping a metrics backend:
///
/// <!-- snippet: prelude
/// import RunLoopMonitor
/// -->
/// ```swift
/// // In the handler of GET /metrics, whatever the HTTP framework:
/// let body = MonitorMetrics.prometheusText()  // Content-Type: text/plain; version=0.0.4
/// ```
///
/// It holds the families of ``MonitorReporting`` (stalls, their durations, held-back stalls, the
/// CPU monitor's gauges and hot-thread counts) with the same names and labels a swift-metrics
/// backend receives; `IterationMetrics` (one sample per loop pass) goes to swift-metrics only. An
/// application that already bootstraps swift-prometheus serves that registry instead (the two
/// would repeat each family).
///
/// **The handler-level label.** `runloop_stalls_total` and `runloop_stall_duration_seconds` carry
/// `stuck_in`, the function the stall was stuck in (``StallReport/stuckIn``), and the counter
/// `fingerprint` (``StallReport/fingerprint``), so alerts route by handler and the same stall in
/// many processes adds up. Their number stays bounded: the first ``stuckInLabelLimit`` distinct
/// fingerprints of the process keep their own values, later ones are counted under
/// `stuck_in="other"`, `fingerprint="other"`; a stall without a named application frame (no stack,
/// or a report made before the symbol tables were loaded) under `stuck_in="unknown"`,
/// `fingerprint="none"`.
public enum MonitorMetrics {
    /// How many distinct fingerprints (so `stuck_in` values) the stall families carry before the
    /// rest are `other`; 20 by default, at least 1. Any thread; applies to stalls counted from then on.
    public static var stuckInLabelLimit: Int {
        get { registry.locked { $0.bound.limit } }
        set { registry.locked { $0.bound.limit = max(1, newValue) } }
    }

    /// Every family in Prometheus's text exposition format (version 0.0.4), families sorted by
    /// name and series by labels. Durations are seconds; the duration histogram's buckets are
    /// ``durationBuckets``.
    ///
    /// - Complexity: O(*n* log *n*) in the number of series.
    public static func prometheusText() -> String {
        registry.locked { $0.render() }
    }

    /// The upper bounds, in seconds, of `runloop_stall_duration_seconds`'s buckets.
    public static let durationBuckets: [Double] = [0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60]

    // MARK: Recording (the monitors)

    /// The `stuck_in` and `fingerprint` values a stall is counted under (see the type's docs).
    static func stallLabels(_ report: StallReport) -> (stuckIn: String, fingerprint: String) {
        registry.locked { $0.bound.labels(report) }
    }

    /// The bound on `stuck_in` and `fingerprint` values: the first `limit` distinct fingerprints
    /// keep theirs.
    struct LabelBound {
        var limit = 20
        private(set) var labelled: Set<String> = []

        /// The labels `report` is counted under; remembers its fingerprint while there is room.
        ///
        /// - Complexity: O(1) expected.
        mutating func labels(_ report: StallReport) -> (stuckIn: String, fingerprint: String) {
            guard let fingerprint = report.fingerprint, let stuckIn = report.stuckIn else { return ("unknown", "none") }
            if labelled.contains(fingerprint) { return (stuckIn, fingerprint) }
            guard labelled.count < limit else { return ("other", "other") }
            labelled.insert(fingerprint)
            return (stuckIn, fingerprint)
        }
    }

    static func increment(_ name: String, _ labels: [(String, String)], by amount: Int64 = 1) {
        Counter(label: name, dimensions: labels).increment(by: amount)
        registry.locked { $0.add(name, .counter, labels, Double(amount)) }
    }

    static func record(_ name: String, _ labels: [(String, String)], duration: Duration) {
        Metrics.Timer(label: name, dimensions: labels).recordNanoseconds(duration.saturatedNanoseconds)
        registry.locked { $0.observe(name, labels, seconds: duration.seconds) }
    }

    static func set(_ name: String, _ labels: [(String, String)], _ value: Double) {
        Gauge(label: name, dimensions: labels).record(value)
        registry.locked { $0.add(name, .gauge, labels, value, replacing: true) }
    }

    private static let registry = Mutex(Registry())

    fileprivate struct Series: Hashable, Comparable {
        let name: String
        let labels: [Label]
        static func < (a: Series, b: Series) -> Bool {
            a.name != b.name ? a.name < b.name : a.labels.lexicographicallyPrecedes(b.labels)
        }
    }

    fileprivate struct Label: Hashable, Comparable {
        let key: String
        let value: String
        static func < (a: Label, b: Label) -> Bool { (a.key, a.value) < (b.key, b.value) }
    }

    enum Kind { case counter, gauge }

    fileprivate struct Histogram {
        var counts = [UInt64](repeating: 0, count: MonitorMetrics.durationBuckets.count)
        var count: UInt64 = 0
        var sum = 0.0
    }

    struct Registry {
        var bound = LabelBound()
        fileprivate var values: [Series: (kind: Kind, value: Double)] = [:]
        fileprivate var histograms: [Series: Histogram] = [:]

        fileprivate static func series(_ name: String, _ labels: [(String, String)]) -> Series {
            Series(name: name, labels: labels.map { Label(key: $0.0, value: $0.1) }.sorted())
        }

        mutating func add(_ name: String, _ kind: Kind, _ labels: [(String, String)], _ amount: Double, replacing: Bool = false) {
            let key = Self.series(name, labels)
            let old = values[key]?.value ?? 0
            values[key] = (kind, replacing ? amount : old + amount)
        }

        mutating func observe(_ name: String, _ labels: [(String, String)], seconds: Double) {
            let key = Self.series(name, labels)
            var histogram = histograms[key] ?? Histogram()
            for (index, bound) in MonitorMetrics.durationBuckets.enumerated() where seconds <= bound { histogram.counts[index] += 1 }
            histogram.count += 1
            histogram.sum += seconds
            histograms[key] = histogram
        }

        func render() -> String {
            var out = ""
            var described: Set<String> = []
            func header(_ name: String, _ type: String) {
                guard described.insert(name).inserted else { return }
                out += "# HELP \(name) \(MonitorMetrics.help[name] ?? name)\n# TYPE \(name) \(type)\n"
            }
            for (series, entry) in values.sorted(by: { $0.key < $1.key }) {
                header(series.name, entry.kind == .counter ? "counter" : "gauge")
                out += "\(series.name)\(Self.text(series.labels)) \(Self.number(entry.value))\n"
            }
            for (series, histogram) in histograms.sorted(by: { $0.key < $1.key }) {
                header(series.name, "histogram")
                for (index, bound) in MonitorMetrics.durationBuckets.enumerated() {
                    let labels = series.labels + [Label(key: "le", value: Self.number(bound))]
                    out += "\(series.name)_bucket\(Self.text(labels)) \(histogram.counts[index])\n"
                }
                out += "\(series.name)_bucket\(Self.text(series.labels + [Label(key: "le", value: "+Inf")])) \(histogram.count)\n"
                out += "\(series.name)_sum\(Self.text(series.labels)) \(Self.number(histogram.sum))\n"
                out += "\(series.name)_count\(Self.text(series.labels)) \(histogram.count)\n"
            }
            return out
        }

        fileprivate static func text(_ labels: [Label]) -> String {
            guard !labels.isEmpty else { return "" }
            return "{" + labels.map { "\($0.key)=\"\(escaped($0.value))\"" }.joined(separator: ",") + "}"
        }

        /// A label value as the format wants it: backslash, double quote and line feed escaped.
        static func escaped(_ value: String) -> String {
            var result = ""
            for character in value {
                switch character {
                case "\\": result += "\\\\"
                case "\"": result += "\\\""
                case "\n": result += "\\n"
                default: result.append(character)
                }
            }
            return result
        }

        static func number(_ value: Double) -> String {
            if value == value.rounded(), abs(value) < 1e15 { return String(Int64(value)) }
            return "\(value)"
        }
    }

    private static let help: [String: String] = [
        MonitorReporting.MetricName.stalls: "Run loop stalls that began (held-back ones too), by loop, phase and the function stuck in.",
        MonitorReporting.MetricName.stallDuration: "Each run loop stall's total duration, when it ends.",
        MonitorReporting.MetricName.stallsSuppressed: "Stalls the back-off did not report.",
        MonitorReporting.MetricName.threadCPURatio: "Each thread's CPU share over the CPU monitor's last window.",
        MonitorReporting.MetricName.cpuHot: "Hot-thread reports of the CPU monitor.",
    ]
}
