import CRunLoopMonitor
import Glibc
import Logging
import Metrics
import RunLoopKit
import Synchronization

/// What a ``CPUMonitor`` reports.
public enum CPUEvent: Sendable {
    /// A thread stayed above the threshold for the sustained windows: its usage and stacks.
    case hot(CPUReport)
}

/// A thread that used too much CPU for too long.
public struct CPUReport: Sendable, Codable, Hashable {
    /// The thread's name (as the kernel shows it, 15 characters at most).
    public var threadName: String
    /// The thread's kernel id.
    public var threadID: Int32
    /// Its CPU share over each of the sustained windows (1.0 is one full core), oldest first.
    public var usage: [Double]
    /// The window length.
    public var window: Duration
    /// Stacks sampled when it was found hot (10, over a tenth of a window), most frequent first.
    public var stacks: [StackSample]
    /// Why no stack could be taken, when none could.
    public var captureError: String?

    /// The mean of ``usage``.
    public var averageUsage: Double { usage.isEmpty ? 0 : usage.reduce(0, +) / Double(usage.count) }

    /// Where the thread was spinning, in a word: the same rule as ``StallReport/stuckIn``.
    public var hotIn: String? { StackSample.culprit(in: stacks) }
}

/// Finds threads that keep a CPU busy: every `window` it reads each thread's CPU clock, and a
/// thread above `threshold` (a share of one core) for `sustainedWindows` windows in a row is
/// reported with its stacks, then left alone for `coolDown` (it is reported again if still hot
/// after that).
///
/// One thread (named `rlk.cpumon`) per monitor. A scan costs a directory read of
/// `/proc/self/task` and one clock read per thread (see BENCHMARKS.md: a scan of 100 threads);
/// names are read once per thread id. Reports go to the handler (on the monitor's thread), to
/// swift-log and to swift-metrics (``MonitorReporting``).
public final class CPUMonitor: Sendable {
    /// The CPU share (of one core) above which a thread counts as hot in a window.
    public let threshold: Double
    /// The window length: at least ``minimumWindow``.
    public let window: Duration
    /// The shortest window: a shorter one is raised to it. Each window reads `/proc/self/task` and
    /// every thread's clock, so a window of microseconds would keep a core busy with the monitor
    /// itself, and CPU shares over less than a few scheduler ticks are noise anyway.
    public static let minimumWindow: Duration = .milliseconds(10)
    /// How many windows in a row a thread must be hot to be reported.
    public let sustainedWindows: Int
    /// How long a reported thread is left alone.
    public let coolDown: Duration

    private let logger: Logger?
    /// The handler in a class of its own: a closure stored directly in the tuple is re-abstracted
    /// (wrapped in one more thunk) at each `inout` access of the generic `Mutex`'s value in an
    /// unoptimized build, two per window, and calling or releasing a chain of tens of thousands of
    /// thunks overflows the stack. A class reference needs no re-abstraction.
    private final class Handler: Sendable {
        let call: @Sendable (CPUEvent) -> Void
        init(_ call: @escaping @Sendable (CPUEvent) -> Void) { self.call = call }
    }

    private let state = Mutex<(stopping: Bool, started: Bool, handler: Handler?)>((false, false, nil))
    private let thread = Mutex<MonitorThread?>(nil)
    /// The process that started the monitor (0 before `start`); see ``stop()``.
    private let startedIn = Atomic<Int32>(0)

