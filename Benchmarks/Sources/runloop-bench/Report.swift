import Foundation

// The table printed to stdout and the same figures as JSON (`--json FILE`).

enum Format {
    static func value(_ v: Double, _ unit: Metric.Unit) -> String {
        guard v.isFinite else { return "—" }
        switch unit {
        case .perSecond: return scaled(v) + "/s"
        case .seconds:
            return v >= 1
                ? String(format: "%.2f s", v)
                : v >= 1e-3 ? String(format: "%.2f ms", v * 1e3) : String(format: "%.1f µs", v * 1e6)
        case .microseconds:
            return v >= 1000
                ? String(format: "%.2f ms", v / 1e3)
                : v >= 100 ? String(format: "%.0f µs", v) : String(format: "%.1f µs", v)
        case .nanoseconds: return nanos(v * 1e-9 * 1e9)
        case .bytes:
            return v >= 1e6
                ? String(format: "%.1f MB", v / 1e6)
                : v >= 1e4 ? String(format: "%.1f kB", v / 1e3) : String(format: "%.0f B", v)
        case .count: return v == v.rounded() ? String(format: "%.0f", v) : String(format: "%.3f", v)
        }
    }

    /// 2.91 M, 315 k, 12.3.
    static func scaled(_ v: Double) -> String {
        if abs(v) >= 1e6 { return String(format: "%.2f M", v / 1e6) }
        if abs(v) >= 1e3 { return String(format: "%.0f k", v / 1e3) }
        return String(format: "%.1f", v)
    }

    static func nanos(_ ns: Double) -> String {
        ns >= 1e3 ? String(format: "%.2f µs", ns / 1e3) : String(format: "%.0f ns", ns)
    }

    /// "4.68 M/s (4.61–4.75)": the median with its unit, the range in the same scale.
    static func cell(_ s: Stats, _ unit: Metric.Unit) -> String {
        guard s.median.isFinite else { return "—" }
        let (divisor, suffix, digits): (Double, String, Int)
        switch unit {
        case .perSecond:
            (divisor, suffix, digits) =
                s.median >= 1e6 ? (1e6, " M/s", 2) : s.median >= 1e3 ? (1e3, " k/s", 0) : (1, "/s", 1)
        case .seconds:
            (divisor, suffix, digits) =
                s.median >= 1 ? (1, " s", 2) : s.median >= 1e-3 ? (1e-3, " ms", 2) : (1e-6, " µs", 1)
        case .microseconds:
            (divisor, suffix, digits) =
                s.median >= 1000 ? (1e3, " ms", 2) : s.median >= 100 ? (1, " µs", 0) : (1, " µs", 1)
        case .nanoseconds: (divisor, suffix, digits) = (1, " ns", 0)
        case .bytes: (divisor, suffix, digits) = s.median >= 1e4 ? (1e3, " kB", 1) : (1, " B", 0)
        case .count:
            let whole = [s.median, s.min, s.max].allSatisfy { $0 == $0.rounded() }
            (divisor, suffix, digits) = (1, "", whole ? 0 : 3)
        }
        func f(_ v: Double) -> String { String(format: "%.\(digits)f", v / divisor) }
        return "\(f(s.median))\(suffix) (\(f(s.min))–\(f(s.max)))"
    }

    static func pad(_ s: String, _ width: Int) -> String {
        let n = s.count
        return n >= width ? s + " " : s + String(repeating: " ", count: width - n)
    }
}

/// The machine the figures come from.
struct Machine: Codable, Sendable {
    let nproc: Int
    let cpu: String
    let kernel: String
    let swift: String

    static func current() -> Machine {
        let cpuinfo = (try? String(contentsOfFile: "/proc/cpuinfo", encoding: .utf8)) ?? ""
        let model =
            cpuinfo.split(separator: "\n").first { $0.hasPrefix("model name") }
            .flatMap { $0.split(separator: ":", maxSplits: 1).last }
            .map { $0.trimmingCharacters(in: .whitespaces) } ?? "unknown"
        var u = utsname()
        uname(&u)
        let kernel = withUnsafeBytes(of: &u.release) { String(decoding: $0.prefix { $0 != 0 }, as: UTF8.self) }
        return Machine(
            nproc: ProcessInfo.processInfo.activeProcessorCount, cpu: model, kernel: kernel, swift: swiftVersion())
    }

