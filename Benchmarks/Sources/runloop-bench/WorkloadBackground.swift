import CBenchSupport
import CoreFoundation
import Foundation
import NIOCore
import NIOPosix
import RunLoopKit
import RunLoopMonitor
import RunLoopScheduling

import class RunLoopKit.RunLoop

/// Idle and background cost: what a loop costs the machine while it has nothing to do, or only
/// background work. Wakeups and CPU per second of the threads the implementation started for the
/// scenario (its loop's thread, and a monitor's), and of the whole process but the measuring
/// thread.
struct BackgroundWorkload: Workload {
    var windowNs: UInt64 = 2_000_000_000
    var timers = 1_000
    var timerInterval: Duration = .seconds(1)
    var tolerance: Duration = .milliseconds(100)

    var name: String { "background" }
    var title: String { "Idle and background cost" }
    var summary: String {
        "Wakeups and CPU per second over \(windowNs / 1_000_000_000) s, once the process has settled (under 10% of a core over 200 ms), of: (a) an idle loop (a keep-alive source, nothing else); (b) \(timers.formatted()) repeating timers of 1 s, first fire dates spread at random over a second, tolerance 100 ms (RunLoopKit and CF: the timers' tolerance; NIO: scheduleRepeatedTask, which has none); (c) a 60 Hz display link (RunLoopKit: DisplayLink; CF and NIO, which have none: a 60 Hz repeating timer or task); (d) the idle loop watched by a StallMonitor with its default settings (RunLoopKit only). Wakeups: the context switches (/proc/self/task/*/status) of the threads the implementation started for the scenario (its loop's thread; in (d) the monitor's threads too: every thread that appeared from the loop's creation to the end of the settling); CPU: those threads' CPU clocks. Then the same for the whole process: every thread but the measuring one and a control thread blocked in sem_wait; CPU from getrusage, less the measuring thread's own."
    }

    private enum Scenario: String, CaseIterable {
        case idle, timers, display, watched

        var label: String {
            switch self {
            case .idle: "idle loop"
            case .timers: "1,000 tolerant 1 s timers"
            case .display: "60 Hz display link"
            case .watched: "idle loop, StallMonitor on"
            }
        }
    }

    var metrics: [Metric] {
        Scenario.allCases.flatMap { scenario in
            [
                Metric("wakeups_per_s_\(scenario.rawValue)", "wakeups/s, \(scenario.label)", .count, .lowerIsBetter),
                Metric("cpu_us_per_s_\(scenario.rawValue)", "CPU µs/s, \(scenario.label)", .microseconds, .lowerIsBetter),
            ]
        }
            + Scenario.allCases.flatMap { scenario in
                [
                    Metric(
                        "process_wakeups_per_s_\(scenario.rawValue)", "whole process: wakeups/s, \(scenario.label)", .count,
                        .lowerIsBetter),
                    Metric(
                        "process_cpu_us_per_s_\(scenario.rawValue)", "whole process: CPU µs/s, \(scenario.label)",
                        .microseconds, .lowerIsBetter),
                ]
            }
    }

    /// The 1,000 timers' first fire dates, in nanoseconds from now: spread over one interval.
    private var phases: [Int64] {
        randomOffsets(timers, in: 0..<timerInterval.nanosecondsValue, seed: 0x5EED_0037)
    }

