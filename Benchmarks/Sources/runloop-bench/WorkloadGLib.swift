import Foundation

/// 28. RunLoopGLib: GLib idle dispatches per second with RunLoop.main driving GLib's default
/// context (GLibBridge) against the same idle under GLib's own `g_main_loop_run`, run by
/// `glib-bench alternate` (built beside this program: `swift build -c release --package-path
/// Benchmarks --product glib-bench`, so that only that target needs glib-2.0's development
/// files). Each process runs both in turns, 200 ms windows, and reports each one's median and the
/// median of the rounds' ratios: two processes of one binary differ by up to a third in speed on
/// a shared VM, so the target is judged on the ratio within a process.
struct GLibWorkload: Workload {
    var name: String { "glib" }
    var title: String { "RunLoopGLib: GLib idle dispatches" }
    var summary: String {
        "One G_PRIORITY_DEFAULT GLib idle that always continues: RunLoopKit column, a loop drives the context through GLibBridge (one GLib iteration per pass, a version-0 callout: check, dispatch, then prepare/query for the next pass); GLib column, g_main_loop_run on the same context. On the main thread (RunLoop.main, GLib's default context) and on a thread of its own (its loop, a context of its own). One glib-bench process per repetition and implementation, running both in turns (7 rounds of a 200 ms window each); 'bridge / plain' is the median of the rounds' ratios within that process (the targets' figure). Dispatches per second."
    }
    var metrics: [Metric] {
        [
            Metric("dispatches_per_s", "idle dispatches/s, main thread", .perSecond, .higherIsBetter),
            Metric("dispatches_per_s_thread", "idle dispatches/s, a thread of its own", .perSecond, .higherIsBetter),
            Metric("bridge_over_plain", "bridge / plain in one process, main thread", .count, .higherIsBetter),
            Metric("bridge_over_plain_thread", "bridge / plain in one process, a thread", .count, .higherIsBetter),
        ]
    }
    var implementations: [Impl] { [.runLoopKit, .glib] }

    private func child(_ mode: String) -> Measurement {
        let exe = URL(fileURLWithPath: CommandLine.arguments[0]).resolvingSymlinksInPath()
        let path = exe.deletingLastPathComponent().appendingPathComponent("glib-bench")
        guard FileManager.default.isExecutableFile(atPath: path.path) else {
            fatalError("glib: \(path.path) is missing; build it first: swift build -c release --package-path Benchmarks --product glib-bench")
        }
        let process = Process()
        process.executableURL = path
        process.arguments = [mode]
        let out = Pipe()
        process.standardOutput = out
        do { try process.run() } catch { fatalError("glib: cannot run glib-bench: \(error)") }
        let data = out.fileHandleForReading.readDataToEndOfFile()
        process.waitUntilExit()
        guard process.terminationStatus == 0 else { fatalError("glib-bench \(mode) exited with \(process.terminationStatus)") }
        var measurement: Measurement = [:]
        for line in String(decoding: data, as: UTF8.self).split(separator: "\n") {
            let parts = line.split(separator: "=", maxSplits: 1)
            if parts.count == 2, let value = Double(parts[1]) { measurement[String(parts[0])] = value }
        }
        return measurement
    }

    /// The bridge's figures and the in-process ratios (RunLoopKit's column).
    func runRunLoopKit() -> Measurement {
        child("alternate").filter { !$0.key.hasPrefix("plain_") }
    }
    func runCF() -> Measurement { fatalError("glib has no CFRunLoop equivalent") }
    /// GLib's own loop's figures, from a process of its own that also ran the bridge.
    func runGLib() -> Measurement {
        var plain: Measurement = [:]
        for (key, value) in child("alternate") where key.hasPrefix("plain_") {
            plain[String(key.dropFirst("plain_".count))] = value
        }
        return plain
    }

    func targets(_ r: WorkloadResults) -> [TargetCheck] {
        [
            .ratio("RunLoop.main's bridge ≥ 0.8× g_main_loop_run (in one process)", r.median(.runLoopKit, "bridge_over_plain"), atLeast: 0.8),
            .ratio("a loop thread's bridge ≥ 0.8× g_main_loop_run (in one process)", r.median(.runLoopKit, "bridge_over_plain_thread"), atLeast: 0.8),
        ]
    }
}
