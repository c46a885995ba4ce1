import Synchronization

// The recorder seam: while a recorder is attached to a loop, the run algorithm tells it what it
// does, on the loop's thread: runs (entry to exit, with mode and result), callouts (each naming
// its item), sleeps (with what woke the loop). What a recorder keeps is its own: RunLoopMonitor's
// TraceRecorder writes a ring of records (its TraceBuffer.swift: the record format, the folding
// of repeats), RunLoopTesting's activity trail keeps the last callouts. This file is what the
// loop itself must do: hand the events over, and name the items cheaply.
//
// Cost while no recorder is attached: one relaxed load of the instrumentation flags per pass
// (`beginPass`) and a branch per phase. Items keep only their label (`ItemLabel`); the loop caches
// each item's name index for the attached recorder by identity, so naming a callout that is not
// a repeat is one hash lookup once the item was seen, and a repeat needs no name at all.
//
// Repeats are folded here, before the seam: a callout of the same item at the same depth as the
// one just finished, with nothing else in between, is counted in the loop's thread state
// (`TraceFold`) and handed over as one `calloutRepeated` when something else happens, so a loop
// that calls one source a million times a second makes no call into the recorder and reads no
// clock for the repeats (up to the recorder's `foldLimit` calls per record).

/// What a loop tells an attached recorder (see ``RunLoop/attachRecorder(_:)``). Called on the
/// loop's thread only, in order; `depth` is 0 for the outermost run's events, 1 for a run nested
/// in one of its callouts...; `pass` is the pass (generation) the event belongs to.
package protocol LoopRecorder: AnyObject, Sendable {
    /// Tags the names items cache for this recorder: unique among the process's recorders, not 0.
    var nameTag: UInt32 { get }
    /// The index of `name` in the recorder's name table (equal names may share one). Called once
    /// per item and recorder, and once per mode, not per event.
    func intern(_ name: String) -> UInt32
    /// Calls of one item the loop folds into one callout at most (read once, when the recorder is
    /// taken up); 1 or less: no folding, every call is its own `calloutBegan`/`calloutEnded`.
    var foldLimit: UInt32 { get }
    func runBegan(mode name: UInt32, depth: UInt8, pass: UInt64)
    /// `result`: the run's ``RunLoop/RunResult`` raw value.
    func runEnded(result: UInt8, depth: UInt8, pass: UInt64)
    /// `detail`: an observer's activity bit (its index), 0 for other callouts.
    func calloutBegan(_ phase: RunLoop.Phase, name: UInt32, detail: UInt8, depth: UInt8, pass: UInt64)
    func blockBegan(depth: UInt8, pass: UInt64)
    func calloutEnded(depth: UInt8, pass: UInt64)
    /// The callout that ended last was made `times` more times (whole calls, nothing recorded in
    /// between), the last of them in pass `lastPass`. Comes before the next event.
    func calloutRepeated(times: UInt32, lastPass: UInt64)
    func sleepBegan(depth: UInt8, pass: UInt64)
    /// The sleep at `depth` ended (if one began): `reason` is the ``RunLoop/WakeReason`` raw value.
    func woke(reason: UInt8, readyDescriptors: Int, depth: UInt8, pass: UInt64)
    /// The loop lets go of the recorder (detached, replaced, or the thread ends).
    func detached()
}

/// Holds the attached recorder for the loop's hooks, which reach it unretained (see
/// `LoopThreadState.tracerRef`): a `let` of a class they borrow needs no retain.
final class RecorderBox {
    let recorder: any LoopRecorder
    init(_ recorder: any LoopRecorder) { self.recorder = recorder }
}

/// Tags for recorders' ``LoopRecorder/nameTag``: unique per recorder made, never 0.
package enum RecorderTags {
    private static let last = Atomic<UInt32>(0)

    /// A tag no recorder made before has (until 2^32 have been made).
    package static func next() -> UInt32 {
        var tag = last.add(1, ordering: .relaxed).newValue
        if tag == 0 { tag = last.add(1, ordering: .relaxed).newValue }
        return tag
    }
}

/// An item's label (its ``label`` and the label's ``CalloutLabels`` id): all an item keeps for
/// recorders and monitors. The names a recorder uses are cached by the loop
/// (`LoopThreadState.itemNames`), not in the item.
struct ItemLabel: ~Copyable, Sendable {
    /// The label's ``CalloutLabels`` id (0: none): what the loop publishes when it calls the item.
    /// First, at a fixed offset: the loop reads it at every callout.
    let calloutLabel = Atomic<UInt32>(0)
    private let userLabel = Mutex<String?>(nil)

