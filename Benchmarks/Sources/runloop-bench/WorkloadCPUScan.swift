import CBenchSupport
import Foundation
import RunLoopMonitor

/// 14. Per-thread CPU scan (RunLoopMonitor's ThreadCPUSampler, what a CPUMonitor runs each window).
struct CPUScanWorkload: Workload {
    var sleepers = 100
    var scans = 200

    var name: String { "cpuscan" }
    var title: String { "Per-thread CPU scan (RunLoopMonitor)" }
    var summary: String {
        "ThreadCPUSampler().sample(): a read of /proc/self/task and one thread CPU clock per thread. Timed \(scans) times back to back (after a first scan, which also reads every thread's name, timed apart) with the process's own threads only, then with \(sleepers) more pthreads asleep in sem_wait (DispatchSemaphore); p50 and p99 per scan, and the cost per added thread: (p50 with them − p50 without) / the number of threads added."
    }
    var metrics: [Metric] {
        [
            Metric("threads_base", "threads, own only", .count, .lowerIsBetter),
            Metric("scan_p50_base", "scan p50, own threads only", .microseconds, .lowerIsBetter),
            Metric("threads", "threads, with the sleepers", .count, .lowerIsBetter),
            Metric("first_scan", "first scan (names read), with the sleepers", .microseconds, .lowerIsBetter),
            Metric("scan_p50", "scan p50, with the sleepers", .microseconds, .lowerIsBetter),
            Metric("scan_p99", "scan p99, with the sleepers", .microseconds, .lowerIsBetter),
            Metric("per_thread", "per thread (p50 / threads)", .microseconds, .lowerIsBetter),
            Metric("per_added_thread", "per added thread (Δp50 / Δthreads)", .microseconds, .lowerIsBetter),
        ]
    }
    var implementations: [Impl] { [.runLoopKit] }

    /// Times `scans` samples after a first one: (first, sorted others in µs, threads seen).
    private func timeScans() -> (first: Double, sorted: [Double], threads: Int) {
        var sampler = ThreadCPUSampler()
        var started = cbench_now_ns()
        _ = sampler.sample()
        let first = Double(cbench_now_ns() - started) / 1e3
        var times: [Double] = []
        times.reserveCapacity(scans)
        var threads = 0
        for _ in 0..<scans {
            started = cbench_now_ns()
            let usages = sampler.sample()
            times.append(Double(cbench_now_ns() - started) / 1e3)
            threads = usages.count
        }
        return (first, times.sorted(), threads)
    }

    func runRunLoopKit() -> Measurement {
        let base = timeScans()
        let release = DispatchSemaphore(value: 0)
        let ready = DispatchSemaphore(value: 0)
        let threads = (0..<sleepers).map { _ in
            BenchThread {
                ready.signal()
                release.wait()
            }
        }
        for _ in 0..<sleepers { ready.wait() }
        usleep(20_000)  // every sleeper past its signal and blocked in the kernel
        let loaded = timeScans()
        for _ in 0..<sleepers { release.signal() }
        threads.forEach { $0.join() }
        let p50 = percentile(loaded.sorted, 50)
        let baseP50 = percentile(base.sorted, 50)
        return [
            "threads_base": Double(base.threads), "scan_p50_base": baseP50, "threads": Double(loaded.threads),
            "first_scan": loaded.first, "scan_p50": p50, "scan_p99": percentile(loaded.sorted, 99),
            "per_thread": p50 / Double(max(1, loaded.threads)),
            "per_added_thread": (p50 - baseP50) / Double(max(1, loaded.threads - base.threads)),
        ]
    }

    func runCF() -> Measurement { fatalError("\(name) is RunLoopKit only") }

    func notes(_ r: WorkloadResults) -> [String] {
        [
            "RunLoopKit only: CFRunLoop and SwiftNIO have no per-thread CPU sampler, so they have no column. The scans run on the benchmark's main thread; the sleepers use no CPU."
        ]
    }

    func targets(_ r: WorkloadResults) -> [TargetCheck] { [] }
}
