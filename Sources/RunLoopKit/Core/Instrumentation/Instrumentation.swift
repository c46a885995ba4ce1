import Synchronization

// The instrumentation seam (RunLoopMonitor's DocC articles "Tracing" and "Lag monitoring"): what the stall monitor, the trace recorder and users read
// about a loop while it runs.
//
// - Always on: the current phase and the iteration generation, packed in one atomic word that any
//   thread reads (a relaxed store per phase change on the loop's thread; no clock read).
// - While a phase watch is held (``RunLoop/watchPhases()``): the phase's start time too (one
//   clock read per phase change).
// - While an iteration reporter is installed (``RunLoop/addIterationReporter(_:)``): at the end of
//   each pass, a report of the pass (its mode, what woke it, how long it slept, the time in each
//   phase), handed to the reporters on the loop's thread.

extension RunLoop {
    /// The part of a pass the loop is in: what a stall monitor reports a stuck loop was doing.
    ///
    /// A phase is entered when it has work (an observer to call, a block, a signalled source, a due
    /// timer, a ready descriptor or port, a sleep ahead); between two such phases the last one
    /// stays published. A pass that only polls does not enter ``waiting``.
    public enum Phase: UInt8, Sendable, Hashable, CaseIterable, CustomStringConvertible {
        /// No run is in progress.
        case notRunning = 0
        /// Calling observers (any activity).
        case observers
        /// Running performed blocks.
        case blocks
        /// Performing signalled version-0 sources (``RunLoopSource``).
        case sources0
        /// Firing due timers.
        case timers
        /// Handling version-1 sources (descriptor sources, message ports, the main queue).
        case sources1
        /// Waiting: asleep in the kernel, spinning for a timer, or polling.
        case waiting

        /// The phase's name.
        public var description: String {
            switch self {
            case .notRunning: "notRunning"
            case .observers: "observers"
            case .blocks: "blocks"
            case .sources0: "sources0"
            case .timers: "timers"
            case .sources1: "sources1"
            case .waiting: "waiting"
            }
        }
    }

    /// What the loop is doing, read from any thread without a lock (see ``phaseSnapshot``).
    public struct PhaseSnapshot: Sendable, Hashable {
        /// The phase the loop is in.
        public let phase: Phase
        /// The number of passes the loop has begun (all runs, nested ones included); a value that
        /// does not change while ``phase`` is not ``Phase/waiting`` means the loop is stuck in it.
        public let generation: UInt64
        /// When the phase began, while a ``watchPhases()`` token is held; nil otherwise.
        public let since: ContinuousClock.Instant?
        /// When the loop last started working, while a ``watchPhases()`` token is held; nil
        /// otherwise: the first phase with work of the pass, the first after the pass's sleep, or
        /// the end of a nested run (the enclosing pass goes on from there). A stall monitor
        /// measures a stall from it: how long the loop has been busy without sleeping.
        public let busySince: ContinuousClock.Instant?
    }

    /// The loop's phase and iteration generation now, and the phase's and the work's start times
    /// while phases are watched. Any thread; relaxed atomic loads, no lock. The times are read
    /// between two reads of the phase word and retried (a few times) until both agree, so they
    /// belong to the phase reported unless the loop changes phase faster than the reader reads.
    public var phaseSnapshot: PhaseSnapshot {
        var word = instrumentation.phaseWord.load(ordering: .relaxed)
        var since: Int64 = 0
        var busy: Int64 = 0
        for _ in 0..<4 {
            since = instrumentation.phaseStartNs.load(ordering: .acquiring)
            busy = instrumentation.busyStartNs.load(ordering: .acquiring)
            let again = instrumentation.phaseWord.load(ordering: .acquiring)
            if again == word { break }
            word = again
        }
        let watched = instrumentation.watchers.load(ordering: .relaxed) > 0
        return PhaseSnapshot(
            phase: Phase(rawValue: UInt8(truncatingIfNeeded: word)) ?? .notRunning,
            generation: word >> 8,
            since: watched && since > 0 ? LoopClock.instant(since) : nil,
            busySince: watched && busy > 0 ? LoopClock.instant(busy) : nil)
    }

    /// The kernel id of the loop's thread (what `gettid()` returns on it): what a stack capture
    /// or a per-thread CPU clock is given.
    public var threadID: Int32 { ownerTID }

    /// The name the loop's thread had when the loop was made (or `tid N` when it had none).
    public var threadName: String { ownerName }

    /// Whether the loop's thread has exited (the loop is torn down and runs no more). Any thread.
    public var hasThreadExited: Bool { blocksClosed.load(ordering: .acquiring) }

    /// Stamps each phase's start time (``PhaseSnapshot/since``) until the token is cancelled: what
    /// a stall monitor holds while it watches the loop. Costs one clock read per phase change.
    /// Any thread.
    public func watchPhases() -> InstrumentationToken {
        instrumentation.watchers.add(1, ordering: .relaxed)
        instrumentation.refreshFlags()
        let instrumentation = self.instrumentation
        return InstrumentationToken {
            instrumentation.watchers.subtract(1, ordering: .relaxed)
            instrumentation.refreshFlags()
        }
    }