    init() {}

    var label: String? {
        get { userLabel.locked { $0 } }
        nonmutating set {
            userLabel.locked { $0 = newValue }
            calloutLabel.store(CalloutLabels.id(for: newValue), ordering: .relaxed)
            ItemLabels.changed()
        }
    }
}

/// A version bumped at every label change: loops drop the names they cached (`itemName`).
enum ItemLabels {
    static let version = Atomic<UInt64>(0)

    static func changed() { version.add(1, ordering: .releasing) }
}

/// What the run algorithm asks of an item it calls out to while a recorder is attached: its name
/// for recorders (its label, or a stable short identity, not its `description`, which shows
/// state that changes).
protocol TraceNamed: AnyObject {
    var traceName: String { get }
}

// MARK: The loop's side

extension RunLoop {
    /// Attaches `recorder`: the loop tells it its events from its next pass (of its outermost run)
    /// until the token is cancelled. A recorder attached later replaces it. Any thread.
    package func attachRecorder(_ recorder: any LoopRecorder) -> InstrumentationToken {
        instrumentation.recorder.locked { $0 = recorder }
        instrumentation.traceVersion.add(1, ordering: .releasing)
        instrumentation.refreshFlags()
        let instrumentation = self.instrumentation
        // By identity, not a weak reference: a weakly referenced object's every retain takes the
        // runtime's slow path.
        let attachedID = ObjectIdentifier(recorder)
        return InstrumentationToken {
            let detached = instrumentation.recorder.locked { attached -> Bool in
                guard let current = attached, ObjectIdentifier(current) == attachedID else { return false }
                attached = nil
                return true
            }
            guard detached else { return }
            instrumentation.traceVersion.add(1, ordering: .releasing)
            instrumentation.refreshFlags()
        }
    }

    /// Takes up the attached recorder (or lets go of a detached one). Between passes of the
    /// outermost run, or at its entry: no recorded callout of this loop is in progress.
    @inline(__always)
    func pickUpRecorder() {
        let version = instrumentation.traceVersion.load(ordering: .acquiring)
        guard version != confined.trace.traceVersion else { return }
        takeUpRecorder(version)
    }

    private func takeUpRecorder(_ version: UInt64) {
        confined.trace.traceVersion = version
        let recorder = instrumentation.recorder.locked { $0 }
        if let current = confined.trace.tracer {
            if let recorder, current === recorder { return }
            settleFold()
            current.detached()
        }
        confined.trace.tracer = recorder
        confined.trace.fold = TraceFold(limit: recorder?.foldLimit ?? 0)
        confined.trace.tracedMode = nil
        confined.trace.itemNames.removeAll()
    }

    /// An item's name index in the attached recorder, cached by identity in the loop's thread
    /// state (items keep only their label). An item freed and another made at its address with
    /// no label shows the first one's default name.
    ///
    /// - Complexity: one hash lookup; the name is made and interned once per item and recorder.
    func itemName<Item: TraceNamed>(_ item: Item) -> UInt32 {
        let version = ItemLabels.version.load(ordering: .acquiring)
        if version != confined.trace.itemNamesVersion {
            confined.trace.itemNames.removeAll(keepingCapacity: true)
            confined.trace.itemNamesVersion = version
        }
        let id = ObjectIdentifier(item)
        if let index = confined.trace.itemNames[id] { return index }
        let index = internTraceName(item.traceName)
        if confined.trace.itemNames.count < TraceState.itemNameLimit { confined.trace.itemNames[id] = index }
        return index
    }

    /// Calls `body` with the attached recorder (one is attached), taking no reference to it: the
    /// loop's thread state keeps it alive, and changes it only between passes of the outermost
    /// run.
    @inline(__always)
    private func withRecorder(_ body: (any LoopRecorder) -> Void) {
        confined.trace.tracerRef.unsafelyUnwrapped._withUnsafeGuaranteedRef { body($0.recorder) }
    }

    /// `name`'s index in the attached recorder's table (one is attached).
    func internTraceName(_ name: String) -> UInt32 {
        confined.trace.tracer!.intern(name)
    }

    /// The pass an event belongs to: the run's first for its entry (which comes before it).
    @inline(__always)
    private func tracePass(_ context: RunContext) -> UInt64 {
        context.pass.begun ? confined.passes.generation : confined.passes.generation &+ 1
    }

