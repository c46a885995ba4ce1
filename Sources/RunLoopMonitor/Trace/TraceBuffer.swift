import RunLoopKit
import Synchronization

import class RunLoopKit.RunLoop

// What a TraceRecorder keeps per loop: a ring of plain records the loop's thread writes through
// RunLoopKit's recorder seam (`LoopRecorder`) and any thread reads. The loop calls the writer at
// each run, callout and sleep, and the writer reads the clock once per change.
//
// Cost: one clock read per change of what the loop does, none per repeat. A callout of the same
// item at the same depth as the one just finished, with nothing recorded in between, is folded
// into that one's record (its count and pass range grow) until `foldLimit` calls: the loop counts
// the repeats itself and hands them over as one `calloutRepeated`, so a loop that calls one
// source a million times a second makes one call into the writer and one clock read per
// `foldLimit` calls.
// A record's end is the clock read that begins the next record (the bookkeeping between two
// callouts is counted in the first): one read per callout instead of two.

/// A ring of trace records a loop writes (on its thread) and any thread reads: the loop never
/// takes a lock or allocates to record an event; the oldest records are overwritten when it is
/// full.
///
/// `@unchecked Sendable` is safe: the slots are atomics (a reader never races a plain memory
/// access); the one writer is the attached loop's thread, publishing each record by a release
/// store of ``written`` after a release fence; readers copy and then re-check ``written`` to drop
/// slots the writer may have been overwriting meanwhile (a sequence lock). The name table is
/// behind a mutex.
final class TraceBuffer: @unchecked Sendable {
    /// Words per record (see ``TraceRecord`` for the packing).
    static let wordsPerRecord = 6
    /// Distinct names a buffer keeps; later names are recorded as ``overflowName``.
    static let nameLimit = 65_536
    /// The name recorded for an item once the table is full.
    static let overflowName = "(name table full)"

    /// The number of records the ring holds.
    let capacity: Int
    private let slots: UnsafeMutablePointer<Atomic<UInt64>>
    private let written = Atomic<UInt64>(0)
    private let names = Mutex<(list: [String], index: [String: UInt32])>(([], [:]))

    /// A buffer of `capacity` records; `capacity` must be positive (the recorder checks it).
    init(capacity: Int) {
        fatalPrecondition(capacity > 0, "TraceBuffer capacity must be positive")
        self.capacity = capacity
        let count = capacity * Self.wordsPerRecord
        slots = .allocate(capacity: count)
        for index in 0..<count { (slots + index).initialize(to: Atomic(0)) }
    }

    deinit {
        slots.deinitialize(count: capacity * Self.wordsPerRecord)
        slots.deallocate()
    }

    /// Records written since the buffer was made (the ring holds the last ``capacity``).
    var recordsWritten: UInt64 { written.load(ordering: .acquiring) }

    /// Appends a record. The attached loop's thread only (one writer).
    @inline(__always)
    func write(_ record: TraceRecord) {
        let index = written.load(ordering: .relaxed)
        // The slot's old record is being overwritten from here: readers who see these stores
        // must also see `written` past it (see snapshot()).
        atomicMemoryFence(ordering: .releasing)
        let base = slots + Int(index % UInt64(capacity)) * Self.wordsPerRecord
        let words = record.words
        base[0].store(words.0, ordering: .relaxed)
        base[1].store(words.1, ordering: .relaxed)
        base[2].store(words.2, ordering: .relaxed)
        base[3].store(words.3, ordering: .relaxed)
        base[4].store(words.4, ordering: .relaxed)
        base[5].store(words.5, ordering: .relaxed)
        written.store(index &+ 1, ordering: .releasing)
    }

