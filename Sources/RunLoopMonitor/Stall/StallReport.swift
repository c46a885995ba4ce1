import Foundation
import RunLoopKit

/// What a ``StallMonitor`` reports: a stall begins, then ends.
public enum StallEvent: Sendable {
    /// The loop has been inside one iteration longer than the threshold. The report holds what is
    /// known so far: the duration so far and the first stack.
    case began(StallReport)
    /// The loop moved on (or the monitor stopped, or the thread exited: see
    /// ``StallReport/endReason``). The report holds the total duration and every sampled stack.
    case ended(StallReport)
    /// Stalls the back-off held back and no delivered report has counted yet (see
    /// ``StallMonitor/Backoff``): the last one's report, whose ``StallReport/suppressedSimilar`` is
    /// how many were held back. Sent when their signature is forgotten, and when the monitor stops.
    case suppressed(StallReport)

    /// The report the case carries.
    public var report: StallReport {
        switch self {
        case .began(let report), .ended(let report), .suppressed(let report): report
        }
    }

    /// Whether this is a ``suppressed(_:)`` summary (not written to a ``StallReportStore``).
    public var isSummary: Bool {
        if case .suppressed = self { true } else { false }
    }
}

/// One stall of a run loop: where it was stuck, for how long, and what its thread was doing.
///
/// JSON (``StallReportStore`` writes it, one object per line): durations are integer nanoseconds
/// (`durationNs`, `threadCPUTimeNs`), `startedAt` is seconds since 1970 (a number), and frames are
/// ``StackFrame`` objects. Fields added later are optional, so older readers keep working.
public struct StallReport: Sendable, Codable, Hashable {
    /// How a stall ended.
    public enum EndReason: String, Sendable, Codable {
        /// The loop finished the iteration (or slept): the usual end.
        case movedOn
        /// ``StallMonitor/stop()`` was called while the stall lasted: ``duration`` is how long it
        /// had lasted then (cut short).
        case monitorStopped
        /// The loop's thread exited while stuck (or before the monitor looked again).
        case threadExited
    }