    @inline(__always)
    private var traceDepth: UInt8 { UInt8(clamping: confined.runDepth - 1) }

    func traceRunBegin(_ context: inout RunContext) {
        guard let recorder = confined.trace.tracer else { return }
        let name: UInt32
        if let traced = confined.trace.tracedMode, traced.mode == context.mode {
            name = traced.name
        } else {
            name = recorder.intern(context.mode.rawValue)
            confined.trace.tracedMode = (context.mode, name)
        }
        settleFold()
        recorder.runBegan(mode: name, depth: traceDepth, pass: tracePass(context))
    }

    func traceRunEnd(_ result: RunResult, _ context: inout RunContext) {
        guard let recorder = confined.trace.tracer else { return }
        settleFold()
        recorder.runEnded(
            result: UInt8(truncatingIfNeeded: result.rawValue), depth: traceDepth, pass: tracePass(context))
    }

    // The callout hooks touch the recorder only when something is handed over: a repeat folded
    // here costs a cached name's load and a compare, with no reference to the recorder taken (a
    // retain and release per callout would cost more than the fold).

    // Out of line: the phases call these only while tracing, and inlined they make the callout
    // paths longer for every loop (the iterate benchmark's phases-watched row: 0.92x inlined).
    @inline(never)
    func traceCalloutBegin<Item: TraceNamed>(_ item: Item, _ phase: Phase, detail: UInt8 = 0, _ context: inout RunContext) {
        guard confined.trace.tracerTag != 0 else { return }
        let id = UInt(bitPattern: ObjectIdentifier(item))
        if traceRepeat(phase, item: id, detail: detail, context) { return }
        handOverCallout(phase, item: id, name: itemName(item), detail: detail, context)
    }

    func traceCalloutBegin(_ item: any Source1Item, _ phase: Phase, _ context: inout RunContext) {
        guard confined.trace.tracerTag != 0 else { return }
        let id = UInt(bitPattern: ObjectIdentifier(item))
        if traceRepeat(phase, item: id, detail: 0, context) { return }
        handOverCallout(phase, item: id, name: itemName(item), detail: 0, context)
    }

    func traceBlockBegin(_ context: inout RunContext) {
        guard confined.trace.tracerTag != 0 else { return }
        if traceRepeat(.blocks, item: TraceFold.block, detail: 0, context) { return }
        handOverCallout(.blocks, item: TraceFold.block, name: TraceFold.blockName, detail: 0, context)
    }

    /// Whether a callout beginning now repeats the one that ended last, and is folded into it:
    /// compared by the item's identity, so a repeat costs no name lookup.
    @inline(__always)
    private func traceRepeat(_ phase: Phase, item: UInt, detail: UInt8, _ context: RunContext) -> Bool {
        guard confined.trace.fold.repeats(phase, item: item, detail: detail, depth: traceDepth) else { return false }
        confined.trace.fold.beginRepeat(pass: tracePass(context))
        return true
    }

    private func handOverCallout(_ phase: Phase, item: UInt, name: UInt32, detail: UInt8, _ context: RunContext) {
        let depth = traceDepth
        let pass = tracePass(context)
        settleFold()
        if name == TraceFold.blockName {
            withRecorder { $0.blockBegan(depth: depth, pass: pass) }
        } else {
            withRecorder { $0.calloutBegan(phase, name: name, detail: detail, depth: depth, pass: pass) }
        }
        confined.trace.fold.began(phase, item: item, name: name, detail: detail, depth: depth)
    }

    @inline(never)
    func traceCalloutEnd(_ context: inout RunContext) {
        guard confined.trace.tracerTag != 0 else { return }
        let depth = traceDepth
        let pass = tracePass(context)
        let end = confined.trace.fold.end(depth: depth, pass: pass)
        if end != .folded { handOverCalloutEnd(end, depth: depth, pass: pass) }
    }

    private func handOverCalloutEnd(_ end: TraceFold.End, depth: UInt8, pass: UInt64) {
        switch end {
        case .folded:
            return
        case .foldedFull:
            handOverRepeats()
        case .first:
            withRecorder { $0.calloutEnded(depth: depth, pass: pass) }
        case .other:
            settleFold()
            withRecorder { $0.calloutEnded(depth: depth, pass: pass) }
        }
    }

