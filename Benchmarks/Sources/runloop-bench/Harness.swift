import CBenchSupport
import Foundation

// The harness: implementations, metrics, workloads, interleaved repetitions, statistics, ratios
// and targets. Workloads live one per file (`Workload*.swift`); `Report.swift` prints and encodes.

/// An event-loop implementation under test.
enum Impl: String, CaseIterable, Codable, Sendable {
    /// The name `--impl` takes.
    var option: String {
        switch self {
        case .runLoopKit: "runloopkit"
        case .runLoopKitSpinOff: "runloopkit-nospin"
        case .cf: "cf"
        case .nio: "nio"
        case .floor: "floor"
        case .floorSpinOff: "floor-nospin"
        case .glib: "glib"
        case .glibTickler: "tickler"
        }
    }

    case runLoopKit = "RunLoopKit"
    case cf = "CFRunLoop"
    case nio = "SwiftNIO"
    case floor = "C floor"
    /// RunLoopKit with `wakeUpSpinWindow = .zero` (the workloads whose loops are woken by another
    /// thread: what the 5 µs spin after a wakeup buys, and what it costs in CPU).
    case runLoopKitSpinOff = "RunLoopKit, spin off"
    /// The same-policy floor without the spin after a wakeup.
    case floorSpinOff = "C floor, spin off"
    /// GLib's own main loop (`g_main_loop_run`), for RunLoopGLib's bridge.
    case glib = "GLib main loop"
    /// GLib's own main loop with the main queue drained by a 50 ms timeout, as swift-cross-ui's
    /// "tickler" does (the `gtk` workload).
    case glibTickler = "GLib + 50 ms tickler"
}

/// How good a bigger value is.
enum Direction: String, Codable, Sendable {
    case higherIsBetter, lowerIsBetter
}

/// One figure a workload measures, e.g. "blocks/s".
struct Metric: Sendable {
    let key: String
    let label: String
    let unit: Unit
    let direction: Direction

    init(_ key: String, _ label: String, _ unit: Unit, _ direction: Direction) {
        self.key = key
        self.label = label
        self.unit = unit
        self.direction = direction
    }

    enum Unit: String, Codable, Sendable {
        case perSecond = "/s"
        case seconds = "s"
        case microseconds = "µs"
        case nanoseconds = "ns"
        case bytes = "B"
        case count = ""
    }
}

/// The keys of the per-unit-of-work metrics every workload with ``Workload/operations`` has.
enum MetricKey {
    static let cpu = "cpu_ns_per_op"
    static let allocations = "allocs_per_op"
    /// The machine's cache-line round trip between two threads, taken just before a repetition
    /// (`cbench_line_round_trip_ns`): on a virtual machine it changes from one second to the next
    /// with where the host runs the virtual CPUs, and cross-thread figures follow it.
    static let lineRoundTrip = "line_round_trip_ns"
}

/// One repetition's figures, by metric key. A key may be missing where an implementation has no
/// equivalent (for example NIO's observer-less loop).
typealias Measurement = [String: Double]

/// A workload: the same work done on each implementation it applies to.
protocol Workload: Sendable {
    /// The name `--only` takes.
    var name: String { get }
    var title: String { get }
    /// What is measured and how, one or two sentences.
    var summary: String { get }
    var metrics: [Metric] { get }
    var implementations: [Impl] { get }
    func runRunLoopKit() -> Measurement
    func runCF() -> Measurement
    func runNIO() -> Measurement
    func runFloor() -> Measurement
    func runRunLoopKitSpinOff() -> Measurement
    func runFloorSpinOff() -> Measurement
    func runGLib() -> Measurement
    func runGLibTickler() -> Measurement
    /// The issue's targets, judged on the medians of this run.
    func targets(_ results: WorkloadResults) -> [TargetCheck]
    /// Extra lines under the table (derived figures, caveats).
    func notes(_ results: WorkloadResults) -> [String]
    /// The units of work one repetition does (blocks, messages, round trips, fires), for CPU per
    /// unit of work: nil where a repetition mixes several kinds of work.
    var operations: (count: Int, name: String)? { get }
    /// The metric that stands for the workload in the headline table (RunLoopKit against the
    /// floor and its peers): nil keeps it out of that table.
    var headline: String? { get }
    /// Whether each repetition records the machine's cache-line round trip just before it
    /// (``MetricKey/lineRoundTrip``): the workloads whose figures ride on cross-core latency.
    var probesMachine: Bool { get }
}

