import CRunLoopLab
import Foundation
import RunLoopMonitor
import Synchronization

/// Experiment (seed 001, HCCMonitor's `updateCPUInfo`): ``CPUMonitor`` finds a thread that keeps a
/// core busy and says what it is running.
struct HotThread: Experiment {
    let title = "CPU monitor: a thread spinning on a core, found and caught in the act"
    let seed = Seed.cite(0, 1)
    let seedSays = """
        Seeds 000/001 (HCCMonitor's updateCPUInfo): an NSTimer every 3 s walks task_threads; a thread \
        whose thread_basic_info cpu_usage / 10 is above 70 ("cup 消耗大于 70 时打印和记录堆栈": \
        above 70, print and record the stack) gets its stack logged. The windows and the \
        three-window rule are CPUMonitor's, not the seed's.
        """
    let summary = """
        Seed 001 also reads every thread's CPU every 3 s (thread_info's cpu_usage above 70 % logs \
        the thread's stack). Here a thread 'spinner' hashes in spinComputingHashes() until it is \
        told to stop; a CPUMonitor(threshold: 0.7, window: .milliseconds(200), sustainedWindows: 3) \
        reads every thread's CPU clock each window, reports the spinner after three hot windows in \
        a row with its stacks, and the spinner is stopped once the report is in.
        """

    static let threshold = 0.7
    static let window = Duration.milliseconds(200)
    static let sustainedWindows = 3
    /// How long the experiment waits for the report before it gives up (and stops the spinner).
    static let patience = Duration.seconds(10)

    func run() {
        let trace = TourLog()
        let stop = SharedFlag(false)
        let named = DispatchSemaphore(value: 0)
        let stopped = DispatchSemaphore(value: 0)
        let spinnerID = ThreadIDBox()
        let (spinStart, spinEnd) = (ThreadMark(), ThreadMark())
        let spinner = Thread {
            crll_set_thread_name("spinner")
            spinnerID.value.store(crll_gettid(), ordering: .releasing)
            named.signal()
            trace.log("spinner:  tid \(crll_gettid()), spinning in spinComputingHashes()")
            spinStart.mark()
            spinComputingHashes(until: stop)
            spinEnd.mark()
            if let start = spinStart.reading, let end = spinEnd.reading {
                let split = ThreadMark.split(start, end)
                trace.log(
                    "spinner:  stopped after \(TourLog.ms(split.wall)): \(TourLog.ms(split.onCPU)) on a CPU, "
                        + "\(TourLog.ms(split.waiting)) waiting for one (its schedstat)")
            }
            stopped.signal()
        }
        spinner.start()
        // The monitor starts once the spinner has named itself: it reads a thread's name once, when
        // it first sees the thread, and a thread that renames itself later keeps its old name in
        // the reports (a new thread starts with its creator's name, here 'runloop-lab').
        named.wait()
        let tid = spinnerID.value.load(ordering: .acquiring)

        let inbox = EventInbox<CPUEvent>()
        let monitor = CPUMonitor(
            threshold: Self.threshold, window: Self.window, sustainedWindows: Self.sustainedWindows, logger: nil)
        monitor.start { inbox.post($0) }
        trace.log(
            "main:     CPUMonitor(threshold: \(Self.threshold), window: \(TourLog.literal(Self.window)), "
                + "sustainedWindows: \(Self.sustainedWindows)).start")

        var others: [CPUEvent] = []
        let found = inbox.next(timeout: Self.patience, skipped: &others) { $0.report.threadID == tid }
        var details: [String] = []
        if let report = found?.report {
            let usage = report.usage.map { "\(Int(($0 * 100).rounded())) %" }.joined(separator: ", ")
            let samples = report.stacks.reduce(0) { $0 + $1.count }
            trace.log(
                "monitor:  .hot '\(report.threadName)' (tid \(report.threadID)): \(usage) of a core in its last "
                    + "\(report.usage.count) windows of \(TourLog.ms(report.window))")
            let distinct = report.stacks.count == 1 ? "1 distinct stack" : "\(report.stacks.count) distinct stacks"
            details.append("hotIn: \(report.hotIn ?? "?"); \(samples) samples, \(distinct)")
            if report.threadName != "spinner" {
                details.append(
                    "(its name in the report is stale: the one the monitor read when it first saw the thread)")
            }
            if let error = report.captureError { details.append("capture error: \(error)") }
            if let top = report.stacks.first {
                details.append("top stack (\(top.count) of \(samples) samples), innermost first:")
                details += top.frames.prefix(4).map { "  \($0.summary)" }
                if top.frames.count > 4 { details.append("  ... \(top.frames.count - 4) more") }
            }
        } else {
            trace.log("monitor:  no report for the spinner (tid \(tid)) within \(TourLog.ms(Self.patience))")
        }
        trace.log("main:     stop the spinner")
        stop.set(true)
        stopped.wait()
        monitor.stop()

        for event in trace.events {
            Out.line("\(TourLog.ms(event.at, width: 8))  \(event.text)")
            if event.text.hasPrefix("monitor:  .hot") {
                for line in details { Out.line("                     \(line)") }
            }
        }
        for other in others {
            Out.line("(also hot: '\(other.report.threadName)', in \(other.report.hotIn ?? "?"))")
        }
        if found == nil {
            Out.conclusion(
                "no report: the spinner did not stay above \(Int(Self.threshold * 100)) % of a core for "
                    + "\(Self.sustainedWindows) windows in a row within \(TourLog.ms(Self.patience)) "
                    + "(a loaded machine leaves it less: see its time waiting for a CPU)")
        } else if let report = found?.report {
            Out.conclusion(
                "the spinner was reported by name, with its usage per window and the function it spins in "
                    + "(\(report.hotIn ?? "?")); the seed's check needs Mach's thread_info and runs every 3 s")
        }
    }
}

extension CPUEvent {
    fileprivate var report: CPUReport {
        switch self {
        case .hot(let report): report
        }
    }
}

/// A thread's kernel id, published by the thread itself.
private final class ThreadIDBox: Sendable {
    let value = Atomic<Int32>(0)
}

/// Where the spinner puts its result, so that the work is not optimized away.
private let spinSink = Atomic<UInt64>(0)

/// The spinner's work: FNV-1a over a counter, looking at `stop` every 20 000 rounds.
@inline(never)
func spinComputingHashes(until stop: SharedFlag) {
    var hash: UInt64 = 0xcbf2_9ce4_8422_2325
    while !stop.isSet {
        var round: UInt64 = 0
        while round < 20_000 {
            hash = (hash ^ round) &* 0x100_0000_01b3
            round &+= 1
        }
    }
    spinSink.store(hash, ordering: .relaxed)
}
