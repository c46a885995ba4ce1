import RunLoopKit

/// What a ``TraceRecorder`` holds at one moment: for each recorded loop, its runs, phases,
/// callouts, sleeps and counter samples, and the stalls a ``StallMonitor`` reported.
///
/// Times count from the recorder's start. Read it as spans (``lanes``), or export it as Chrome
/// Trace Event JSON (``chromeTraceJSON()``, for Perfetto UI and chrome://tracing) or as a
/// self-contained HTML timeline (``timelineHTML(title:)``).
public struct Trace: Sendable {
    struct ThreadRecords: Sendable {
        let threadID: Int32
        let threadName: String
        let records: [TraceRecord]
        let names: [String]
        let overwritten: UInt64
    }

    let originNs: Int64
    let threads: [ThreadRecords]
    let stalls: [TraceRecorder.StallMark]

    /// One loop thread's spans.
    public struct Lane: Sendable {
        /// The loop thread's kernel id (`gettid()`).
        public var threadID: Int32
        /// The loop thread's name.
        public var threadName: String
        /// Every span, by start (a span before the spans it contains).
        public var spans: [TraceSpan]
        /// Records the ring overwrote (the oldest) before the snapshot, or dropped as torn.
        public var overwritten: UInt64
    }

    /// The recorded loops' spans, a lane per loop.
    public var lanes: [Lane] {
        threads.map { thread in
            var spans = Self.spans(of: thread, originNs: originNs)
            let ordered = spans.count
            for stall in stalls where stall.threadID == thread.threadID {
                spans.append(
                    TraceSpan(
                        kind: .stall, name: stall.label, phase: nil,
                        start: .nanoseconds(max(0, stall.startNs - originNs)), duration: .nanoseconds(stall.durationNs),
                        depth: 0, firstPass: 0, lastPass: 0, calls: 1, detail: nil, value: 0))
            }
            // The record spans come in order; stalls (few) are merged in.
            if spans.count > ordered { spans.sort(by: TraceSpan.precedes) }
            return Lane(
                threadID: thread.threadID, threadName: thread.threadName, spans: spans, overwritten: thread.overwritten)
        }
    }

    /// Turns one loop's records into spans: each record is one, and each phase is one more: the
    /// consecutive callouts of one pass and phase at one depth (a run of folded repeats is a phase
    /// of its own).
    static func spans(of thread: ThreadRecords, originNs: Int64) -> [TraceSpan] {
        let records = thread.records.sorted { a, b in
            a.start != b.start ? a.start < b.start : (a.end != b.end ? a.end > b.end : a.kind.rawValue < b.kind.rawValue)
        }
        var spans: [TraceSpan] = []
        spans.reserveCapacity(records.count + records.count / 2)
        struct Group {
            /// Where its span goes: reserved before its first callout, so spans stay in order.
            let slot: Int
            var phase: RunLoop.Phase
            var firstPass: UInt64
            var lastPass: UInt64
            var start: Int64
            var end: Int64
            var calls: Int
            let folded: Bool
        }
        var groups: [Int: Group] = [:]
        let placeholder = TraceSpan(
            kind: .phase, name: "", phase: nil, start: .zero, duration: .zero, depth: 0, firstPass: 0, lastPass: 0,
            calls: 0, detail: nil, value: 0)
        func name(_ index: UInt32) -> String {
            Int(index) < thread.names.count ? thread.names[Int(index)] : "(unknown)"
        }
        func time(_ ns: Int64) -> Duration { .nanoseconds(max(0, ns - originNs)) }
        func flush(depth: Int) {
            guard let group = groups.removeValue(forKey: depth) else { return }
            spans[group.slot] = (
                TraceSpan(
                    kind: .phase, name: group.phase.description, phase: group.phase, start: time(group.start),
                    duration: .nanoseconds(max(0, group.end - group.start)), depth: depth, firstPass: group.firstPass,
                    lastPass: group.lastPass, calls: group.calls, detail: nil, value: 0))
        }
        func flush(deeperThan depth: Int) {
            guard !groups.isEmpty else { return }
            for key in groups.keys where key > depth { flush(depth: key) }
        }
        for record in records {
            let depth = Int(record.depth)
            let lastPass = record.firstPass &+ UInt64(record.passSpan)
            let duration = Duration.nanoseconds(max(0, record.end - record.start))
            flush(deeperThan: depth)
            switch record.kind {
            case .run:
                flush(depth: depth)
                let result = RunLoop.RunResult(rawValue: Int32(record.detail))
                spans.append(
                    TraceSpan(
                        kind: .run, name: name(record.name), phase: nil, start: time(record.start), duration: duration,
                        depth: depth, firstPass: record.firstPass, lastPass: lastPass, calls: 1,
                        detail: result?.description ?? "(in progress)", value: 0))
            case .sleep:
                flush(depth: depth)
                let reason = RunLoop.WakeReason(rawValue: record.detail) ?? .none
                spans.append(
                    TraceSpan(
                        kind: .sleep, name: "sleep", phase: .waiting, start: time(record.start), duration: duration,
                        depth: depth, firstPass: record.firstPass, lastPass: lastPass, calls: 1,
                        detail: reason.description, value: 0))
            case .counter:
                spans.append(
                    TraceSpan(
                        kind: .counter, name: name(record.name), phase: nil, start: time(record.start), duration: .zero,
                        depth: depth, firstPass: record.firstPass, lastPass: record.firstPass, calls: 1, detail: nil,
                        value: record.value))
            case .callout:
                let folded = record.passSpan > 0
                if var group = groups[depth], !folded, !group.folded, group.phase == record.phase,
                    group.firstPass == record.firstPass
                {
                    group.end = max(group.end, record.end)
                    group.calls += Int(record.count)
                    groups[depth] = group
                } else {
                    flush(depth: depth)
                    spans.append(placeholder)
                    groups[depth] = Group(
                        slot: spans.count - 1, phase: record.phase, firstPass: record.firstPass, lastPass: lastPass, start: record.start,
                        end: record.end, calls: Int(record.count), folded: folded)
                }
                let activity =
                    record.phase == .observers ? RunLoop.Activity(rawValue: 1 << UInt(record.detail)).description : nil
                spans.append(
                    TraceSpan(
                        kind: .callout, name: name(record.name), phase: record.phase, start: time(record.start),
                        duration: duration, depth: depth, firstPass: record.firstPass, lastPass: lastPass,
                        calls: Int(record.count), detail: activity, value: 0, nameKey: Int32(record.name)))
            }
        }
        flush(deeperThan: -1)
        return spans
    }