extension Workload {
    var implementations: [Impl] { [.runLoopKit, .cf, .nio] }
    func runNIO() -> Measurement { fatalError("\(name) has no SwiftNIO equivalent") }
    func runFloor() -> Measurement { fatalError("\(name) has no floor") }
    func runRunLoopKitSpinOff() -> Measurement { fatalError("\(name) has no spin-off variant") }
    func runFloorSpinOff() -> Measurement { fatalError("\(name) has no spin-off floor") }
    func runGLib() -> Measurement { fatalError("\(name) has no GLib main loop equivalent") }
    func runGLibTickler() -> Measurement { fatalError("\(name) has no GLib tickler equivalent") }
    func notes(_ results: WorkloadResults) -> [String] { [] }
    var operations: (count: Int, name: String)? { nil }
    var headline: String? { nil }
    var probesMachine: Bool { false }

    /// Every metric of the table: the workload's own, then CPU and allocations per unit of work
    /// where it has one.
    var allMetrics: [Metric] {
        var all = metrics
        if let operations {
            all += [
                Metric(
                    Self.cpuKey, "CPU per \(operations.name) (user+system, every thread)", .nanoseconds, .lowerIsBetter),
                Metric(Self.allocsKey, "allocations per \(operations.name) (every thread)", .count, .lowerIsBetter),
            ]
        }
        if probesMachine {
            all.append(
                Metric(
                    MetricKey.lineRoundTrip, "the machine: a cache line's round trip between two threads, just before",
                    .nanoseconds, .lowerIsBetter))
        }
        return all
    }

    static var cpuKey: String { MetricKey.cpu }
    static var allocsKey: String { MetricKey.allocations }

    func run(_ impl: Impl) -> Measurement {
        switch impl {
        case .runLoopKit: runRunLoopKit()
        case .cf: runCF()
        case .nio: runNIO()
        case .floor: runFloor()
        case .runLoopKitSpinOff: runRunLoopKitSpinOff()
        case .floorSpinOff: runFloorSpinOff()
        case .glib: runGLib()
        case .glibTickler: runGLibTickler()
        }
    }
}

/// Median, minimum and maximum of one metric on one implementation over the repetitions.
struct Stats: Codable, Sendable {
    let median: Double
    let min: Double
    let max: Double
    /// The 10th and 90th percentiles (nearest rank): with 10 repetitions, the lowest and the
    /// highest. The stability goal: p10 ≥ 0.7× the median of a throughput.
    let p10: Double
    let p90: Double
    let samples: [Double]

    init?(_ samples: [Double]) {
        guard let first = samples.first else { return nil }
        let sorted = samples.sorted()
        let mid = sorted.count / 2
        self.median = sorted.count % 2 == 1 ? sorted[mid] : (sorted[mid - 1] + sorted[mid]) / 2
        self.min = sorted.first ?? first
        self.max = sorted.last ?? first
        func rank(_ fraction: Double) -> Double {
            sorted[Swift.min(sorted.count - 1, Swift.max(0, Int((fraction * Double(sorted.count)).rounded(.up)) - 1))]
        }
        self.p10 = rank(0.1)
        self.p90 = rank(0.9)
        self.samples = samples
    }
}

/// A workload's statistics, by implementation and metric key.
struct WorkloadResults: Sendable {
    let workload: any Workload
    let stats: [Impl: [String: Stats]]

    func median(_ impl: Impl, _ key: String) -> Double? { stats[impl]?[key]?.median }

