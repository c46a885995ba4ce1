import CBenchSupport
import Foundation
import RunLoopKit
import RunLoopMonitor

import class RunLoopKit.RunLoop

/// The stall monitor's own cost per watched loop: CPU its threads use per second of wall time
/// while it watches 1, 16 and 64 idle loops (each asleep in its wait, as most loops of a server or
/// an app are most of the time), at the default threshold and sample interval.
struct MonitorCostWorkload: Workload {
    var loopCounts = [1, 16, 64]
    var measured: Duration = .seconds(2)

    var name: String { "monitorcost" }
    var title: String { "The stall monitor's own CPU per watched loop" }
    var summary: String {
        "A StallMonitor (threshold 250 ms, sample interval 50 ms, logger nil) watches N idle PermanentThread loops (N = \(loopCounts.map(String.init).joined(separator: ", "))); after 0.5 s, the CPU time of its two threads (rlk.stallmon, rlk.stallrep: their thread CPU clocks, from /proc/self/task/TID/stat's utime + stime and the threads' CLOCK_THREAD_CPUTIME clocks) over \(Int(measured.components.seconds)) s of wall time, as CPU milliseconds per second."
    }
    var metrics: [Metric] {
        loopCounts.flatMap { n in
            [
                Metric("cpu_ms_per_s_\(n)", "monitor CPU ms per second, \(n) loop\(n == 1 ? "" : "s")", .count, .lowerIsBetter),
                Metric("cpu_us_per_s_per_loop_\(n)", "per watched loop, µs of CPU per second (\(n))", .count, .lowerIsBetter),
            ]
        }
    }
    var implementations: [Impl] { [.runLoopKit] }

    func runRunLoopKit() -> Measurement {
        var measurement: Measurement = [:]
        for n in loopCounts {
            let workers = (0..<n).map { PermanentThread(name: "watched-\($0)") }
            let monitor = StallMonitor(loops: workers.map(\.loop), logger: nil)
            monitor.start { _ in }
            usleep(500_000)
            let threads = Self.monitorThreads()
            let before = threads.map(Self.cpuNanoseconds).reduce(0, +)
            let start = cbench_now_ns()
            usleep(UInt32(measured.components.seconds) * 1_000_000)
            let wall = Double(cbench_now_ns() - start) / 1e9
            let used = Double(threads.map(Self.cpuNanoseconds).reduce(0, +) - before) / 1e6
            monitor.stop()
            for worker in workers { worker.stop() }
            measurement["cpu_ms_per_s_\(n)"] = used / wall
            measurement["cpu_us_per_s_per_loop_\(n)"] = used / wall * 1000 / Double(n)
        }
        return measurement
    }

    func runCF() -> Measurement { fatalError("\(name) is RunLoopKit only") }

    /// The monitor's threads, by name.
    static func monitorThreads() -> [Int32] {
        let tasks = (try? FileManager.default.contentsOfDirectory(atPath: "/proc/self/task")) ?? []
        return tasks.compactMap { task in
            let comm = (try? String(contentsOfFile: "/proc/self/task/\(task)/comm", encoding: .utf8)) ?? ""
            return comm.hasPrefix("rlk.stallmon") || comm.hasPrefix("rlk.stallrep") ? Int32(task) : nil
        }
    }

    /// A thread's CPU time (its CPU clock, `((~tid) << 3) | 6`).
    static func cpuNanoseconds(_ tid: Int32) -> Int64 {
        var now = timespec()
        guard clock_gettime(clockid_t((~tid) << 3 | 6), &now) == 0 else { return 0 }
        return Int64(now.tv_sec) * 1_000_000_000 + Int64(now.tv_nsec)
    }

    func notes(_ r: WorkloadResults) -> [String] {
        ["RunLoopKit only: CFRunLoop and SwiftNIO have no stall monitor. The loops are idle (the common case); a stalled loop adds one stack sample per sample interval (see `capture` and `parkedcapture`)."]
    }

    func targets(_ r: WorkloadResults) -> [TargetCheck] { [] }
}

/// The first stall report of a fresh process: how long after the stall's start its `began` report
/// is delivered (the symbol tables are still loading then), and its `ended` report.
struct FirstReportWorkload: Workload {
    var name: String { "firstreport" }
    var title: String { "The first stall report of a fresh process" }
    var summary: String {
        "firstreport-bench, a fresh process per repetition: a StallMonitor (threshold 100 ms, sample interval 20 ms) starts, and at once a loop's block spins 300 ms. began: from the block's start to the began report's delivery, less the 100 ms threshold (the monitor's promise: within one sample interval); ended: from the block's end to the ended report's delivery."
    }
    var metrics: [Metric] {
        [
            Metric("began_late_ms", "began report, ms after threshold", .count, .lowerIsBetter),
            Metric("ended_ms", "ended report, ms after the stall's end", .count, .lowerIsBetter),
            Metric("began_symbolicated", "began report symbolicated (1) or not yet (0)", .count, .higherIsBetter),
        ]
    }
    var implementations: [Impl] { [.runLoopKit] }

    func runRunLoopKit() -> Measurement {
        let exe = URL(fileURLWithPath: CommandLine.arguments[0]).resolvingSymlinksInPath()
        let process = Process()
        process.executableURL = exe.deletingLastPathComponent().appendingPathComponent("firstreport-bench")
        let out = Pipe()
        process.standardOutput = out
        do { try process.run() } catch { fatalError("firstreport: cannot run firstreport-bench: \(error)") }
        let data = out.fileHandleForReading.readDataToEndOfFile()
        process.waitUntilExit()
        guard process.terminationStatus == 0 else { fatalError("firstreport-bench exited with \(process.terminationStatus)") }
        var measurement: Measurement = [:]
        for line in String(decoding: data, as: UTF8.self).split(separator: "\n") {
            let parts = line.split(separator: "=", maxSplits: 1)
            if parts.count == 2, let value = Double(parts[1]), metrics.contains(where: { $0.key == parts[0] }) {
                measurement[String(parts[0])] = value
            }
        }
        return measurement
    }

    func runCF() -> Measurement { fatalError("\(name) is RunLoopKit only") }

    func targets(_ r: WorkloadResults) -> [TargetCheck] {
        guard let late = r.stats[.runLoopKit]?["began_late_ms"] else { return [] }
        return [
            TargetCheck(
                target: "the first began report within 2 sample intervals (40 ms) of the threshold", met: late.max <= 40,
                measured: String(format: "median %.1f ms (%.1f–%.1f)", late.median, late.min, late.max))
        ]
    }
}