    /// `1.234 ms`, `56 µs`, `2.5 s`.
    static func formatDuration(_ ns: Int64) -> String {
        let value = Double(ns)
        if ns >= 1_000_000_000 { return "\((value / 1e9 * 1000).rounded() / 1000) s" }
        if ns >= 1_000_000 { return "\((value / 1e6 * 1000).rounded() / 1000) ms" }
        if ns >= 1_000 { return "\((value / 1e3 * 10).rounded() / 10) µs" }
        return "\(ns) ns"
    }
}

/// One span of a loop's timeline.
public struct TraceSpan: Sendable, Hashable {
    /// What a span stands for.
    public enum Kind: String, Sendable, Hashable {
        /// A run, entry to exit: ``TraceSpan/name`` is its mode, ``TraceSpan/detail`` its result.
        case run
        /// One phase of one pass (consecutive callouts of that phase): ``TraceSpan/name`` is the
        /// phase.
        case phase
        /// A call into an item: ``TraceSpan/name`` is the item's label or identity; for an
        /// observer ``TraceSpan/detail`` is the activity; ``TraceSpan/calls`` > 1 for folded
        /// repeats.
        case callout
        /// A sleep: ``TraceSpan/detail`` is what woke the loop (a `RunLoop.WakeReason`).
        case sleep
        /// A counter sample (``TraceSpan/value`` at ``TraceSpan/start``).
        case counter
        /// A stall a ``StallMonitor`` reported.
        case stall
    }

    /// What the span stands for.
    public var kind: Kind
    /// The run's mode, the phase, the item, `sleep`, the counter or the stall.
    public var name: String
    /// The loop phase of a phase, callout or sleep.
    public var phase: RunLoop.Phase?
    /// Since the recording began.
    public var start: Duration
    /// How long it lasted (zero for a counter sample).
    public var duration: Duration
    /// 0 in the outermost run, 1 in a run nested in one of its callouts, ...
    public var depth: Int
    /// The first pass (loop generation) the span covers.
    public var firstPass: UInt64
    /// The last pass the span covers (after ``firstPass`` for folded repeats and runs).
    public var lastPass: UInt64
    /// Calls folded into the span (callouts), or the callouts in a phase.
    public var calls: Int
    /// The observer's activity, the sleep's wake reason, the run's result.
    public var detail: String?
    /// A counter's value.
    public var value: Int64
    /// The name's index in the recording's name table (-1: none): lets the export escape each
    /// name once.
    var nameKey: Int32 = -1

    /// Makes a span.
    public init(
        kind: Kind, name: String, phase: RunLoop.Phase?, start: Duration, duration: Duration, depth: Int,
        firstPass: UInt64, lastPass: UInt64, calls: Int, detail: String?, value: Int64
    ) {
        self.init(
            kind: kind, name: name, phase: phase, start: start, duration: duration, depth: depth, firstPass: firstPass,
            lastPass: lastPass, calls: calls, detail: detail, value: value, nameKey: -1)
    }

    init(
        kind: Kind, name: String, phase: RunLoop.Phase?, start: Duration, duration: Duration, depth: Int,
        firstPass: UInt64, lastPass: UInt64, calls: Int, detail: String?, value: Int64, nameKey: Int32
    ) {
        self.nameKey = nameKey
        self.kind = kind
        self.name = name
        self.phase = phase
        self.start = start
        self.duration = duration
        self.depth = depth
        self.firstPass = firstPass
        self.lastPass = lastPass
        self.calls = calls
        self.detail = detail
        self.value = value
    }

    /// When the span ends.
    public var end: Duration { start + duration }

    /// By start; at equal starts the longer first, then the outer kind first (a run before its
    /// phase, a phase before its callout): the order in which spans nest.
    static func precedes(_ a: TraceSpan, _ b: TraceSpan) -> Bool {
        if a.start != b.start { return a.start < b.start }
        if a.duration != b.duration { return a.duration > b.duration }
        if a.depth != b.depth { return a.depth < b.depth }
        return a.kind.rank < b.kind.rank
    }
}

extension TraceSpan.Kind {
    var rank: Int {
        switch self {
        case .stall: 0
        case .run: 1
        case .phase: 2
        case .sleep: 3
        case .callout: 4
        case .counter: 5
        }
    }
}