    private static func swiftVersion() -> String {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/usr/bin/env")
        process.arguments = ["swift", "--version"]
        let pipe = Pipe()
        process.standardOutput = pipe
        process.standardError = Pipe()
        do {
            try process.run()
            let data = pipe.fileHandleForReading.readDataToEndOfFile()
            process.waitUntilExit()
            if let line = String(decoding: data, as: UTF8.self).split(separator: "\n").first(where: {
                $0.contains("Swift version")
            }) {
                return String(line)
            }
        } catch {}
        return "unknown"
    }
}

struct MetricReport: Codable {
    let key: String
    let label: String
    let unit: String
    let direction: Direction
    /// Statistics by implementation name.
    let results: [String: Stats]
    /// How many times better RunLoopKit's median is, by other implementation's name.
    let runLoopKitAdvantage: [String: Double]
}

struct WorkloadReport: Codable {
    let name: String
    let title: String
    let summary: String
    let implementations: [String]
    let metrics: [MetricReport]
    let targets: [TargetCheck]
    let notes: [String]
}

struct BenchReport: Codable {
    let date: String
    let command: String
    let machine: Machine
    let reps: Int
    let seconds: Double
    let workloads: [WorkloadReport]
}

func makeReport(_ r: WorkloadResults) -> WorkloadReport {
    let w = r.workload
    let metrics = w.allMetrics.map { m -> MetricReport in
        var results: [String: Stats] = [:]
        var advantage: [String: Double] = [:]
        for impl in w.implementations {
            if let s = r.stats[impl]?[m.key] { results[impl.rawValue] = s }
            if impl != .runLoopKit, let a = r.advantage(m.key, over: impl) { advantage[impl.rawValue] = a }
        }
        return MetricReport(
            key: m.key, label: m.label, unit: m.unit.rawValue, direction: m.direction, results: results,
            runLoopKitAdvantage: advantage)
    }
    return WorkloadReport(
        name: w.name, title: w.title, summary: w.summary, implementations: w.implementations.map(\.rawValue),
        metrics: metrics, targets: w.targets(r), notes: w.notes(r))
}

/// The text table of one workload.
func renderTable(_ index: Int, _ r: WorkloadResults, _ report: WorkloadReport) -> String {
    let w = r.workload
    var out = "\(index). \(w.title) [\(w.name)]\n"
    out += wrap(w.summary, indent: "   ") + "\n"
    let labelWidth = max(26, w.allMetrics.map { $0.label.count + 2 }.max() ?? 0)
    let cell = 27
    out += "   " + Format.pad("median (min–max)", labelWidth)
    for impl in w.implementations { out += Format.pad(impl.rawValue, cell) }
    out += "\n"
    for m in w.allMetrics {
        out += "   " + Format.pad(m.label, labelWidth)
        for impl in w.implementations {
            guard let s = r.stats[impl]?[m.key] else {
                out += Format.pad("—", cell)
                continue
            }
            out += Format.pad(Format.cell(s, m.unit), cell)
        }
        out += "\n"
    }
    for m in report.metrics where !m.runLoopKitAdvantage.isEmpty {
        let parts = w.implementations.compactMap { impl in
            m.runLoopKitAdvantage[impl.rawValue].map { String(format: "%.2f× %@", $0, impl.rawValue) }
        }
        out += "   RunLoopKit advantage, \(m.label): \(parts.joined(separator: ", "))\n"
    }
    // Stability: the worst tenth of the runs against the median, as a fraction of it (the goal:
    // ≥ 0.7): p10 / median for a throughput, median / p90 for a time. With 5 repetitions or more.
    for m in w.metrics where m.unit != .count && m.unit != .bytes {
        let parts = w.implementations.compactMap { impl -> String? in
            guard let s = r.stats[impl]?[m.key], s.samples.count >= 5, s.median > 0, s.p90 > 0 else { return nil }
            let worstTenth = m.direction == .higherIsBetter ? s.p10 / s.median : s.median / s.p90
            return String(format: "%@ %.2f", impl.rawValue, worstTenth)
        }
        if !parts.isEmpty { out += "   stability (worst tenth / median), \(m.label): \(parts.joined(separator: ", "))\n" }
    }
    for note in report.notes { out += wrap(note, indent: "   ") + "\n" }
    for t in report.targets {
        out += "   target \(t.target): \(t.met ? "MET" : "MISSED") (\(t.measured))\n"
    }
    return out.split(separator: "\n", omittingEmptySubsequences: false)
        .map { String($0.reversed().drop(while: { $0 == " " }).reversed()) }.joined(separator: "\n")
}