    /// The records the ring holds now, oldest first, and how many older ones were overwritten.
    /// Any thread, while the loop writes: a record the writer was overwriting during the copy is
    /// left out (and counted as overwritten).
    func snapshot() -> (records: [TraceRecord], overwritten: UInt64) {
        let end = written.load(ordering: .acquiring)
        let first = end > UInt64(capacity) ? end - UInt64(capacity) : 0
        var copied: [TraceRecord] = []
        copied.reserveCapacity(Int(end - first))
        var index = first
        while index < end {
            let base = slots + Int(index % UInt64(capacity)) * Self.wordsPerRecord
            copied.append(
                TraceRecord(
                    words: (
                        base[0].load(ordering: .relaxed), base[1].load(ordering: .relaxed),
                        base[2].load(ordering: .relaxed), base[3].load(ordering: .relaxed),
                        base[4].load(ordering: .relaxed), base[5].load(ordering: .relaxed)
                    )))
            index += 1
        }
        atomicMemoryFence(ordering: .acquiring)
        let endAfter = written.load(ordering: .relaxed)
        // While copying, the writer may have overwritten the slots of records up to
        // `endAfter - capacity` (the one it is writing now included).
        let firstIntact = endAfter >= UInt64(capacity) ? endAfter - UInt64(capacity) + 1 : 0
        let torn = firstIntact > first ? Int(min(firstIntact - first, UInt64(copied.count))) : 0
        if torn > 0 { copied.removeFirst(torn) }
        return (copied, first + UInt64(torn))
    }

    /// The names records refer to, by index.
    var nameTable: [String] { names.locked { $0.list } }

    /// The index of `name` in the table, added if new (equal names share an index); the overflow
    /// name's once the table holds ``nameLimit`` names. Takes the table's lock: done once per item
    /// and buffer, not per event.
    func intern(_ name: String) -> UInt32 {
        names.locked { names in
            if let index = names.index[name] { return index }
            let key = names.list.count < Self.nameLimit - 1 ? name : Self.overflowName
            if let index = names.index[key] { return index }
            let index = UInt32(names.list.count)
            names.list.append(key)
            names.index[key] = index
            return index
        }
    }
}

/// One trace record: a run, a callout, a sleep or a counter sample, with loop-clock nanoseconds.
struct TraceRecord: Sendable, Hashable {
    /// What a record stands for.
    enum Kind: UInt8, Sendable {
        /// A run from entry to exit: ``name`` is its mode's, ``detail`` its `RunResult`.
        case run = 1
        /// A callout (observer, block, source, timer, version-1 source): ``name`` is its item's,
        /// ``detail`` the observer's activity bit; ``count`` calls folded into one record.
        case callout
        /// A sleep: ``detail`` is the `WakeReason`.
        case sleep
        /// A counter sample at ``start``: ``name`` is the counter's, ``value`` its value.
        case counter
    }

    var kind: Kind
    var phase: RunLoop.Phase
    var detail: UInt8
    /// Nesting: 0 for the outermost run's events, 1 for a run nested in one of its callouts...
    var depth: UInt8
    var name: UInt32
    var start: Int64
    var end: Int64
    /// The pass (generation) the record began in, and how many passes later it ended.
    var firstPass: UInt64
    var passSpan: UInt32
    var count: UInt32
    var value: Int64

    init(
        kind: Kind, phase: RunLoop.Phase, detail: UInt8 = 0, depth: UInt8, name: UInt32, start: Int64,
        end: Int64, firstPass: UInt64, passSpan: UInt32 = 0, count: UInt32 = 1, value: Int64 = 0
    ) {
        self.kind = kind
        self.phase = phase
        self.detail = detail
        self.depth = depth
        self.name = name
        self.start = start
        self.end = end
        self.firstPass = firstPass
        self.passSpan = passSpan
        self.count = count
        self.value = value
    }

    var words: (UInt64, UInt64, UInt64, UInt64, UInt64, UInt64) {
        (
            UInt64(kind.rawValue) | UInt64(phase.rawValue) << 8 | UInt64(detail) << 16 | UInt64(depth) << 24
                | UInt64(name) << 32,
            UInt64(bitPattern: start), UInt64(bitPattern: end), firstPass,
            UInt64(count) | UInt64(passSpan) << 32, UInt64(bitPattern: value)
        )
    }

    init(words: (UInt64, UInt64, UInt64, UInt64, UInt64, UInt64)) {
        // A slot never written decodes to kind 0; snapshot() reads only written slots.
        kind = Kind(rawValue: UInt8(truncatingIfNeeded: words.0)) ?? .counter
        phase = RunLoop.Phase(rawValue: UInt8(truncatingIfNeeded: words.0 >> 8)) ?? .notRunning
        detail = UInt8(truncatingIfNeeded: words.0 >> 16)
        depth = UInt8(truncatingIfNeeded: words.0 >> 24)
        name = UInt32(truncatingIfNeeded: words.0 >> 32)
        start = Int64(bitPattern: words.1)
        end = Int64(bitPattern: words.2)
        firstPass = words.3
        count = UInt32(truncatingIfNeeded: words.4)
        passSpan = UInt32(truncatingIfNeeded: words.4 >> 32)
        value = Int64(bitPattern: words.5)
    }
}

