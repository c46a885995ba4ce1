import Foundation

/// 29. A GTK 4 window's main thread: RunLoopKit driving GTK through RunLoopGLib's `GLibBridge`,
/// against GLib owning the thread (`g_main_loop_run`) with the main queue served by a 50 ms
/// tickler (swift-cross-ui's way) or by a GSource on the main queue's eventfd. Each repetition is a
/// process of its own (`gtk-bench`, built beside this program with `--traits GTK`) on an Xvfb
/// display of its own.
struct GTKWorkload: Workload {
    var name: String { "gtk" }
    var title: String { "A GTK 4 window: the main queue's latency and idle wakeups" }
    var summary: String {
        "A GTK 4 window under Xvfb (GSK_RENDERER=cairo). A worker posts 100 DispatchQueue.main.async blocks one at a time, 1–60 ms apart (random: any phase of the tickler's 50 ms): latency from post to run, p50/p99. Then the window idles for 2 s: the main thread's voluntary context switches per second (each a sleep that ended). RunLoopKit: RunLoop.main with GLibBridge attached (gtk-bench bridge). GLib + tickler: g_main_loop_run, the main queue drained by a 50 ms g_timeout (gtk-bench tickler). GLib main loop: g_main_loop_run, the main queue served by a GSource on _dispatch_get_main_queue_handle_4CF (gtk-bench glibloop). Needs `--traits GTK` and Xvfb."
    }
    var metrics: [Metric] {
        [
            Metric("latency_p50_us", "main-queue block latency p50", .microseconds, .lowerIsBetter),
            Metric("latency_p99_us", "main-queue block latency p99", .microseconds, .lowerIsBetter),
            Metric("idle_wakeups_per_s", "idle window: main-thread wakeups/s", .count, .lowerIsBetter),
        ]
    }
    var implementations: [Impl] { [.runLoopKit, .glib, .glibTickler] }

    private func child(_ mode: String) -> Measurement {
        let exe = URL(fileURLWithPath: CommandLine.arguments[0]).resolvingSymlinksInPath()
        let process = Process()
        process.executableURL = exe.deletingLastPathComponent().appendingPathComponent("gtk-bench")
        process.arguments = [mode]
        let out = Pipe()
        process.standardOutput = out
        do { try process.run() } catch { fatalError("gtk: cannot run gtk-bench: \(error)") }
        let data = out.fileHandleForReading.readDataToEndOfFile()
        process.waitUntilExit()
        let text = String(decoding: data, as: UTF8.self)
        if text.hasPrefix("skip=") { fatalError("gtk: \(text.dropFirst(5))") }
        guard process.terminationStatus == 0 else { fatalError("gtk-bench \(mode) exited with \(process.terminationStatus): \(text)") }
        var measurement: Measurement = [:]
        for line in text.split(separator: "\n") {
            let parts = line.split(separator: "=", maxSplits: 1)
            if parts.count == 2, let value = Double(parts[1]) { measurement[String(parts[0])] = value }
        }
        return measurement
    }

    func runRunLoopKit() -> Measurement { child("bridge") }
    func runCF() -> Measurement { fatalError("gtk has no CF column") }
    func runGLibTickler() -> Measurement { child("tickler") }
    func runGLib() -> Measurement { child("glibloop") }

    func targets(_ r: WorkloadResults) -> [TargetCheck] {
        var checks: [TargetCheck] = [
            .ratio("main-queue p99 better than the 50 ms tickler's", r.advantage("latency_p99_us", over: .glibTickler), atLeast: 1),
        ]
        if let mine = r.median(.runLoopKit, "idle_wakeups_per_s"), let theirs = r.median(.glib, "idle_wakeups_per_s") {
            // Counted, so compared as counts: at most half a wakeup a second more (0 against 0 is met).
            checks.append(
                TargetCheck(
                    target: "idle wakeups/s no more than g_main_loop_run's", met: mine <= theirs + 0.5,
                    measured: String(format: "%.1f vs %.1f", mine, theirs)))
        }
        return checks
    }
}