    /// Unique per stall: a ``StallReportStore`` pairs the `began` and `ended` lines by it.
    public var id: String
    /// The process that stalled.
    public var processID: Int32
    /// The boot the process ran in (`/proc/sys/kernel/random/boot_id`). With
    /// ``processStartTime`` it tells the process apart from a later one with the same pid (another
    /// PID namespace, as a restarted container's app is; a pid used again). Nil in reports written
    /// before it was recorded; ``StallReportStore`` fills it in for reports of its own process.
    public var bootID: String?
    /// When the process started, in clock ticks since boot (field 22 of `/proc/<pid>/stat`;
    /// `sysconf(_SC_CLK_TCK)` ticks a second, 100 on Linux). Nil in reports written before it was
    /// recorded; ``StallReportStore`` fills it in for reports of its own process.
    public var processStartTime: UInt64?
    /// The stuck thread's name as the kernel shows it (15 characters at most; a Foundation
    /// `Thread` named before `start()` shows the process's name there): ``loop`` is the name to
    /// rely on.
    public var threadName: String
    /// The stuck thread's kernel id.
    public var threadID: Int32
    /// The mode the loop was running in.
    public var mode: String
    /// Where it was stuck: `observers`, `blocks`, `sources0`, `timers`, `sources1` (descriptor
    /// sources, ports and the main queue).
    public var phase: String
    /// When the loop started the work that stalled (it left the kernel or began the pass).
    public var startedAt: Date
    /// How long the stall has lasted (in a `began` report) or lasted in all (`ended`).
    public var duration: Duration
    /// CPU time the stuck thread used while the monitor watched the stall (from its thread CPU
    /// clock, over ``cpuMeasuredOver``): close to that time when it was busy, near zero when it was
    /// blocked (sleeping, waiting for a lock or for I/O).
    public var threadCPUTime: Duration
    /// The wall time ``threadCPUTime`` was measured over.
    public var cpuMeasuredOver: Duration
    /// Distinct stacks sampled (one every sample interval), most frequent first.
    public var stacks: [StackSample]
    /// Stacks sampled in all.
    public var sampleCount: Int
    /// Set in an `ended` report.
    public var endReason: EndReason?
    /// Stalls with the same stack that were not reported since the last one that was (see
    /// ``StallMonitor``'s back-off).
    public var suppressedSimilar: Int
    /// Why no stack could be taken, when none could.
    public var captureError: String?
    /// The loop's name: the one given to ``StallMonitor/watch(_:name:)`` (or the monitor's
    /// initializer), else the thread's name when the loop was made.
    public var loop: String
    /// The item the loop was calling out to (its label, else its kind: `block`, `timer`,
    /// `observer`, `source`, `descriptor source`, `message port`, `main queue`), or `the loop's own
    /// work` for a stall between callouts (see `RunLoop.CalloutSnapshot` in RunLoopKit). A callout
    /// that runs another loop's work says which when its item has a describer
    /// (`RunLoop.describeCallouts(labelled:_:)`): RunLoopGLib's dispatch gives the name of the GLib
    /// source being dispatched.
    public var item: String
    /// Where the loop was stuck, in a word: the deepest frame of the application's own code on the
    /// heaviest path of the samples' call tree (``CallTree/blamed``); when that path holds none,
    /// the innermost named frame outside the system libraries of the most frequent stack. Nil
    /// before the report is symbolicated, or when no stack was taken.
    public var stuckIn: String?
    /// Every sample, folded (`outer;…;inner count` per line, see ``CallTree/folded``): a flame
    /// graph's input (``FlameGraphPage``, `flamegraph.pl`, speedscope). ``stacks`` keeps only the
    /// most frequent distinct stacks.
    public var foldedStacks: String
    /// The stall's identity across processes, restarts and machines running the same code: 16 hex
    /// digits hashing the names of the application's functions on the heaviest path of the
    /// samples' call tree, outermost first (symbol names only: no address, offset, line or process
    /// detail), so the same stall in 50 instances is one group in a log search or an alert. Nil
    /// when no application function was named (no stack, or not symbolicated yet: see
    /// ``isSymbolicated``).
    public var fingerprint: String?
    /// False in a `began` report delivered before its addresses were symbolicated: the monitor
    /// never holds a stall's first report back for symbols (a large binary's symbol and line
    /// tables take from hundreds of milliseconds to seconds to read, in the first moments after
    /// ``StallMonitor/start(_:)`` and for code not seen before). Its frames carry image and
    /// offset only, and ``stuckIn`` and ``fingerprint`` are nil. The stall's `ended` report is
    /// symbolicated.
    public var isSymbolicated: Bool = true

    /// The stuck thread's busy share over the stall: ``threadCPUTime`` / ``cpuMeasuredOver``.
    public var cpuRatio: Double {
        let wall = cpuMeasuredOver.seconds
        return wall > 0 ? min(1, threadCPUTime.seconds / wall) : 0
    }

    /// Whether ``StallMonitor/stop()`` ended the report before the loop moved on.
    public var isCutShort: Bool { endReason == .monitorStopped }

    /// Every thread's stack, taken when the stall was first reported, for a monitor made with
    /// `allThreads: true` (the seeds' `HCCCallStackTypeAll` dump); nil otherwise.
    public var allThreads: [ThreadStack.ThreadSnapshot]?
    /// The raw form of ``allThreads``, symbolicated by the monitor's reporting thread.
    var rawAllThreads: [ThreadStack.RawThreadSnapshot]?

    /// How many distinct stacks ``stacks`` keeps (the most frequent); ``foldedStacks`` keeps all.
    public static let keptStacks = 8

    /// A report with every field given.
    public init(
        id: String, processID: Int32, threadName: String, threadID: Int32, mode: String, phase: String,
        startedAt: Date, duration: Duration, threadCPUTime: Duration, cpuMeasuredOver: Duration,
        stacks: [StackSample], sampleCount: Int, endReason: EndReason? = nil, suppressedSimilar: Int = 0,
        captureError: String? = nil, bootID: String? = nil, processStartTime: UInt64? = nil, loop: String? = nil,
        item: String = "", stuckIn: String? = nil, foldedStacks: String = ""
    ) {
        self.id = id
        self.processID = processID
        self.threadName = threadName
        self.threadID = threadID
        self.mode = mode
        self.phase = phase
        self.startedAt = startedAt
        self.duration = duration
        self.threadCPUTime = threadCPUTime
        self.cpuMeasuredOver = cpuMeasuredOver
        self.stacks = stacks
        self.sampleCount = sampleCount
        self.endReason = endReason
        self.suppressedSimilar = suppressedSimilar
        self.captureError = captureError
        self.bootID = bootID
        self.processStartTime = processStartTime
        self.loop = loop ?? threadName
        self.item = item
        self.stuckIn = stuckIn ?? StackSample.culprit(in: stacks)
        self.foldedStacks = foldedStacks
    }

