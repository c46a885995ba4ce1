import struct Foundation.Date
import RunLoopKit
import Synchronization

/// Records what run loops do — runs, each callout naming its item, sleeps and what woke them,
/// counters, stalls — into a preallocated ring per loop, for a trace you open in Perfetto UI or
/// chrome://tracing (``Trace/chromeTraceJSON()``) or as a self-contained HTML timeline
/// (``Trace/timelineHTML(title:)``).
///
/// ```swift
/// import Foundation                     // Data and URL, to write the files
/// import RunLoopMonitor
///
/// let recorder = try TraceRecorder(capacityPerLoop: 100_000)
/// recorder.record(loop)                 // from the loop's next pass
/// // ... the loop runs ...
/// let trace = recorder.snapshot()
/// try Data(trace.chromeTraceJSON()).write(to: URL(filePath: "run.json"))
/// try trace.timelineHTML(title: "my run").write(to: URL(filePath: "run.html"), atomically: true, encoding: .utf8)
/// ```
///
/// Cost on the loop: no lock and no allocation per event; one clock read when what the loop does
/// changes, none when it calls the same item again (repeats are folded into one record, up to 64
/// calls; see BENCHMARKS.md for the figures). Memory is fixed: `capacityPerLoop` records of 48
/// bytes per loop; the oldest are overwritten.
///
/// What a trace cannot show: events of a loop before ``record(_:)-(RunLoop)`` took effect (the
/// loop takes up the ring at its next pass of its outermost run), and spans still open at a
/// snapshot (the run in progress, the callout running now): a snapshot holds what has ended.
public final class TraceRecorder: Sendable {
    /// Why a recorder could not be made.
    public enum ConfigurationError: Error, CustomStringConvertible, Equatable {
        /// The ring size is zero or negative.
        case capacityNotPositive(Int)
        /// The ring size is above ``TraceRecorder/maximumCapacityPerLoop``.
        case capacityTooLarge(Int)

        /// What is wrong, with the value given.
        public var description: String {
            switch self {
            case .capacityNotPositive(let value):
                "TraceRecorder: capacityPerLoop must be positive (got \(value))"
            case .capacityTooLarge(let value):
                "TraceRecorder: capacityPerLoop \(value) is above the limit of \(TraceRecorder.maximumCapacityPerLoop) records (48 bytes each)"
            }
        }
    }

    /// The largest ring: 16 Mi records, 768 MiB per loop.
    public static let maximumCapacityPerLoop = 1 << 24

    /// Records each loop's ring holds.
    public let capacityPerLoop: Int
    /// When the recording began: trace timestamps count from here.
    let originNs: Int64
    let originDate: Date

    struct Recorded {
        let loop: RunLoop
        let buffer: TraceBuffer
        let token: RunLoop.InstrumentationToken
        let threadID: Int32
        let threadName: String
    }

    struct StallMark {
        let threadID: Int32
        let startNs: Int64
        let durationNs: Int64
        let label: String
    }

    private let state = Mutex<(loops: [Recorded], stopped: [Recorded], stalls: [StallMark])>(([], [], []))
    /// Stalls kept at most (the oldest are dropped).
    static let stallLimit = 10_000

    /// A recorder whose rings hold `capacityPerLoop` records each.
    ///
    /// - Throws: ``ConfigurationError`` for a size of zero or less, or above
    ///   ``maximumCapacityPerLoop``.
    public init(capacityPerLoop: Int = 65_536) throws(ConfigurationError) {
        guard capacityPerLoop > 0 else { throw .capacityNotPositive(capacityPerLoop) }
        guard capacityPerLoop <= Self.maximumCapacityPerLoop else { throw .capacityTooLarge(capacityPerLoop) }
        self.capacityPerLoop = capacityPerLoop
        originNs = Self.nowNs()
        originDate = Date()
    }

    /// Now on the loops' clock (`CLOCK_BOOTTIME`, which `ContinuousClock` reads on Linux), in
    /// nanoseconds: an instant is one `Duration` since the clock's epoch.
    static func nowNs() -> Int64 {
        unsafeBitCast(ContinuousClock.now, to: Duration.self).saturatedNanoseconds
    }

    /// Starts recording `loop` (any thread): it takes up its ring at its next pass. Recording a
    /// loop already recorded does nothing; a loop recorded by another recorder moves to this one.
    public func record(_ loop: RunLoop) {
        let already = state.locked { state in state.loops.contains { $0.loop === loop } }
        guard !already else { return }
        let buffer = TraceBuffer(capacity: capacityPerLoop)
        let token = loop.attachRecorder(LoopTraceWriter(buffer: buffer))
        let recorded = Recorded(
            loop: loop, buffer: buffer, token: token, threadID: loop.threadID, threadName: loop.threadName)
        let duplicate = state.locked { state -> Bool in
            guard !state.loops.contains(where: { $0.loop === loop }) else { return true }
            state.loops.append(recorded)
            return false
        }
        if duplicate { token.cancel() }
    }

    /// Stops recording every loop; what was recorded stays for ``snapshot()``. Any thread.
    public func stop() {
        let loops = state.locked { state -> [Recorded] in
            defer {
                state.stopped.append(contentsOf: state.loops)
                state.loops.removeAll()
            }
            return state.loops
        }
        for recorded in loops { recorded.token.cancel() }
    }

    /// Adds a stall a ``StallMonitor`` reported (its `ended` event; a `began` is ignored): shown
    /// as a span over the stalled thread's lane. Pass it from the monitor's handler:
    ///
    /// <!-- snippet: prelude
    /// let recorder = try TraceRecorder(capacityPerLoop: 1_000)
    /// let monitor = StallMonitor(loop: loop)
    /// -->
    /// ```swift
    /// monitor.start { event in recorder.record(event) }
    /// ```
    public func record(_ event: StallEvent) {
        guard case .ended(let report) = event else { return }
        let startNs = originNs + Int64((report.startedAt.timeIntervalSince(originDate) * 1e9).rounded())
        // The loop's name (the one given to the monitor) and the item called out, as the report
        // names them.
        let label = "stall \(Trace.formatDuration(report.duration.saturatedNanoseconds)) of \(report.loop) in \(report.item.isEmpty ? report.phase : "\(report.item), \(report.phase)")"
            + (report.stuckIn.map { " at \($0)" } ?? "")
        state.locked { state in
            if state.stalls.count >= Self.stallLimit { state.stalls.removeFirst() }
            state.stalls.append(
                StallMark(
                    threadID: report.threadID, startNs: startNs, durationNs: report.duration.saturatedNanoseconds,
                    label: label))
        }
    }

    /// What the rings hold now, every loop's (recorded now or before ``stop()``). Any thread, while
    /// the loops run.
    public func snapshot() -> Trace {
        let (loops, stalls) = state.locked { ($0.stopped + $0.loops, $0.stalls) }
        var threads: [Trace.ThreadRecords] = []
        for recorded in loops {
            let (records, overwritten) = recorded.buffer.snapshot()
            threads.append(
                Trace.ThreadRecords(
                    threadID: recorded.threadID, threadName: recorded.threadName, records: records,
                    names: recorded.buffer.nameTable, overwritten: overwritten))
        }
        return Trace(originNs: originNs, threads: threads, stalls: stalls)
    }
}

extension TraceRecorder {
    /// Records written so far into every loop's ring (overwritten ones included): how much the
    /// loops have recorded.
    public var recordsWritten: UInt64 {
        state.locked { $0.loops + $0.stopped }.reduce(0) { $0 &+ $1.buffer.recordsWritten }
    }
}