/// Wraps text at 100 columns with an indent.
func wrap(_ text: String, indent: String, width: Int = 100) -> String {
    if text.hasPrefix(" ") { return indent + text }
    var lines: [String] = []
    var line = ""
    for word in text.split(separator: " ") {
        if !line.isEmpty && indent.count + line.count + 1 + word.count > width {
            lines.append(indent + line)
            line = String(word)
        } else {
            line += line.isEmpty ? String(word) : " " + word
        }
    }
    if !line.isEmpty { lines.append(indent + line) }
    return lines.joined(separator: "\n")
}

func writeJSON(_ report: BenchReport, to path: String) throws {
    let encoder = JSONEncoder()
    encoder.outputFormatting = [.prettyPrinted, .sortedKeys]
    encoder.nonConformingFloatEncodingStrategy = .convertToString(
        positiveInfinity: "inf", negativeInfinity: "-inf", nan: "nan")
    try encoder.encode(report).write(to: URL(fileURLWithPath: path))
}

/// The headline tables, in Markdown (BENCHMARKS.md's first table): each workload that names a
/// headline metric, RunLoopKit beside its peers and its same-policy floor, with CPU and
/// allocations per unit of work; then what the spin after a wakeup buys and costs. Nil when no
/// such workload ran.
func renderHeadline(_ results: [WorkloadResults]) -> String? {
    let rows = results.filter { $0.workload.headline != nil }
    guard !rows.isEmpty else { return nil }
    let peers: [Impl] = [.runLoopKit, .cf, .nio, .floor]
    func median(_ r: WorkloadResults, _ impl: Impl, _ key: String, _ unit: Metric.Unit) -> String {
        r.median(impl, key).map { Format.value($0, unit) } ?? "—"
    }
    func ratio(_ r: WorkloadResults, _ key: String, _ other: Impl) -> String {
        r.advantage(key, over: other).map { String(format: "%.2f×", $0) } ?? "—"
    }
    var out = """
        Headline: RunLoopKit against its peers and its same-policy C floor (medians of the run; a
        ratio is how many times better RunLoopKit is, so against the floor ≥ 0.83 is within 1.2×;
        CPU and allocations per unit of work count every thread; stability is RunLoopKit's worst
        tenth over its median)

        | workload | RunLoopKit | CFRunLoop | SwiftNIO | C floor | vs floor | vs CF | vs NIO | CPU/op RunLoopKit | CPU/op CF | CPU/op NIO | CPU/op floor | allocs/op RunLoopKit | allocs/op floor | stability |
        |---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|

        """
    for r in rows {
        let w = r.workload
        guard let key = w.headline, let metric = w.allMetrics.first(where: { $0.key == key }) else { continue }
        var cells = ["\(w.name): \(metric.label)"]
        cells += peers.map { median(r, $0, key, metric.unit) }
        cells += [ratio(r, key, .floor), ratio(r, key, .cf), ratio(r, key, .nio)]
        cells += peers.map { impl in r.median(impl, MetricKey.cpu).map { Format.nanos($0) } ?? "—" }
        cells += [Impl.runLoopKit, .floor].map { impl in
            r.median(impl, MetricKey.allocations).map { Format.value($0, .count) } ?? "—"
        }
        let stability = r.stats[.runLoopKit]?[key].flatMap { s -> String? in
            guard s.samples.count >= 5, s.median > 0, s.p90 > 0 else { return nil }
            return String(format: "%.2f", metric.direction == .higherIsBetter ? s.p10 / s.median : s.median / s.p90)
        }
        cells.append(stability ?? "—")
        out += "| " + cells.joined(separator: " | ") + " |\n"
    }
    let spinning = rows.filter { $0.workload.implementations.contains(.runLoopKitSpinOff) }
    if !spinning.isEmpty {
        out += """

            The spin after a wakeup (RunLoop.wakeUpSpinWindow, 5 µs by default), on and off

            | workload | RunLoopKit | RunLoopKit, spin off | C floor | C floor, spin off | CPU/op RunLoopKit | CPU/op spin off | CPU/op floor | CPU/op floor, spin off |
            |---|---|---|---|---|---|---|---|---|

            """
        for r in spinning {
            let w = r.workload
            guard let key = w.headline, let metric = w.allMetrics.first(where: { $0.key == key }) else { continue }
            let impls: [Impl] = [.runLoopKit, .runLoopKitSpinOff, .floor, .floorSpinOff]
            var cells = ["\(w.name): \(metric.label)"]
            cells += impls.map { median(r, $0, key, metric.unit) }
            cells += impls.map { impl in r.median(impl, MetricKey.cpu).map { Format.nanos($0) } ?? "—" }
            out += "| " + cells.joined(separator: " | ") + " |\n"
        }
    }
    return out
}