    /// Wakeups and CPU per second of everything but this thread, over the window, with the
    /// scenario set up. First the process settles: until it uses less than 10% of a core over
    /// 200 ms (at most 20 s), so that a start-up's work (a StallMonitor's first start loads the
    /// symbol tables in the background) is not counted as the steady cost; that work's CPU is
    /// recorded as `settle_cpu_ms_<scenario>`.
    private func measure(_ scenario: Scenario, threadsBefore: Set<Int32>, into m: inout Measurement) {
        let control = cbench_control_thread_start()
        defer { cbench_control_thread_stop() }
        let settleStart = processCPUNanoseconds()
        let settleDeadline = cbench_now_ns() + 20_000_000_000
        while true {
            let before = processCPUNanoseconds()
            usleep(200_000)
            if processCPUNanoseconds() - before < 20_000_000 || cbench_now_ns() > settleDeadline { break }
        }
        m["settle_cpu_ms_\(scenario.rawValue)"] = Double(processCPUNanoseconds() - settleStart) / 1e6
        let me = cbench_gettid()
        // The implementation's threads: those that appeared since before its loop was made.
        let own = threadIDs().subtracting(threadsBefore).subtracting([me, control])
        let switches = threadSwitches(excluding: [me, control])
        let ownCPUBefore = own.map { cbench_thread_cpu_ns_of($0) }
        let cpu = processCPUNanoseconds()
        let ownCPU = threadCPUNanoseconds()
        let start = cbench_now_ns()
        let end = start + windowNs
        while cbench_now_ns() < end { usleep(UInt32((end - min(end, cbench_now_ns())) / 1000)) }
        let elapsed = Double(cbench_now_ns() - start) / 1e9
        // Not this thread's (its sleeps and its reading of /proc).
        let cpuUsed = (processCPUNanoseconds() - cpu) - Int64(threadCPUNanoseconds() - ownCPU)
        let switchesAfter = threadSwitches(excluding: [me, control])
        // Threads present at the end: their switches since the start (all of them for a thread
        // started meanwhile). A thread that ended meanwhile cannot be read any more; none should.
        let wakeups = switchesAfter.reduce(0) { sum, entry in sum + entry.value - switches[entry.key, default: 0] }
        m["process_wakeups_per_s_\(scenario.rawValue)"] = Double(wakeups) / elapsed
        m["process_cpu_us_per_s_\(scenario.rawValue)"] = Double(cpuUsed) / 1e3 / elapsed
        // An implementation's thread that exited within the window cannot be read any more: it
        // is left out of both sums and counted apart (none should).
        let readable = own.filter { switches[$0] != nil && switchesAfter[$0] != nil }
        let ownWakeups = readable.reduce(0) { sum, tid in sum + switchesAfter[tid]! - switches[tid]! }
        let implementationCPU = zip(own, ownCPUBefore).reduce(Int64(0)) { sum, entry in
            let after = cbench_thread_cpu_ns_of(entry.0)
            return sum + (after >= 0 && entry.1 >= 0 ? after - entry.1 : 0)
        }
        m["threads_\(scenario.rawValue)"] = Double(own.count)
        if readable.count < own.count { m["threads_exited_\(scenario.rawValue)"] = Double(own.count - readable.count) }
        m["wakeups_per_s_\(scenario.rawValue)"] = Double(ownWakeups) / elapsed
        m["cpu_us_per_s_\(scenario.rawValue)"] = Double(implementationCPU) / 1e3 / elapsed
    }

    /// The ids of this process's threads now.
    private func threadIDs() -> Set<Int32> {
        let names = (try? FileManager.default.contentsOfDirectory(atPath: "/proc/self/task")) ?? []
        return Set(names.compactMap { Int32($0) })
    }

    /// Context switches of every thread of this process but `excluded`, by thread id.
    private func threadSwitches(excluding excluded: Set<Int32>) -> [Int32: Int] {
        var switches: [Int32: Int] = [:]
        for tid in threadIDs().subtracting(excluded) {
            let count = cbench_thread_context_switches(tid)
            if count >= 0 { switches[tid] = count }
        }
        precondition(!switches.isEmpty, "cannot read /proc/self/task")
        return switches
    }

    func runRunLoopKit() -> Measurement {
        var m = Measurement()
        for scenario in Scenario.allCases {
            let before = threadIDs()
            let host = RunLoopKitHost()
            let loop = host.loop
            let (tolerance, interval, phases) = (self.tolerance, self.timerInterval, self.phases)
            let made = host.sync { () -> Unchecked<(timers: [RunLoopTimer], link: DisplayLink?, monitor: StallMonitor?)> in
                switch scenario {
                case .idle: return Unchecked(([], nil, nil))
                case .timers:
                    let now = ContinuousClock.now
                    let timers = phases.map { phase in
                        RunLoopTimer(fireAt: now + .nanoseconds(phase), interval: interval, tolerance: tolerance) { _ in }
                    }
                    for timer in timers { loop.add(timer, forMode: .default) }
                    return Unchecked((timers, nil, nil))
                case .display:
                    return Unchecked(([], DisplayLink(loop: loop, modes: [.default], framesPerSecond: 60) { _ in }, nil))
                case .watched:
                    let monitor = StallMonitor(loops: [loop], logger: nil)
                    monitor.start { _ in }
                    return Unchecked(([], nil, monitor))
                }
            }
            measure(scenario, threadsBefore: before, into: &m)
            made.value.monitor?.stop()
            host.sync {
                for timer in made.value.timers { timer.invalidate() }
                made.value.link?.invalidate()
            }
            host.shutdown()
        }
        return m
    }