    /// Something other than a repeat happens: the repeats counted so far are handed over, and a
    /// repeat in progress (a nested run inside it is beginning) becomes a callout of its own.
    @inline(__always)
    private func settleFold() {
        guard confined.trace.fold.state != .idle else { return }
        if confined.trace.fold.state == .repeating {
            handOverRepeats()
            let fold = confined.trace.fold
            if fold.name == TraceFold.blockName {
                withRecorder { $0.blockBegan(depth: fold.depth, pass: fold.repeatPass) }
            } else {
                withRecorder {
                    $0.calloutBegan(
                        fold.phase, name: fold.name, detail: fold.detail, depth: fold.depth, pass: fold.repeatPass)
                }
            }
        } else if confined.trace.fold.unreported > 0 {
            handOverRepeats()
        }
        confined.trace.fold.state = .idle
    }

    private func handOverRepeats() {
        let fold = confined.trace.fold
        if fold.unreported > 0 { withRecorder { $0.calloutRepeated(times: fold.unreported, lastPass: fold.lastPass) } }
        confined.trace.fold.unreported = 0
        if fold.state == .ended { confined.trace.fold.state = .idle }
    }

    func traceSleepBegin(_ context: inout RunContext) {
        guard let recorder = confined.trace.tracer else { return }
        settleFold()
        recorder.sleepBegan(depth: traceDepth, pass: tracePass(context))
    }

    /// Ends the pass's sleep (if it slept) with what woke it, and the ready descriptors' count.
    func traceWake(_ context: inout RunContext) {
        guard let recorder = confined.trace.tracer else { return }
        settleFold()
        recorder.woke(
            reason: context.pass.wakeReason.rawValue, readyDescriptors: context.scratch.kernelEvents.count,
            depth: traceDepth, pass: tracePass(context))
    }
}

/// The loop's side of folding repeated callouts (see the top of this file): the callout last
/// begun or ended and the repeats of it not handed over yet. The loop's thread only.
struct TraceFold {
    /// The identity and name a block's callouts are folded under (no item stands for a block).
    static let block: UInt = 0
    static let blockName = UInt32.max

    enum State: UInt8 {
        /// The last event was not a callout that can be repeated.
        case idle
        /// The callout below began and nothing was handed over since.
        case begun
        /// The callout below ended last (with ``unreported`` repeats after it).
        case ended
        /// A repeat of it is in progress, folded (it began at ``repeatPass``).
        case repeating
    }

    /// Calls per folded callout at most (the recorder's `foldLimit`).
    let limit: UInt32
    var state = State.idle
    var phase = RunLoop.Phase.notRunning
    /// The item's identity (`ObjectIdentifier`'s bits; 0 for a block) and its name index.
    var item: UInt = 0
    var name: UInt32 = 0
    var detail: UInt8 = 0
    var depth: UInt8 = 0
    /// Calls counted in the callout so far (the first included), and the repeats not handed over.
    var calls: UInt32 = 0
    var unreported: UInt32 = 0
    var lastPass: UInt64 = 0
    var repeatPass: UInt64 = 0

    init(limit: UInt32) { self.limit = limit }

    /// Whether a callout beginning now repeats the one that ended last (and may be folded in).
    @inline(__always)
    func repeats(_ phase: RunLoop.Phase, item: UInt, detail: UInt8, depth: UInt8) -> Bool {
        state == .ended && self.item == item && self.depth == depth && self.phase == phase && self.detail == detail
            && calls < limit
    }

    @inline(__always)
    mutating func beginRepeat(pass: UInt64) {
        state = .repeating
        repeatPass = pass
    }

    @inline(__always)
    mutating func began(_ phase: RunLoop.Phase, item: UInt, name: UInt32, detail: UInt8, depth: UInt8) {
        state = .begun
        self.phase = phase
        self.item = item
        self.name = name
        self.detail = detail
        self.depth = depth
    }

    enum End {
        /// A folded repeat ended: nothing to hand over yet.
        case folded
        /// A folded repeat ended and the callout holds ``limit`` calls: hand the repeats over.
        case foldedFull
        /// The callout that began last ended: hand its end over; repeats of it may follow.
        case first
        /// Another callout ended (one with events inside it): settle, then hand its end over.
        case other
    }

    @inline(__always)
    mutating func end(depth: UInt8, pass: UInt64) -> End {
        switch state {
        case .repeating:
            state = .ended
            calls += 1
            unreported += 1
            lastPass = pass
            return calls >= limit ? .foldedFull : .folded
        case .begun where self.depth == depth:
            state = .ended
            calls = 1
            unreported = 0
            return .first
        default:
            return .other
        }
    }
}
