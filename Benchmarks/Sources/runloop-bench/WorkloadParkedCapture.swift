import CBenchSupport
import Foundation
import RunLoopMonitor
import Synchronization

/// Stack capture of a thread blocked in the kernel, without a signal (ThreadStack's parked walk),
/// beside the signal capture of a running thread, in the same repetition; and how often the
/// remaining window (a thread that enters a blocking call between the monitor's look and the
/// signal's arrival) interrupts a sleep.
struct ParkedCaptureWorkload: Workload {
    var captures = 2_000
    /// Captures of the thread that alternates work and short sleeps.
    var raceCaptures = 20_000

    var name: String { "parked" }
    var title: String { "Capture of a blocked thread without a signal (RunLoopMonitor)" }
    var summary: String {
        "ThreadStack.captureAddresses(threadID:) of a thread blocked in read(2) on a pipe (parked in the kernel: its sp and pc from /proc/self/task/TID/syscall, its stack copied with process_vm_readv, walked with the unwind tables, the syscall file and CPU clock read again), \(captures.formatted()) captures back to back, round trip p50/p99; the same number of signal captures of a thread spinning on the CPU in the same repetition, for comparison. Then \(raceCaptures.formatted()) captures back to back of a thread that works 50 µs and sleeps 200 µs in usleep, over and over: how many of its sleeps a capture cut short (usleep returning -1, EINTR), per thousand captures and per thousand sleeps."
    }
    var metrics: [Metric] {
        [
            Metric("parked_p50", "parked capture round trip, p50", .microseconds, .lowerIsBetter),
            Metric("parked_p99", "parked capture round trip, p99", .microseconds, .lowerIsBetter),
            Metric("parked_frames", "frames per parked stack", .count, .higherIsBetter),
            Metric("parked_share", "captures that took the parked walk", .count, .higherIsBetter),
            Metric("signal_p50", "signal capture round trip, p50", .microseconds, .lowerIsBetter),
            Metric("signal_p99", "signal capture round trip, p99", .microseconds, .lowerIsBetter),
            Metric("race_sleeps", "sleeps during the race captures", .count, .higherIsBetter),
            Metric("race_eintr", "sleeps cut short (EINTR)", .count, .lowerIsBetter),
            Metric("eintr_per_1k_captures", "sleeps cut short per 1,000 captures", .count, .lowerIsBetter),
            Metric("eintr_per_1k_sleeps", "sleeps cut short per 1,000 sleeps", .count, .lowerIsBetter),
        ]
    }
    var implementations: [Impl] { [.runLoopKit] }

    private final class Target: Sendable {
        let stop = Atomic<Bool>(false)
        let threadID = Atomic<Int32>(0)
        let ready = Atomic<Bool>(false)
        let sleeps = Atomic<Int>(0)
        let interrupted = Atomic<Int>(0)
    }

    @inline(never)
    private static func blockInRead(_ target: Target, _ fd: Int32) {
        target.threadID.store(cbench_gettid(), ordering: .releasing)
        target.ready.store(true, ordering: .releasing)
        var byte: UInt8 = 0
        _ = read(fd, &byte, 1)
    }

    @inline(never)
    private static func spin(_ target: Target) {
        target.threadID.store(cbench_gettid(), ordering: .releasing)
        target.ready.store(true, ordering: .releasing)
        var n = 0
        while !target.stop.load(ordering: .relaxed) { n &+= 1 }
    }

    @inline(never)
    private static func workAndSleep(_ target: Target) {
        target.threadID.store(cbench_gettid(), ordering: .releasing)
        target.ready.store(true, ordering: .releasing)
        while !target.stop.load(ordering: .relaxed) {
            let until = cbench_now_ns() + 50_000
            while cbench_now_ns() < until {}
            if usleep(200) != 0 && errno == EINTR { target.interrupted.add(1, ordering: .relaxed) }
            target.sleeps.add(1, ordering: .relaxed)
        }
    }