    /// How many times better RunLoopKit's median is than `other`'s (> 1: RunLoopKit is better):
    /// a throughput ratio for higher-is-better metrics, a time ratio for lower-is-better ones.
    func advantage(_ key: String, over other: Impl) -> Double? {
        guard let metric = workload.allMetrics.first(where: { $0.key == key }),
            let mine = median(.runLoopKit, key), let theirs = median(other, key)
        else { return nil }
        switch metric.direction {
        case .higherIsBetter: return theirs == 0 ? nil : mine / theirs
        case .lowerIsBetter: return mine == 0 ? nil : theirs / mine
        }
    }
}

/// One target of the issue, MET or MISSED.
struct TargetCheck: Codable, Sendable {
    let target: String
    let met: Bool
    let measured: String
}

/// Runs workloads with interleaved repetitions: repetition 1 of every implementation, then
/// repetition 2, ..., the starting implementation rotating so none always runs first.
struct Harness {
    let reps: Int
    /// Implementations to run (all when empty): `--impl`, for profiling one of them.
    let only: Set<Impl>
    let log: (String) -> Void

    func run(_ workload: any Workload) -> WorkloadResults {
        var samples: [Impl: [String: [Double]]] = [:]
        let impls = workload.implementations.filter { only.isEmpty || only.contains($0) }
        for rep in 0..<reps {
            for i in 0..<impls.count {
                let impl = impls[(i + rep) % impls.count]
                // Outside the repetition's CPU and allocation counts: 20,000 round trips, 2-20 ms.
                let lineRoundTrip = workload.probesMachine ? cbench_line_round_trip_ns(20_000) : nil
                let started = cbench_now_ns()
                let cpuBefore = processCPUNanoseconds()
                let counting = workload.operations != nil && cbench_alloc_counter_available()
                if counting { cbench_alloc_process_start() }
                var measurement = workload.run(impl)
                let allocations = counting ? cbench_alloc_process_stop() : 0
                let cpu = processCPUNanoseconds() - cpuBefore
                let seconds = Double(cbench_now_ns() - started) / 1e9
                if let operations = workload.operations, measurement[MetricKey.cpu] == nil {
                    // The whole repetition (unless the workload measured a part of it): its
                    // threads' set-up and teardown are in it, a small part of the work.
                    measurement[MetricKey.cpu] = Double(cpu) / Double(operations.count)
                }
                if let operations = workload.operations, counting, measurement[MetricKey.allocations] == nil {
                    // Likewise the whole repetition's, every thread's: set-up included.
                    measurement[MetricKey.allocations] = Double(allocations) / Double(operations.count)
                }
                if let lineRoundTrip { measurement[MetricKey.lineRoundTrip] = lineRoundTrip }
                for (key, value) in measurement { samples[impl, default: [:]][key, default: []].append(value) }
                let shown = workload.allMetrics.compactMap { metric in
                    measurement[metric.key].map { "\(metric.key)=\(Format.value($0, metric.unit))" }
                }
                log(
                    "  [\(workload.name)] rep \(rep + 1)/\(reps) \(impl.rawValue): \(shown.joined(separator: " ")) (\(String(format: "%.1f", seconds)) s)"
                )
            }
        }
        var stats: [Impl: [String: Stats]] = [:]
        for (impl, byKey) in samples {
            for (key, values) in byKey { stats[impl, default: [:]][key] = Stats(values) }
        }
        return WorkloadResults(workload: workload, stats: stats)
    }
}

/// One timed section: wall-clock seconds, the calling thread's CPU time, and every thread's
/// allocations (-1 where the counter is unavailable, as under a sanitizer).
struct Timed: Sendable {
    var seconds: Double
    var cpuNs: UInt64
    var allocations: Int
}