    /// A monitor of every thread of the process.
    ///
    /// - Parameters:
    ///   - threshold: CPU share of one core, in (0, 1]; must be positive.
    ///   - window: the measuring window; must be positive. Below ``minimumWindow`` it is raised to
    ///     it (a tuning value, often from a configuration: a monitor that measures a little coarser
    ///     serves better than a process stopped for it).
    ///   - sustainedWindows: windows in a row; at least 1.
    ///   - coolDown: how long a reported thread is not reported again (default: 60 s).
    ///   - logger: where hot threads are logged; nil for none.
    public init(
        threshold: Double = 0.8, window: Duration = .seconds(1), sustainedWindows: Int = 3,
        coolDown: Duration = .seconds(60), logger: Logger? = Logger(label: MonitorReporting.loggerLabel)
    ) {
        fatalPrecondition(threshold > 0 && threshold.isFinite, "CPUMonitor: threshold must be a positive share of one core (got \(threshold))")
        fatalPrecondition(window > .zero, "CPUMonitor: window must be positive (got \(window))")
        fatalPrecondition(sustainedWindows >= 1, "CPUMonitor: sustainedWindows must be at least 1 (got \(sustainedWindows))")
        self.threshold = threshold
        self.window = min(max(window, Self.minimumWindow), .seconds(365 * 86400))  // an instant plus more would overflow
        self.sustainedWindows = sustainedWindows
        self.coolDown = min(max(.zero, coolDown), .seconds(365 * 86400))
        self.logger = logger
    }

    /// Starts the monitor's thread; `handler` runs on it. Once.
    public func start(_ handler: @escaping @Sendable (CPUEvent) -> Void) {
        let first = state.locked { state -> Bool in
            defer { state.handler = Handler(handler); state.started = true }
            return !state.started
        }
        fatalPrecondition(first, "CPUMonitor.start(_:) called twice; a monitor starts once (make another one)")
        startedIn.store(getpid(), ordering: .releasing)
        try? ThreadStack.install()
        let scanner = CPUScanner(monitor: self)
        thread.locked {
            $0 = MonitorThread(name: "rlk.cpumon") { [self] in
                scanner.run()
                // Let go of the handler: one that captures the monitor would keep both alive.
                let handler = state.locked { state in
                    defer { state.handler = nil }
                    return state.handler
                }
                _ = consume handler
            }
        }
    }

    /// Stops the monitor and waits for its thread (returns at once from inside the handler). Any
    /// thread; later calls do nothing. In a child made by `fork()`, where the monitor's thread
    /// does not exist, it returns at once without touching it.
    public func stop() {
        let owner = startedIn.load(ordering: .acquiring)
        if owner != 0 && owner != getpid() { return }  // a forked child: nothing runs here
        state.locked { $0.stopping = true }
        guard let thread = thread.locked({ $0 }) else { return }
        thread.wake()
        if thread.isCurrent { thread.detach() } else { thread.join() }
    }

    /// Runs `count` windows of the monitor's scan on the calling thread, each at once instead of at
    /// its end, with the state accesses a real window makes (a test's way to run many windows
    /// fast). Only while the monitor runs (its own thread keeps scanning meanwhile).
    package func runWindowsForTesting(_ count: Int) {
        CPUScanner(monitor: self).run(windows: count, waits: false)
    }

    fileprivate var isStopping: Bool { state.locked { $0.stopping } }

    fileprivate func sleep(until deadline: ContinuousClock.Instant) { thread.locked { $0 }?.sleep(until: deadline) }

    fileprivate func emit(_ report: CPUReport) {
        logger?.warning(
            "thread keeps a CPU busy",
            metadata: [
                "thread": "\(report.threadName)", "tid": "\(report.threadID)",
                "cpu_percent": "\(Int(report.averageUsage * 100))", "hot_in": "\(report.hotIn ?? "?")",
            ])
        MonitorMetrics.increment(MonitorReporting.MetricName.cpuHot, [("thread", report.threadName)])
        state.locked { $0.handler }?.call(.hot(report))
    }
}

/// One thread's CPU share over the time between two ``ThreadCPUSampler/sample(now:)`` calls.
public struct ThreadCPUUsage: Sendable, Hashable {
    /// The thread's kernel id.
    public var threadID: Int32
    /// Its name (read once per thread id).
    public var name: String
    /// CPU time over wall time (1.0 is one full core).
    public var usage: Double
}

/// Per-thread CPU from the threads' CPU clocks: what ``CPUMonitor`` runs each window, for
/// callers that want the numbers themselves.
///
/// - Complexity: one read of `/proc/self/task` and one `clock_gettime` per thread per sample; a
///   thread's name is read (`/proc/self/task/<tid>/comm`) the first time it is seen.
public struct ThreadCPUSampler: Sendable {
    struct Thread {
        var name: String
        var lastCPU: Duration
        var hotWindows: [Double] = []
        var quietUntil: ContinuousClock.Instant?
    }