    /// Round trips (µs, sorted) of `count` captures of `tid`, and the last stack.
    private static func roundTrips(_ tid: Int32, _ count: Int) -> ([Double], [RawStack.Unwinder], RawStack?) {
        var times: [Double] = []
        var unwinders: [RawStack.Unwinder] = []
        var last: RawStack?
        times.reserveCapacity(count)
        for _ in 0..<count {
            let started = cbench_now_ns()
            guard let stack = try? ThreadStack.captureAddresses(threadID: tid) else { continue }
            times.append(Double(cbench_now_ns() - started) / 1e3)
            unwinders.append(stack.unwinder)
            last = stack
        }
        times.sort()
        return (times, unwinders, last)
    }

    func runRunLoopKit() -> Measurement {
        do { try ThreadStack.install() } catch { fatalError("ThreadStack.install: \(error)") }
        var result: Measurement = [:]

        // A thread blocked in read(2) until the benchmark writes a byte.
        var fds: [Int32] = [0, 0]
        precondition(pipe(&fds) == 0)
        let reader = Target()
        let readFD = fds[0]
        let blocked = BenchThread { Self.blockInRead(reader, readFD) }
        while !reader.ready.load(ordering: .acquiring) { usleep(100) }
        usleep(2_000)  // in read by now
        let (parked, unwinders, stack) = Self.roundTrips(reader.threadID.load(ordering: .acquiring), captures)
        var byte: UInt8 = 1
        _ = write(fds[1], &byte, 1)
        blocked.join()
        close(fds[0])
        close(fds[1])
        result["parked_p50"] = percentile(parked, 50)
        result["parked_p99"] = percentile(parked, 99)
        result["parked_frames"] = Double(stack?.addresses.count ?? 0)
        result["parked_share"] = Double(unwinders.filter { $0 == .parkedInKernel }.count)

        // A thread spinning: every capture is a signal.
        let spinner = Target()
        let spinning = BenchThread { Self.spin(spinner) }
        while !spinner.ready.load(ordering: .acquiring) { usleep(100) }
        let (signalled, _, _) = Self.roundTrips(spinner.threadID.load(ordering: .acquiring), captures)
        spinner.stop.store(true, ordering: .relaxed)
        spinning.join()
        result["signal_p50"] = percentile(signalled, 50)
        result["signal_p99"] = percentile(signalled, 99)

        // The race: 50 µs of work, 200 µs in usleep, captured back to back.
        let racer = Target()
        let racing = BenchThread { Self.workAndSleep(racer) }
        while !racer.ready.load(ordering: .acquiring) { usleep(100) }
        let tid = racer.threadID.load(ordering: .acquiring)
        let sleepsBefore = racer.sleeps.load(ordering: .relaxed)
        var done = 0
        for _ in 0..<raceCaptures where (try? ThreadStack.captureAddresses(threadID: tid)) != nil { done += 1 }
        let sleeps = racer.sleeps.load(ordering: .relaxed) - sleepsBefore
        let interrupted = racer.interrupted.load(ordering: .relaxed)
        racer.stop.store(true, ordering: .relaxed)
        racing.join()
        result["race_sleeps"] = Double(sleeps)
        result["race_eintr"] = Double(interrupted)
        result["eintr_per_1k_captures"] = Double(interrupted) * 1000 / Double(max(done, 1))
        result["eintr_per_1k_sleeps"] = Double(interrupted) * 1000 / Double(max(sleeps, 1))
        return result
    }

    func runCF() -> Measurement { fatalError("\(name) is RunLoopKit only") }

    func targets(_ r: WorkloadResults) -> [TargetCheck] {
        guard let p99 = r.stats[.runLoopKit]?["parked_p99"] else { return [] }
        return [
            TargetCheck(
                target: "parked capture (read, walk, re-check) p99 ≤ 200 µs", met: p99.median <= 200,
                measured: String(format: "median of p99s %.1f µs (%.1f–%.1f)", p99.median, p99.min, p99.max))
        ]
    }

    func notes(_ r: WorkloadResults) -> [String] {
        [
            "RunLoopKit only: CFRunLoop and SwiftNIO cannot capture another thread's stack. A parked capture sends no signal, so the blocked read goes on; the race figures are what a signal capture can still do to a thread that runs when the monitor looks and enters a sleep before the signal arrives (the capture reads /proc/self/task/TID/syscall just before tgkill)."
        ]
    }
}