/// Writes one loop's events into its ring, folding repeats: the loop's recorder (RunLoopKit's
/// `LoopRecorder`), attached by ``TraceRecorder/record(_:)``.
///
/// `@unchecked Sendable` is safe: it is handed to the loop once (under the loop's instrumentation
/// lock), and from then on only the loop's thread calls it (the recorder reads the ``buffer``,
/// which is safe from any thread, never this state).
final class LoopTraceWriter: LoopRecorder, @unchecked Sendable {
    /// A span begun and not ended.
    struct OpenSpan {
        var kind: TraceRecord.Kind
        var phase: RunLoop.Phase
        var detail: UInt8
        var depth: UInt8
        var name: UInt32
        var start: Int64
        var firstPass: UInt64
    }

    /// Calls of one item folded into one record at most; a bound on how much of a hot loop's time
    /// one record blurs.
    static let foldLimit: UInt32 = 64
    /// Spans open at once at most (nested runs and their callouts); deeper events are not recorded.
    static let depthLimit = 60

    let buffer: TraceBuffer
    /// The tag items cache their names under (``RecorderTags``).
    let tag = RecorderTags.next()
    let blockName: UInt32
    let readyName: UInt32
    let sleepName: UInt32
    // One thread uses these (see the class's comment): no dynamic exclusivity checks, which cost a
    // thread-local lookup per access. The open spans are a fixed stack (no array bookkeeping per
    // push and pop: this runs for every callout).
    private let open: UnsafeMutablePointer<OpenSpan>
    @exclusivity(unchecked) private var openCount = 0
    /// The last finished callout, not written yet (while ``hasPending``): its end is the next
    /// clock read, unless a repeat of it is folded in.
    @exclusivity(unchecked) private var pending = TraceRecord(
        kind: .callout, phase: .notRunning, depth: 0, name: 0, start: 0, end: 0, firstPass: 0)
    @exclusivity(unchecked) private var hasPending = false
    /// Events left out because ``depthLimit`` spans were open.
    @exclusivity(unchecked) private var skippedDepth = 0
    /// The last clock read (for counter samples, which read none).
    @exclusivity(unchecked) private var lastRead: Int64 = 0
    /// The pending callout is the last event (repeats the loop folded may be added to it).
    @exclusivity(unchecked) private var pendingIsLast = false

    init(buffer: TraceBuffer) {
        self.buffer = buffer
        blockName = buffer.intern("block")
        readyName = buffer.intern("ready descriptors")
        sleepName = buffer.intern("sleep")
        open = .allocate(capacity: Self.depthLimit)
    }

    deinit {
        open.deinitialize(count: openCount)
        open.deallocate()
    }

    /// Reads the clock; a pending callout ends here and is written.
    @inline(__always)
    func read() -> Int64 {
        let now = RunLoop.clockNanoseconds
        lastRead = now
        if hasPending { flushPending(at: now) }
        return now
    }

    private func flushPending(at now: Int64) {
        hasPending = false
        pending.end = now
        buffer.write(pending)
    }

    @inline(__always)
    private func push(_ span: OpenSpan) {
        (open + openCount).initialize(to: span)
        openCount += 1
    }

    @inline(__always)
    func beginCallout(_ phase: RunLoop.Phase, name: UInt32, detail: UInt8 = 0, depth: UInt8, pass: UInt64) {
        pendingIsLast = false
        guard openCount < Self.depthLimit else {
            skippedDepth += 1
            return
        }
        let now = read()
        push(
            OpenSpan(
                kind: .callout, phase: phase, detail: detail, depth: depth, name: name, start: now, firstPass: pass))
    }

    @inline(__always)
    func endCallout(depth: UInt8, pass: UInt64) {
        guard openCount > 0, open[openCount - 1].kind == .callout, open[openCount - 1].depth == depth else {
            if skippedDepth > 0 { skippedDepth -= 1 }
            pendingIsLast = false
            return
        }
        openCount -= 1
        let top = (open + openCount).move()
        let span = UInt32(truncatingIfNeeded: pass &- top.firstPass)
        if hasPending { _ = read() }
        pending = TraceRecord(
            kind: .callout, phase: top.phase, detail: top.detail, depth: depth, name: top.name, start: top.start,
            end: top.start, firstPass: top.firstPass, passSpan: span)
        hasPending = true
        pendingIsLast = true
    }

