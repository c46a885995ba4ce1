import Synchronization

// The trace seam (RunLoopMonitor's DocC article "Tracing"): while a trace buffer is attached to a loop, the run algorithm writes
// plain records of what it does into the buffer's ring: runs (entry to exit, with mode and
// result), callouts (each naming its item), sleeps (with what woke the loop) and counters. The
// recorder, its exports and the timeline page are RunLoopMonitor's (TraceRecorder); this file is
// what the loop itself must do, cheaply.
//
// Cost: one clock read per change of what the loop does, none per repeat. A callout of the same
// item at the same depth as the one just finished, with nothing recorded in between, is folded
// into that one's record (its count and pass range grow) until `foldLimit` repeats, so a loop
// that calls one source a million times a second reads the clock once per `foldLimit` calls.
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
package final class TraceBuffer: @unchecked Sendable {
    /// Words per record (see ``TraceRecord`` for the packing).
    static let wordsPerRecord = 6
    /// Distinct names a buffer keeps; later names are recorded as ``overflowName``.
    package static let nameLimit = 65_536
    /// The name recorded for an item once the table is full.
    package static let overflowName = "(name table full)"

    /// The number of records the ring holds.
    package let capacity: Int
    /// Tags the names items cache (see ``TraceNameSlot``): unique per buffer in the process.
    package let id: UInt32
    private let slots: UnsafeMutablePointer<Atomic<UInt64>>
    private let written = Atomic<UInt64>(0)
    private let names = Mutex<(list: [String], index: [String: UInt32])>(([], [:]))
    private static let nextID = Atomic<UInt32>(0)
    /// Timers' cached name indexes (see `timerName`): the attached loop's thread only.
    @exclusivity(unchecked) var timerNames: [ObjectIdentifier: UInt32] = [:]
    @exclusivity(unchecked) var timerNamesVersion: UInt64 = 0

    /// A buffer of `capacity` records; `capacity` must be positive (the recorder checks it).
    package init(capacity: Int) {
        precondition(capacity > 0, "TraceBuffer capacity must be positive")
        self.capacity = capacity
        // Never 0: a cached name of 0 means "not cached".
        var id = Self.nextID.add(1, ordering: .relaxed).newValue
        if id == 0 { id = Self.nextID.add(1, ordering: .relaxed).newValue }
        self.id = id
        let count = capacity * Self.wordsPerRecord
        slots = .allocate(capacity: count)
        for index in 0..<count { (slots + index).initialize(to: Atomic(0)) }
    }

    deinit {
        slots.deinitialize(count: capacity * Self.wordsPerRecord)
        slots.deallocate()
    }

    /// Records written since the buffer was made (the ring holds the last ``capacity``).
    package var recordsWritten: UInt64 { written.load(ordering: .acquiring) }

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
    package func snapshot() -> (records: [TraceRecord], overwritten: UInt64) {
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
    package var nameTable: [String] { names.locked { $0.list } }

    /// The index of `name` in the table, added if new (equal names share an index); the overflow
    /// name's once the table holds ``nameLimit`` names. Takes the table's lock: done once per item
    /// and buffer, not per event.
    package func intern(_ name: String) -> UInt32 {
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
package struct TraceRecord: Sendable, Hashable {
    /// What a record stands for.
    package enum Kind: UInt8, Sendable {
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

    package var kind: Kind
    package var phase: RunLoop.Phase
    package var detail: UInt8
    /// Nesting: 0 for the outermost run's events, 1 for a run nested in one of its callouts...
    package var depth: UInt8
    package var name: UInt32
    package var start: Int64
    package var end: Int64
    /// The pass (generation) the record began in, and how many passes later it ended.
    package var firstPass: UInt64
    package var passSpan: UInt32
    package var count: UInt32
    package var value: Int64

    package init(
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

/// An item's name in a trace: its ``label`` if set, otherwise a stable short identity (not its
/// `description`, which shows state that changes). Cached per buffer, so naming a callout is one
/// relaxed load once the item was seen.
struct TraceNameSlot: ~Copyable, Sendable {
    /// `buffer id << 32 | name index`, or 0.
    /// The label's ``CalloutLabels`` id (0: none): what the loop publishes when it calls the item.
    /// First, at a fixed offset: the loop reads it at every callout.
    let calloutLabel = Atomic<UInt32>(0)
    private let cached = Atomic<UInt64>(0)
    private let userLabel = Mutex<String?>(nil)

    init() {}

    var label: String? {
        get { userLabel.locked { $0 } }
        nonmutating set {
            userLabel.locked { $0 = newValue }
            cached.store(0, ordering: .relaxed)
            calloutLabel.store(CalloutLabels.id(for: newValue), ordering: .relaxed)
        }
    }

    @inline(__always)
    func index(in buffer: TraceBuffer, identity: () -> String) -> UInt32 {
        let word = cached.load(ordering: .relaxed)
        if word >> 32 == UInt64(buffer.id) { return UInt32(truncatingIfNeeded: word) }
        return intern(in: buffer, identity: identity)
    }

    private func intern(in buffer: TraceBuffer, identity: () -> String) -> UInt32 {
        let index = buffer.intern(label ?? identity())
        cached.store(UInt64(buffer.id) << 32 | UInt64(index), ordering: .relaxed)
        return index
    }
}

/// What the run algorithm asks of an item it calls out to while a trace is recorded.
protocol TraceNamed: AnyObject {
    func traceName(in buffer: TraceBuffer) -> UInt32
}

/// The recording state of a loop with a trace buffer attached. Loop thread only: it lives in
/// `LoopThreadState` and is swapped only between passes of the outermost run (see
/// `RunLoop.pickUpTraceBuffer`), so a callout in progress never loses its tracer.
final class LoopTracer {
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
    /// A repeat of the pending callout is in progress, folded into it: no clock was read at its
    /// start and nothing is on the open stack for it (a hot loop's repeats cost a compare and a
    /// count). If anything begins inside it (a nested run), it is made an open span then.
    @exclusivity(unchecked) private var foldInProgress = false

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
        let now = LoopClock.now()
        lastRead = now
        if hasPending { flushPending(at: now) }
        return now
    }

    private func flushPending(at now: Int64) {
        hasPending = false
        pending.end = now
        buffer.write(pending)
    }

    /// Something begins inside a folded repeat: the repeat becomes its own open span from now
    /// (the calls before it stay in the pending record, which this read writes).
    private func unfold() {
        foldInProgress = false
        let folded = pending
        let now = read()
        push(
            OpenSpan(
                kind: .callout, phase: folded.phase, detail: folded.detail, depth: folded.depth, name: folded.name,
                start: now, firstPass: folded.firstPass &+ UInt64(folded.passSpan)))
    }

    @inline(__always)
    private func push(_ span: OpenSpan) {
        (open + openCount).initialize(to: span)
        openCount += 1
    }

    @inline(__always)
    func beginCallout(_ phase: RunLoop.Phase, name: UInt32, detail: UInt8 = 0, depth: UInt8, pass: UInt64) {
        if _slowPath(foldInProgress) { unfold() }
        guard openCount < Self.depthLimit else {
            skippedDepth += 1
            return
        }
        if hasPending, pending.name == name, pending.phase == phase, pending.depth == depth, pending.detail == detail,
            pending.count < Self.foldLimit
        {
            foldInProgress = true
            return
        }
        let now = read()
        push(
            OpenSpan(
                kind: .callout, phase: phase, detail: detail, depth: depth, name: name, start: now, firstPass: pass))
    }

    @inline(__always)
    func endCallout(depth: UInt8, pass: UInt64) {
        if foldInProgress {
            // The repeat folded at beginCallout (nothing began inside it) ends: one more call.
            foldInProgress = false
            pending.count += 1
            pending.passSpan = UInt32(truncatingIfNeeded: pass &- pending.firstPass)
            if pending.count >= Self.foldLimit { _ = read() }
            return
        }
        guard openCount > 0, open[openCount - 1].kind == .callout, open[openCount - 1].depth == depth else {
            if skippedDepth > 0 { skippedDepth -= 1 }
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
    }

    func beginSpan(_ kind: TraceRecord.Kind, phase: RunLoop.Phase, name: UInt32, depth: UInt8, pass: UInt64) {
        if _slowPath(foldInProgress) { unfold() }
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
}

// MARK: The loop's side

extension RunLoop {
    /// Attaches `buffer`: the loop records into it from its next pass (of its outermost run) until
    /// the token is cancelled. A buffer attached later replaces it. Any thread.
    package func attachTraceBuffer(_ buffer: TraceBuffer) -> InstrumentationToken {
        instrumentation.traceBuffer.locked { $0 = buffer }
        instrumentation.traceVersion.add(1, ordering: .releasing)
        instrumentation.refreshFlags()
        let instrumentation = self.instrumentation
        // By identity, not a weak reference: a weakly referenced object's every retain takes the
        // runtime's slow path, and the loop retains its buffer per event.
        let attachedID = ObjectIdentifier(buffer)
        return InstrumentationToken {
            let detached = instrumentation.traceBuffer.locked { attached -> Bool in
                guard let current = attached, ObjectIdentifier(current) == attachedID else { return false }
                attached = nil
                return true
            }
            guard detached else { return }
            instrumentation.traceVersion.add(1, ordering: .releasing)
            instrumentation.refreshFlags()
        }
    }

    /// Takes up the attached buffer (or lets go of a detached one). Between passes of the
    /// outermost run, or at its entry: no traced callout of this loop is in progress.
    @inline(__always)
    func pickUpTraceBuffer() {
        let version = instrumentation.traceVersion.load(ordering: .acquiring)
        guard version != confined.traceVersion else { return }
        takeUpTraceBuffer(version)
    }

    private func takeUpTraceBuffer(_ version: UInt64) {
        confined.traceVersion = version
        let buffer = instrumentation.traceBuffer.locked { $0 }
        if let tracer = confined.tracer {
            if tracer.buffer === buffer { return }
            tracer.finish()
        }
        confined.tracer = buffer.map { LoopTracer(buffer: $0) }
        confined.tracedMode = nil
    }

    /// The pass an event belongs to: the run's first for its entry (which comes before it).
    @inline(__always)
    private func tracePass(_ context: RunContext) -> UInt64 {
        context.pass.begun ? confined.generation : confined.generation &+ 1
    }

    @inline(__always)
    private var traceDepth: UInt8 { UInt8(clamping: confined.runDepth - 1) }

    func traceRunBegin(_ context: inout RunContext) {
        guard let tracer = confined.tracer else { return }
        let name: UInt32
        if let traced = confined.tracedMode, traced.mode == context.mode {
            name = traced.name
        } else {
            name = tracer.buffer.intern(context.mode.rawValue)
            confined.tracedMode = (context.mode, name)
        }
        tracer.beginSpan(.run, phase: .notRunning, name: name, depth: traceDepth, pass: tracePass(context))
    }

    func traceRunEnd(_ result: RunResult, _ context: inout RunContext) {
        confined.tracer?.endSpan(
            .run, detail: UInt8(truncatingIfNeeded: result.rawValue), depth: traceDepth, pass: tracePass(context))
    }

    @inline(__always)
    func traceCalloutBegin<Item: TraceNamed>(_ item: Item, _ phase: Phase, detail: UInt8 = 0, _ context: inout RunContext) {
        let (depth, pass) = (traceDepth, tracePass(context))
        confined.tracerRef?._withUnsafeGuaranteedRef { tracer in
            tracer.beginCallout(phase, name: item.traceName(in: tracer.buffer), detail: detail, depth: depth, pass: pass)
        }
    }

    func traceCalloutBegin(_ item: any Source1Item, _ phase: Phase, _ context: inout RunContext) {
        let (depth, pass) = (traceDepth, tracePass(context))
        confined.tracerRef?._withUnsafeGuaranteedRef { tracer in
            tracer.beginCallout(phase, name: item.traceName(in: tracer.buffer), depth: depth, pass: pass)
        }
    }

    func traceBlockBegin(_ context: inout RunContext) {
        let (depth, pass) = (traceDepth, tracePass(context))
        confined.tracerRef?._withUnsafeGuaranteedRef { tracer in
            tracer.beginCallout(.blocks, name: tracer.blockName, depth: depth, pass: pass)
        }
    }

    @inline(__always)
    func traceCalloutEnd(_ context: inout RunContext) {
        let (depth, pass) = (traceDepth, tracePass(context))
        confined.tracerRef?._withUnsafeGuaranteedRef { tracer in tracer.endCallout(depth: depth, pass: pass) }
    }

    func traceSleepBegin(_ context: inout RunContext) {
        guard let tracer = confined.tracer else { return }
        tracer.beginSpan(.sleep, phase: .waiting, name: tracer.sleepName, depth: traceDepth, pass: tracePass(context))
    }

    /// Ends the pass's sleep (if it slept) with what woke it, and samples the ready descriptors.
    func traceWake(_ context: inout RunContext) {
        guard let tracer = confined.tracer, tracer.isSleeping(depth: traceDepth) else { return }
        tracer.endSpan(.sleep, detail: context.pass.wakeReason.rawValue, depth: traceDepth, pass: tracePass(context))
        tracer.sample(tracer.readyName, context.scratch.kernelEvents.count, depth: traceDepth, pass: tracePass(context))
    }
}