    /// Fills ``stacks``, ``stuckIn``, ``foldedStacks`` and ``fingerprint`` from every sample of
    /// the stall; `symbolicated` false when the frames carry no symbol-table names yet.
    mutating func attribute(_ samples: [StackSample], symbolicated: Bool = true) {
        let tree = CallTree(samples)
        stacks = Array(samples.prefix(Self.keptStacks))
        foldedStacks = tree.folded
        isSymbolicated = symbolicated
        guard symbolicated else {
            stuckIn = nil
            fingerprint = nil
            return
        }
        // When the heaviest path holds no code of the application (most samples were cut short by
        // the unwinder inside the Swift runtime, say, and have none), the samples that do hold
        // some decide.
        let withApplicationCode = samples.filter { $0.frames.contains(where: CallTree.isApplicationCode) }
        let fallback = CallTree(withApplicationCode)
        stuckIn = tree.blamed ?? fallback.blamed ?? StackSample.culprit(in: samples)
        fingerprint = tree.fingerprint ?? fallback.fingerprint
    }

    /// The report as a person reads it, several lines (what the lab prints):
    ///
    /// ```text
    /// stall in 'NIO-ELT-0-#0' (thread NIO-ELT-0-#0, tid 4242), phase tick, item "tick", mode "?"
    ///   stuck in handleSleep() for 312 ms (ended: movedOn), CPU 1 ms of 312 ms watched (0 %)
    ///   fingerprint 5f1c0c2b9d4e7a11, 16 samples, 1 distinct stack; the top one (16 of 16):
    ///     clock_nanosleep
    ///     usleep
    ///     handleSleep() (NIOStallServer.swift:52)
    ///     …
    /// ```
    public var text: String {
        var lines: [String] = []
        lines.append("stall in '\(loop)' (thread \(threadName), tid \(threadID)), phase \(phase), item \"\(item)\", mode \"\(mode)\"")
        let end = endReason.map { "ended: \($0.rawValue)" } ?? "going on"
        let percent = Int((cpuRatio * 100).rounded())
        lines.append(
            "  stuck in \(stuckIn ?? (isSymbolicated ? "?" : "? (symbols not loaded yet)")) for \(Self.milliseconds(duration)) (\(end)), "
                + "CPU \(Self.milliseconds(threadCPUTime)) of \(Self.milliseconds(cpuMeasuredOver)) watched (\(percent) %)")
        if suppressedSimilar > 0 { lines.append("  \(suppressedSimilar) similar stalls held back by the back-off before this one") }
        if let captureError { lines.append("  no stack: \(captureError)") }
        let distinct = stacks.count == 1 ? "1 distinct stack" : "\(stacks.count) distinct stacks"
        let top = stacks.first.map { "; the top one (\($0.count) of \(sampleCount)):" } ?? ""
        lines.append("  fingerprint \(fingerprint ?? "-"), \(sampleCount) sample\(sampleCount == 1 ? "" : "s"), \(distinct)\(top)")
        if let frames = stacks.first?.frames {
            for frame in frames.prefix(12) { lines.append("    " + frame.summary) }
            if frames.count > 12 { lines.append("    … \(frames.count - 12) more") }
        }
        return lines.joined(separator: "\n")
    }

    private static func milliseconds(_ duration: Duration) -> String {
        "\(duration.saturatedNanoseconds / 1_000_000) ms"
    }

    private enum CodingKeys: String, CodingKey {
        case id, processID, threadName, threadID, mode, phase, startedAt, durationNs, threadCPUTimeNs
        case cpuMeasuredOverNs, stacks, sampleCount, endReason, suppressedSimilar, captureError
        case loop, item, stuckIn, foldedStacks
        case bootID, processStartTime, allThreads, fingerprint, isSymbolicated
    }

