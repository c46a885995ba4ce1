import CBenchSupport
import Foundation
import RunLoopKit

import class RunLoopKit.RunLoop

/// 21. The main actor's executor: RunLoop.main installed by RunLoopConcurrency vs the platform's
/// (libdispatch's main queue drained by CFRunLoop's main loop) vs an actor pinned to a SwiftNIO
/// event loop. Each is its own process (`mainactor-bench`, built beside this program): the main
/// actor's executor is chosen once per process.
struct MainActorWorkload: Workload {
    var name: String { "mainactor" }
    var title: String { "Main-actor executor: hops and Task.sleep lateness" }
    var summary: String {
        "Two tasks on the global pool each call a main-actor (NIO: NIO-pinned actor) function 100,000 times: calls/s (each call hops there and back). Then one pool task makes 20,000 such calls one at a time: each round trip's latency p50/p99. Then 400 sequential Task.sleep(for: .milliseconds(1)) on that executor: lateness p50/p99 (µs past the 1 ms). RunLoopKit: RunLoop.main installed as the main executor (mainactor-bench runloopkit); the loop clock's sleep (Task.sleep(for:clock: RunLoop.main.clock)) is reported beside it. CFRunLoop column: the platform's main executor (libdispatch's main queue) drained by CFRunLoopRun() on the main thread. One child process per repetition and implementation."
    }
    var metrics: [Metric] {
        [
            Metric("calls_per_s", "main-actor calls/s (2 pool tasks)", .perSecond, .higherIsBetter),
            Metric("hop_p50_us", "one hop there and back, p50 (1 pool task)", .microseconds, .lowerIsBetter),
            Metric("hop_p99_us", "one hop there and back, p99 (1 pool task)", .microseconds, .lowerIsBetter),
            Metric("sleep_p50_us", "Task.sleep(1 ms) lateness p50", .microseconds, .lowerIsBetter),
            Metric("sleep_p99_us", "Task.sleep(1 ms) lateness p99", .microseconds, .lowerIsBetter),
            Metric("sleep_p50_us_loopclock", "loop-clock sleep(1 ms) lateness p50", .microseconds, .lowerIsBetter),
            Metric("sleep_p99_us_loopclock", "loop-clock sleep(1 ms) lateness p99", .microseconds, .lowerIsBetter),
        ]
    }

    private func child(_ mode: String) -> Measurement {
        let exe = URL(fileURLWithPath: CommandLine.arguments[0]).resolvingSymlinksInPath()
        let process = Process()
        process.executableURL = exe.deletingLastPathComponent().appendingPathComponent("mainactor-bench")
        process.arguments = [mode]
        let out = Pipe()
        process.standardOutput = out
        do { try process.run() } catch { fatalError("mainactor: cannot run mainactor-bench: \(error)") }
        let data = out.fileHandleForReading.readDataToEndOfFile()
        process.waitUntilExit()
        guard process.terminationStatus == 0 else { fatalError("mainactor-bench \(mode) exited with \(process.terminationStatus)") }
        var measurement: Measurement = [:]
        for line in String(decoding: data, as: UTF8.self).split(separator: "\n") {
            let parts = line.split(separator: "=", maxSplits: 1)
            if parts.count == 2, let value = Double(parts[1]) { measurement[String(parts[0])] = value }
        }
        return measurement
    }

    func runRunLoopKit() -> Measurement { child("runloopkit") }
    func runCF() -> Measurement { child("platform") }
    func runNIO() -> Measurement { child("nio") }

    func targets(_ r: WorkloadResults) -> [TargetCheck] {
        [
            .ratio("main-actor calls ≥ 1.5× the platform's", r.advantage("calls_per_s", over: .cf), atLeast: 1.5),
            .ratio("main-actor hop p99 ≤ the platform's", r.advantage("hop_p99_us", over: .cf), atLeast: 1),
            .ratio("Task.sleep lateness p50 ≤ the platform's", r.advantage("sleep_p50_us", over: .cf), atLeast: 1),
            .ratio("Task.sleep lateness p99 ≤ the platform's", r.advantage("sleep_p99_us", over: .cf), atLeast: 1),
        ]
    }
}

/// 22. A `ticks(every:)` consumer at 1 kHz: allocations per tick on the loop's thread and the
/// loop thread's CPU share, with the consumer a task that prefers the loop.
struct TicksWorkload: Workload {
    var ticks = 2_000
    var name: String { "ticks" }
    var title: String { "Async ticks at 1 kHz" }
    var summary: String {
        "A task that prefers a RunLoopKit loop reads loop.ticks(every: .milliseconds(1)) for \(ticks.formatted()) ticks: mallocs on the loop's thread per tick (the timer's callout, the channel, the consumer's resumption, all on that thread), and the loop thread's CPU time over wall time."
    }
    var metrics: [Metric] {
        [
            Metric("allocs_per_tick", "mallocs per tick (loop thread)", .count, .lowerIsBetter),
            Metric("cpu_share", "loop thread CPU / wall", .count, .lowerIsBetter),
            Metric("ticks_per_s", "ticks read per second", .perSecond, .higherIsBetter),
        ]
    }
    var implementations: [Impl] { [.runLoopKit] }

    func runRunLoopKit() -> Measurement {
        let host = RunLoopKitHost()
        defer { host.shutdown() }
        let loop = host.loop
        let target = ticks
        let done = DispatchSemaphore(value: 0)
        let result = Box<Measurement>([:])
        Task(executorPreference: loop) {
            var count = 0
            var cpuStart = timespec()
            var wallStart: UInt64 = 0
            for await _ in loop.ticks(every: .milliseconds(1)) {
                count += 1
                if count == 100 {
                    // Steady state from here.
                    cbench_alloc_counter_start()
                    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &cpuStart)
                    wallStart = cbench_now_ns()
                }
                if count == 100 + target { break }
            }
            let allocations = cbench_alloc_counter_stop()
            var cpuEnd = timespec()
            clock_gettime(CLOCK_THREAD_CPUTIME_ID, &cpuEnd)
            let wall = Double(cbench_now_ns() - wallStart) / 1e9
            let cpu = Double(cpuEnd.tv_sec - cpuStart.tv_sec) + Double(cpuEnd.tv_nsec - cpuStart.tv_nsec) / 1e9
            result.value = [
                "allocs_per_tick": Double(allocations) / Double(target), "cpu_share": cpu / wall,
                "ticks_per_s": Double(target) / wall,
            ]
            done.signal()
        }
        done.wait()
        return result.value
    }

    func runCF() -> Measurement { fatalError("ticks has no CF equivalent") }

    func targets(_ r: WorkloadResults) -> [TargetCheck] { [] }
}