    /// Calls `reporter` on the loop's thread at the end of every pass with a report of the pass,
    /// until the token is cancelled. While any reporter is installed, the loop reads the clock at
    /// each phase change (see BENCHMARKS.md for the cost); with none, it reads no clock and stores
    /// nothing but the phase word. Any thread.
    ///
    /// The reporter runs with no lock held and may do anything a callback may do (cancel its own
    /// token, run the loop); it should be quick, as it runs on every pass. Passes of a run nested
    /// in a reporter are not reported (a reporter is never re-entered, as an observer is not).
    public func addIterationReporter(_ reporter: @escaping @Sendable (IterationReport) -> Void) -> InstrumentationToken {
        let id = instrumentation.add(reporter)
        let instrumentation = self.instrumentation
        return InstrumentationToken { instrumentation.remove(id) }
    }

    /// Why a pass's wait ended.
    public enum WakeReason: UInt8, Sendable, Hashable, CustomStringConvertible {
        /// The pass did not sleep: it only polled (a source was handled, a zero timeout, pending
        /// work).
        case none
        /// A timer became due.
        case timer
        /// A watched descriptor became ready.
        case descriptor
        /// A message port (or another version-1 source) has work.
        case port
        /// Another thread woke the loop: ``wakeUp()``, ``stop()``, or a performed block.
        case wakeUp
        /// The run's deadline passed.
        case timeout

        /// The reason's name.
        public var description: String {
            switch self {
            case .none: "none"
            case .timer: "timer"
            case .descriptor: "descriptor"
            case .port: "port"
            case .wakeUp: "wakeUp"
            case .timeout: "timeout"
            }
        }
    }

    /// One pass of a loop, as an iteration reporter sees it (``addIterationReporter(_:)``).
    public struct IterationReport: Sendable {
        /// The mode of the run the pass belongs to.
        public let mode: Mode
        /// The pass's generation (see ``PhaseSnapshot/generation``).
        public let generation: UInt64
        /// What ended the pass's wait.
        public let wakeReason: WakeReason
        /// How long the pass slept (zero when it only polled).
        public let slept: Duration
        /// Time spent in each phase during the pass, nested runs included in the phase that ran
        /// them.
        public let phaseTimes: PhaseTimes
    }

    /// Time per phase, without a dictionary (a report allocates nothing).
    public struct PhaseTimes: Sendable, Hashable {
        var nanoseconds: (Int64, Int64, Int64, Int64, Int64, Int64, Int64) = (0, 0, 0, 0, 0, 0, 0)

        /// The time spent in `phase`.
        public subscript(phase: Phase) -> Duration { .nanoseconds(value(phase)) }

        /// The total over every phase: the pass's duration.
        public var total: Duration { .nanoseconds(Phase.allCases.reduce(0) { $0 + value($1) }) }

        func value(_ phase: Phase) -> Int64 {
            switch phase {
            case .notRunning: nanoseconds.0
            case .observers: nanoseconds.1
            case .blocks: nanoseconds.2
            case .sources0: nanoseconds.3
            case .timers: nanoseconds.4
            case .sources1: nanoseconds.5
            case .waiting: nanoseconds.6
            }
        }

        mutating func add(_ ns: Int64, to phase: Phase) {
            switch phase {
            case .notRunning: nanoseconds.0 &+= ns
            case .observers: nanoseconds.1 &+= ns
            case .blocks: nanoseconds.2 &+= ns
            case .sources0: nanoseconds.3 &+= ns
            case .timers: nanoseconds.4 &+= ns
            case .sources1: nanoseconds.5 &+= ns
            case .waiting: nanoseconds.6 &+= ns
            }
        }

        /// Equal when every phase's time is.
        public static func == (lhs: PhaseTimes, rhs: PhaseTimes) -> Bool {
            Phase.allCases.allSatisfy { lhs.value($0) == rhs.value($0) }
        }

        /// Hashes every phase's time.
        public func hash(into hasher: inout Hasher) {
            for phase in Phase.allCases { hasher.combine(value(phase)) }
        }
    }

    /// Ends a phase watch or removes an iteration reporter; ``cancel()`` (or dropping the token)
    /// ends it once.
    public final class InstrumentationToken: Sendable {
        private let onCancel: Mutex<(@Sendable () -> Void)?>

        init(_ onCancel: @escaping @Sendable () -> Void) { self.onCancel = Mutex(onCancel) }

        /// Ends what the token stands for. Any thread; later calls do nothing.
        public func cancel() {
            let action = onCancel.locked { action -> (@Sendable () -> Void)? in
                defer { action = nil }
                return action
            }
            action?()
        }

        deinit { cancel() }
    }
}

/// A loop's instrumentation state: the atomics any thread reads, and the reporters.
final class LoopInstrumentation: Sendable {
    /// Bits of ``flags``.
    static let stampPhases: UInt8 = 1
    static let reportIterations: UInt8 = 2
    /// A recorder is attached (see Tracing.swift); not part of a pass's `flags`, which stamp
    /// phases.
    static let traceEvents: UInt8 = 4