    /// Decodes the JSON form described above.
    public init(from decoder: any Decoder) throws {
        let c = try decoder.container(keyedBy: CodingKeys.self)
        id = try c.decode(String.self, forKey: .id)
        processID = try c.decode(Int32.self, forKey: .processID)
        threadName = try c.decode(String.self, forKey: .threadName)
        threadID = try c.decode(Int32.self, forKey: .threadID)
        mode = try c.decode(String.self, forKey: .mode)
        phase = try c.decode(String.self, forKey: .phase)
        startedAt = Date(timeIntervalSince1970: try c.decode(Double.self, forKey: .startedAt))
        duration = .nanoseconds(try c.decode(Int64.self, forKey: .durationNs))
        threadCPUTime = .nanoseconds(try c.decode(Int64.self, forKey: .threadCPUTimeNs))
        cpuMeasuredOver = .nanoseconds(try c.decodeIfPresent(Int64.self, forKey: .cpuMeasuredOverNs) ?? 0)
        stacks = try c.decode([StackSample].self, forKey: .stacks)
        sampleCount = try c.decodeIfPresent(Int.self, forKey: .sampleCount) ?? stacks.reduce(0) { $0 + $1.count }
        endReason = try c.decodeIfPresent(EndReason.self, forKey: .endReason)
        suppressedSimilar = try c.decodeIfPresent(Int.self, forKey: .suppressedSimilar) ?? 0
        captureError = try c.decodeIfPresent(String.self, forKey: .captureError)
        loop = try c.decodeIfPresent(String.self, forKey: .loop) ?? threadName
        item = try c.decodeIfPresent(String.self, forKey: .item) ?? ""
        stuckIn = try c.decodeIfPresent(String.self, forKey: .stuckIn) ?? StackSample.culprit(in: stacks)
        foldedStacks = try c.decodeIfPresent(String.self, forKey: .foldedStacks) ?? ""
        bootID = try c.decodeIfPresent(String.self, forKey: .bootID)
        processStartTime = try c.decodeIfPresent(UInt64.self, forKey: .processStartTime)
        allThreads = try c.decodeIfPresent([ThreadStack.ThreadSnapshot].self, forKey: .allThreads)
        fingerprint = try c.decodeIfPresent(String.self, forKey: .fingerprint)
        isSymbolicated = try c.decodeIfPresent(Bool.self, forKey: .isSymbolicated) ?? true
    }

    /// Encodes the JSON form described above.
    public func encode(to encoder: any Encoder) throws {
        var c = encoder.container(keyedBy: CodingKeys.self)
        try c.encode(id, forKey: .id)
        try c.encode(processID, forKey: .processID)
        try c.encode(threadName, forKey: .threadName)
        try c.encode(threadID, forKey: .threadID)
        try c.encode(mode, forKey: .mode)
        try c.encode(phase, forKey: .phase)
        try c.encode(startedAt.timeIntervalSince1970, forKey: .startedAt)
        try c.encode(duration.saturatedNanoseconds, forKey: .durationNs)
        try c.encode(threadCPUTime.saturatedNanoseconds, forKey: .threadCPUTimeNs)
        try c.encode(cpuMeasuredOver.saturatedNanoseconds, forKey: .cpuMeasuredOverNs)
        try c.encode(stacks, forKey: .stacks)
        try c.encode(sampleCount, forKey: .sampleCount)
        try c.encodeIfPresent(endReason, forKey: .endReason)
        try c.encode(suppressedSimilar, forKey: .suppressedSimilar)
        try c.encodeIfPresent(captureError, forKey: .captureError)
        try c.encode(loop, forKey: .loop)
        try c.encode(item, forKey: .item)
        try c.encodeIfPresent(stuckIn, forKey: .stuckIn)
        try c.encode(foldedStacks, forKey: .foldedStacks)
        try c.encodeIfPresent(bootID, forKey: .bootID)
        try c.encodeIfPresent(allThreads, forKey: .allThreads)
        try c.encodeIfPresent(processStartTime, forKey: .processStartTime)
        try c.encodeIfPresent(fingerprint, forKey: .fingerprint)
        if !isSymbolicated { try c.encode(false, forKey: .isSymbolicated) }
    }
}

extension Duration {
    /// The duration in seconds, as a Double.
    var seconds: Double {
        let (seconds, attoseconds) = components
        return Double(seconds) + Double(attoseconds) / 1e18
    }
}