    /// Repeats the loop folded into the pending callout: its count and pass range grow; its end is
    /// still the next clock read (at once if it is full).
    func repeatCallout(times: UInt32, lastPass: UInt64) {
        guard pendingIsLast else { return }
        pending.count &+= times
        pending.passSpan = UInt32(truncatingIfNeeded: lastPass &- pending.firstPass)
        if pending.count >= Self.foldLimit {
            pendingIsLast = false
            _ = read()
        }
    }

    func beginSpan(_ kind: TraceRecord.Kind, phase: RunLoop.Phase, name: UInt32, depth: UInt8, pass: UInt64) {
        pendingIsLast = false
        guard openCount < Self.depthLimit else {
            skippedDepth += 1
            return
        }
        let now = read()
        push(OpenSpan(kind: kind, phase: phase, detail: 0, depth: depth, name: name, start: now, firstPass: pass))
    }

    /// Ends the innermost open span if it is a `kind` at `depth` (one begun before the buffer was
    /// attached is not), and writes it with `detail`.
    func endSpan(_ kind: TraceRecord.Kind, detail: UInt8, depth: UInt8, pass: UInt64) {
        pendingIsLast = false
        guard openCount > 0, open[openCount - 1].kind == kind, open[openCount - 1].depth == depth else {
            if skippedDepth > 0 { skippedDepth -= 1 }
            return
        }
        let now = read()
        openCount -= 1
        let top = (open + openCount).move()
        buffer.write(
            TraceRecord(
                kind: kind, phase: top.phase, detail: detail, depth: depth, name: top.name, start: top.start, end: now,
                firstPass: top.firstPass, passSpan: UInt32(truncatingIfNeeded: pass &- top.firstPass)))
    }

    /// Whether the innermost open span is a sleep at `depth`.
    func isSleeping(depth: UInt8) -> Bool {
        openCount > 0 && open[openCount - 1].kind == .sleep && open[openCount - 1].depth == depth
    }

    /// A counter sample, at the last clock read (a counter reads none).
    func sample(_ name: UInt32, _ value: Int, depth: UInt8, pass: UInt64) {
        buffer.write(
            TraceRecord(
                kind: .counter, phase: .notRunning, depth: depth, name: name, start: lastRead, end: lastRead,
                firstPass: pass, value: Int64(value)))
    }

    /// Writes what is pending (the buffer is being detached or the loop's thread ends).
    func finish() {
        if hasPending { _ = read() }
    }

    // MARK: LoopRecorder

    var nameTag: UInt32 { tag }

    var foldLimit: UInt32 { Self.foldLimit }

    func intern(_ name: String) -> UInt32 { buffer.intern(name) }

    func runBegan(mode name: UInt32, depth: UInt8, pass: UInt64) {
        beginSpan(.run, phase: .notRunning, name: name, depth: depth, pass: pass)
    }

    func runEnded(result: UInt8, depth: UInt8, pass: UInt64) {
        endSpan(.run, detail: result, depth: depth, pass: pass)
    }

    @inline(__always)
    func calloutBegan(_ phase: RunLoop.Phase, name: UInt32, detail: UInt8, depth: UInt8, pass: UInt64) {
        beginCallout(phase, name: name, detail: detail, depth: depth, pass: pass)
    }

    func blockBegan(depth: UInt8, pass: UInt64) {
        beginCallout(.blocks, name: blockName, depth: depth, pass: pass)
    }

    @inline(__always)
    func calloutEnded(depth: UInt8, pass: UInt64) {
        endCallout(depth: depth, pass: pass)
    }

    func calloutRepeated(times: UInt32, lastPass: UInt64) {
        repeatCallout(times: times, lastPass: lastPass)
    }

    func sleepBegan(depth: UInt8, pass: UInt64) {
        beginSpan(.sleep, phase: .waiting, name: sleepName, depth: depth, pass: pass)
    }

    func woke(reason: UInt8, readyDescriptors: Int, depth: UInt8, pass: UInt64) {
        guard isSleeping(depth: depth) else { return }
        endSpan(.sleep, detail: reason, depth: depth, pass: pass)
        sample(readyName, readyDescriptors, depth: depth, pass: pass)
    }

    func detached() { finish() }
}