    /// `generation << 8 | phase`: one word, so a reader sees a phase with its own pass.
    let phaseWord = Atomic<UInt64>(0)
    /// When the current phase began (loop nanoseconds), while stamped; 0 otherwise.
    let phaseStartNs = Atomic<Int64>(0)
    /// When the loop last started working (see ``RunLoop/PhaseSnapshot/busySince``), while
    /// stamped; 0 otherwise.
    let busyStartNs = Atomic<Int64>(0)
    /// Phase watches held.
    let watchers = Atomic<Int>(0)
    /// What a pass must do beyond publishing its phase: read once per pass by the loop.
    let flags = Atomic<UInt8>(0)
    /// Bumped when a reporter is added or removed: the loop then copies the list again.
    let reportersVersion = Atomic<UInt64>(0)
    /// The attached recorder (Tracing.swift), and a version bumped at each change (the loop
    /// compares it once per pass of its outermost run).
    let recorder = Mutex<(any LoopRecorder)?>(nil)
    let traceVersion = Atomic<UInt64>(0)
    /// `(label << 8 | kind) << 32 | sequence` of the callout in progress (see Callouts.swift).
    let calloutWord = Atomic<UInt64>(0)
    /// Callout describers by label id (Callouts.swift), and how many there are: asked by other
    /// threads, never by the loop.
    private let describers = Mutex<[(id: UInt64, label: UInt32, describe: @Sendable () -> String?)]>([])
    let describerCount = Atomic<Int>(0)
    private let nextDescriberID = Atomic<UInt64>(1)
    private let reporters = Mutex<(nextID: UInt64, list: [(id: UInt64, call: @Sendable (RunLoop.IterationReport) -> Void)])>(
        (1, []))

    func add(_ reporter: @escaping @Sendable (RunLoop.IterationReport) -> Void) -> UInt64 {
        let id = reporters.locked { reporters -> UInt64 in
            defer { reporters.nextID += 1 }
            reporters.list.append((reporters.nextID, reporter))
            return reporters.nextID
        }
        refreshFlags()
        return id
    }

    func remove(_ id: UInt64) {
        let removed = reporters.locked { reporters in
            let removed = reporters.list.filter { $0.id == id }
            reporters.list.removeAll { $0.id == id }
            return removed
        }
        refreshFlags()
        // The closure is released here, after the lock.
        _ = consume removed
    }

    func addDescriber(label: UInt32, _ describe: @escaping @Sendable () -> String?) -> UInt64 {
        let id = nextDescriberID.add(1, ordering: .relaxed).oldValue
        describers.locked { list in
            list.append((id, label, describe))
            describerCount.store(list.count, ordering: .relaxed)
        }
        return id
    }

    func removeDescriber(_ id: UInt64) {
        let removed = describers.locked { list in
            let removed = list.filter { $0.id == id }
            list.removeAll { $0.id == id }
            describerCount.store(list.count, ordering: .relaxed)
            return removed
        }
        // The closure is released here, after the lock.
        _ = consume removed
    }

    /// The latest describer registered for `label` (called with no lock held).
    func describer(for label: UInt32) -> (@Sendable () -> String?)? {
        describers.locked { list in list.last { $0.label == label }?.describe }
    }

    /// The reporters now (a copy: they are called with no lock held).
    var currentReporters: [(id: UInt64, call: @Sendable (RunLoop.IterationReport) -> Void)] {
        reporters.locked { $0.list }
    }

    func refreshFlags() {
        reporters.locked { reporters in
            // Under the reporters' lock, so that racing changes end with the last one's flags.
            var flags: UInt8 = 0
            if watchers.load(ordering: .relaxed) > 0 { flags |= Self.stampPhases }
            if !reporters.list.isEmpty { flags |= Self.reportIterations | Self.stampPhases }
            if recorder.locked({ $0 != nil }) { flags |= Self.traceEvents }
            self.flags.store(flags, ordering: .relaxed)
            if flags & ~Self.traceEvents == 0 {
                phaseStartNs.store(0, ordering: .relaxed)
                busyStartNs.store(0, ordering: .relaxed)
            }
            reportersVersion.add(1, ordering: .releasing)
        }
    }
}

/// A pass's instrumentation, in its run's context (loop thread only).
struct PassInstrumentation {
    /// The flags read at the pass's start (``LoopInstrumentation/flags``).
    var flags: UInt8 = 0
    var phase: RunLoop.Phase = .notRunning
    /// When the current phase began; valid while ``flags`` stamps phases.
    var phaseStartNs: Int64 = 0
    var times = RunLoop.PhaseTimes()
    /// Whether ``LoopInstrumentation/busyStartNs`` was stamped since the pass began or last slept.
    var busyStamped = false
    /// What ended the pass's wait (set only while reporting or tracing).
    var wakeReason: RunLoop.WakeReason = .none
    /// A trace buffer is attached and the loop has its tracer (`LoopThreadState.tracer`).
    var tracing = false
    /// The run has begun its first pass (before it, `entry` observers belong to the first pass).
    var begun = false
}