    func runCF() -> Measurement {
        var m = Measurement()
        for scenario in [Scenario.idle, .timers, .display] {
            let before = threadIDs()
            let host = CFHost()
            let (tolerance, interval, phases) = (
                Double(tolerance.nanosecondsValue) / 1e9, Double(timerInterval.nanosecondsValue) / 1e9, self.phases
            )
            let made = host.sync { () -> Unchecked<[CFRunLoopTimer?]> in
                let loop = CFRunLoopGetCurrent()
                let now = cfNow()
                let timers: [CFRunLoopTimer?]
                switch scenario {
                case .timers:
                    timers = phases.map { phase in
                        let timer = CFRunLoopTimerCreateWithHandler(
                            kCFAllocatorDefault, now + Double(phase) / 1e9, interval, 0, 0
                        ) { _ in }
                        CFRunLoopTimerSetTolerance(timer, tolerance)
                        return timer
                    }
                case .display:
                    timers = [CFRunLoopTimerCreateWithHandler(kCFAllocatorDefault, now + 1.0 / 60, 1.0 / 60, 0, 0) { _ in }]
                default:
                    timers = []
                }
                for timer in timers { CFRunLoopAddTimer(loop, timer, kCFRunLoopDefaultMode) }
                return Unchecked(timers)
            }
            measure(scenario, threadsBefore: before, into: &m)
            host.sync { for timer in made.value { CFRunLoopTimerInvalidate(timer) } }
            host.shutdown()
        }
        return m
    }

    func runNIO() -> Measurement {
        var m = Measurement()
        for scenario in [Scenario.idle, .timers, .display] {
            let before = threadIDs()
            let host = NIOHost()
            let loop = host.loop
            let (interval, phases) = (timerInterval.nanosecondsValue, self.phases)
            let tasks = host.sync { () -> [RepeatedTask] in
                switch scenario {
                case .timers:
                    return phases.map { phase in
                        loop.scheduleRepeatedTask(initialDelay: .nanoseconds(phase), delay: .nanoseconds(interval)) { _ in }
                    }
                case .display:
                    let frame = TimeAmount.nanoseconds(1_000_000_000 / 60)
                    return [loop.scheduleRepeatedTask(initialDelay: frame, delay: frame) { _ in }]
                default:
                    return []
                }
            }
            measure(scenario, threadsBefore: before, into: &m)
            host.sync { for task in tasks { task.cancel() } }
            host.shutdown()
        }
        return m
    }

    func targets(_ r: WorkloadResults) -> [TargetCheck] {
        var checks: [TargetCheck] = []
        if let idle = r.stats[.runLoopKit]?["wakeups_per_s_idle"] {
            checks.append(
                TargetCheck(
                    target: "an idle loop: 0 wakeups/s", met: idle.median == 0,
                    measured: String(format: "median %.2f/s, max %.2f/s", idle.median, idle.max)))
        }
        // The timers' fire dates cover one interval; each wakeup may serve every timer due within
        // the tolerance, so a second holds interval / tolerance deadline groups (10), one more
        // where the groups do not line up with the second.
        let groups = Double(timerInterval.nanosecondsValue / tolerance.nanosecondsValue)
        if let tolerant = r.stats[.runLoopKit]?["wakeups_per_s_timers"] {
            checks.append(
                TargetCheck(
                    target: "1,000 tolerant timers: no more wakeups than deadline groups (\(Int(groups)) + 1 per second)",
                    met: tolerant.median <= groups + 1,
                    measured: String(format: "median %.1f/s (%.1f–%.1f)", tolerant.median, tolerant.min, tolerant.max)))
        }
        return checks
    }

    func notes(_ r: WorkloadResults) -> [String] {
        var lines = [
            "A wakeup here is a context switch of a thread the implementation started for the scenario: the loop's, and the monitor's threads in (d). Threads that were there before (the runtime's, the harness's) are not counted in the first rows; the whole process's rows count them. CF and NIO have no StallMonitor: (d) is RunLoopKit's alone."
        ]
        if let settle = r.stats[.runLoopKit]?["settle_cpu_ms_watched"] {
            lines.append(
                String(
                    format:
                        "Before (d) settled: %.0f ms of CPU in the first repetition (a StallMonitor's first start in a process loads the symbol tables on its symbolication threads, in the background, once), %.1f ms as the median of all.",
                    settle.samples.first ?? 0, settle.median))
        }
        return lines
    }
}

extension Duration {
    /// The whole duration in nanoseconds (the benchmark's durations are far from overflowing).
    fileprivate var nanosecondsValue: Int64 {
        let (seconds, attoseconds) = components
        return seconds * 1_000_000_000 + attoseconds / 1_000_000_000
    }
}