/// Times `body` on the calling thread: see ``Timed``.
func timed(_ body: () -> Void) -> Timed {
    let counting = cbench_alloc_counter_available()
    if counting { cbench_alloc_process_start() }
    let cpu = threadCPUNanoseconds()
    let start = cbench_now_ns()
    body()
    let end = cbench_now_ns()
    let cpuEnd = threadCPUNanoseconds()
    let allocations = counting ? cbench_alloc_process_stop() : -1
    return Timed(seconds: seconds(from: start, to: end), cpuNs: cpuEnd - cpu, allocations: allocations)
}

/// The calling thread's CPU time in nanoseconds (CLOCK_THREAD_CPUTIME_ID), for a workload that
/// measures CPU per unit of work on the one thread doing it.
func threadCPUNanoseconds() -> UInt64 { cbench_thread_cpu_ns() }

/// The process's user and system CPU time, every thread's (getrusage RUSAGE_SELF), in nanoseconds.
func processCPUNanoseconds() -> Int64 {
    var usage = rusage()
    getrusage(RUSAGE_SELF.rawValue, &usage)
    func ns(_ t: timeval) -> Int64 { Int64(t.tv_sec) * 1_000_000_000 + Int64(t.tv_usec) * 1_000 }
    return ns(usage.ru_utime) + ns(usage.ru_stime)
}

// MARK: - Shared plumbing for the workloads

/// A mutable box for state confined to one thread (a loop's) or handed over through a semaphore.
final class Box<Value>: @unchecked Sendable {
    var value: Value
    init(_ value: Value) { self.value = value }
}

/// Carries a value that is not `Sendable` (CF objects) into a `@Sendable` closure; the workloads
/// use it only where the handover is ordered by a semaphore or the value is thread-safe (CF's
/// run-loop functions that CF documents as callable from any thread).
struct Unchecked<Value>: @unchecked Sendable {
    let value: Value
    init(_ value: Value) { self.value = value }
}

/// A pthread that can be joined: a loop's thread-exit teardown (RunLoopKit's and CF's both run in
/// thread-specific-data destructors) finishes before `join()` returns, so it never overlaps the
/// next measurement.
final class BenchThread: @unchecked Sendable {
    private var handle = pthread_t()

    private final class Body {
        let run: @Sendable () -> Void
        init(_ run: @escaping @Sendable () -> Void) { self.run = run }
    }

    init(_ body: @escaping @Sendable () -> Void) {
        let context = Unmanaged.passRetained(Body(body)).toOpaque()
        let rc = pthread_create(
            &handle, nil,
            { raw in
                Unmanaged<Body>.fromOpaque(raw!).takeRetainedValue().run()
                return nil
            }, context)
        precondition(rc == 0, "pthread_create failed: \(rc)")
    }

    func join() { pthread_join(handle, nil) }

    /// Runs `body` on a new thread, waits for it to exit, and returns its result.
    static func run<T>(_ body: @escaping @Sendable () -> T) -> T {
        let result = Box<T?>(nil)
        let thread = BenchThread { result.value = body() }
        thread.join()
        return result.value!
    }
}

/// A seeded generator (SplitMix64), so every implementation gets the same random fire dates.
struct SplitMix64: RandomNumberGenerator {
    var state: UInt64
    init(seed: UInt64) { state = seed }
    mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }
}

/// `count` random offsets in nanoseconds, uniform in `range`, from a fixed seed.
func randomOffsets(_ count: Int, in range: Range<Int64>, seed: UInt64) -> [Int64] {
    var rng = SplitMix64(seed: seed)
    return (0..<count).map { _ in Int64.random(in: range, using: &rng) }
}

/// Seconds between two `cbench_now_ns()` readings.
func seconds(from start: UInt64, to end: UInt64) -> Double { Double(end &- start) / 1e9 }

/// The p-th percentile (0...100) of sorted values, nearest rank.
func percentile(_ sorted: [Double], _ p: Double) -> Double {
    guard !sorted.isEmpty else { return .nan }
    let rank = Int((p / 100 * Double(sorted.count)).rounded(.up)) - 1
    return sorted[min(max(rank, 0), sorted.count - 1)]
}