    var threads: [Int32: Thread] = [:]
    var lastScan: ContinuousClock.Instant?

    /// A sampler that has seen no thread yet.
    public init() {}

    /// Reads every thread's CPU clock; returns each thread's share of one core since the last
    /// sample (none on the first).
    public mutating func sample(now: ContinuousClock.Instant = .now) -> [ThreadCPUUsage] {
        let elapsed = lastScan.map { now - $0 } ?? .zero
        lastScan = now
        var seen = Set<Int32>()
        var usages: [ThreadCPUUsage] = []
        for id in ProcessThreads.ids() {
            guard let cpu = ProcessThreads.cpuTime(of: id) else { continue }
            seen.insert(id)
            if var thread = threads[id] {
                if elapsed > .zero {
                    usages.append(ThreadCPUUsage(threadID: id, name: thread.name, usage: max(0, (cpu - thread.lastCPU).seconds / elapsed.seconds)))
                }
                thread.lastCPU = cpu
                threads[id] = thread
            } else {
                threads[id] = Thread(name: ProcessThreads.name(of: id) ?? "tid \(id)", lastCPU: cpu)
            }
        }
        for id in threads.keys where !seen.contains(id) { threads[id] = nil }
        return usages
    }
}

private final class CPUScanner: @unchecked Sendable {
    // @unchecked: made by start() (or runWindowsForTesting), then used only on the one thread
    // that calls run().
    let monitor: CPUMonitor
    var scan = ThreadCPUSampler()

    init(monitor: CPUMonitor) { self.monitor = monitor }

    /// Scans every window until the monitor stops. `limit` windows at most; `waits: false` scans
    /// the next window at once instead of at its end (``CPUMonitor/runWindowsForTesting(_:)``).
    func run(windows limit: Int = .max, waits: Bool = true) {
        let ownID = ProcessThreads.ownID
        var next = ContinuousClock.now
        _ = scan.sample(now: next)
        var windows = 0
        while windows < limit, !monitor.isStopping {
            windows += 1
            next = next + monitor.window
            if waits { monitor.sleep(until: next) }
            if monitor.isStopping { break }
            let now = ContinuousClock.now
            if now - next > monitor.window { next = now }  // fell behind (suspended): start over
            for entry in scan.sample(now: now) where entry.threadID != ownID {
                let (id, usage) = (entry.threadID, entry.usage)
                guard var thread = scan.threads[id] else { continue }
                MonitorMetrics.set(MonitorReporting.MetricName.threadCPURatio, [("thread", thread.name)], usage)
                if let quietUntil = thread.quietUntil, now < quietUntil {
                    scan.threads[id] = thread
                    continue
                }
                if usage >= monitor.threshold {
                    // Read the name again when a thread turns hot: it may have named itself since.
                    if thread.hotWindows.isEmpty { thread.name = ProcessThreads.name(of: id) ?? thread.name }
                    thread.hotWindows.append(usage)
                } else {
                    thread.hotWindows.removeAll()
                }
                if thread.hotWindows.count >= monitor.sustainedWindows {
                    let usageList = Array(thread.hotWindows.suffix(monitor.sustainedWindows))
                    thread.hotWindows.removeAll()
                    thread.quietUntil = now + monitor.coolDown
                    scan.threads[id] = thread
                    report(id, thread.name, usageList)
                } else {
                    scan.threads[id] = thread
                }
            }
        }
    }

    private func report(_ id: Int32, _ name: String, _ usage: [Double]) {
        var sampler = StackSampler(threadID: id)
        let spacing = monitor.window / 100
        for index in 0..<10 {
            guard sampler.sample(timeout: .milliseconds(100)) else { break }
            if index < 9 { monitor.sleep(until: .now + spacing) }
        }
        monitor.emit(
            CPUReport(
                // The name now: a thread may have named itself after it was first seen.
                threadName: ProcessThreads.name(of: id) ?? name, threadID: id, usage: usage, window: monitor.window, stacks: sampler.samples(),
                captureError: sampler.sampleCount == 0 ? sampler.lastError?.description : nil))
    }
}
