import DequeModule

/// What one run (one call of `run(mode:for:…)`) carries through its passes.
struct RunContext {
    let id: UInt64
    /// The enclosing run's id and whether it heard ``RunLoop/wakeUp()`` when this one began
    /// (restored at its end, as CoreFoundation pops its per-run data).
    let wakeEntry: WakeProtocol.RunEntry
    let mode: RunLoop.Mode
    let modeIndex: Int
    let deadline: Int64
    let pollOnly: Bool
    let returnAfterSourceHandled: Bool
    var scratch: RunScratch
    var items = ModeItems()
    /// Whether this run has looked at every version-1 source of its mode for work that came while
    /// the loop ran in other modes (it does on its first pass).
    var sources1Scanned = false
    /// Whether this run cleared a version-1 source's request for attention (see `endRun`).
    var tookAttention = false
    /// Whether a ``RunLoop/wakeUp()`` was ignored before the current pass began (`beginPass`):
    /// its wait then checks that the mode is not empty before it sleeps (`handedOverWorkPending`).
    var ignoredWakeUp = false
    /// How many times pending work of the run's mode (`RunLoopPendingWork`) had been let go when
    /// the run began: once it moves, a pass does not sleep with the mode empty
    /// (`handedOverWorkPending`), and the run ends `.finished`.
    var pendingWorkLetGo: UInt64 = 0
    /// The enclosing run's phase and its start, published again when this run ends.
    let outerPhase: RunLoop.Phase
    let outerPhaseStartNs: Int64
    /// The current pass's instrumentation.
    var pass = PassInstrumentation()
    /// Whether the main queue's port was served in the pass before (CoreFoundation's
    /// `didDispatchPortLastTime`, true when a run starts): that pass's successor does not check it
    /// before sleeping.
    var servedDispatchPortLastPass = true
    /// Whether this pass has already asked the kernel what is ready (a pass that polls asks once,
    /// when it checks the main queue's port, and its wait uses that answer).
    var polledThisPass = false
}

/// A run's copy of its mode's item lists, valid while ``RunLoop/itemsVersion`` equals `version`.
/// The arrays are shared with the mode's (copy-on-write), so taking them copies nothing.
struct ModeItems {
    var version = UInt64.max
    var sources: ContiguousArray<RunLoopSource> = []
    var observers: ContiguousArray<RunLoopObserver> = []
    var observerMask: UInt = 0
    var timerCount = 0
    /// The mode's version-1 sources, in order.
    var sources1: ContiguousArray<any Source1Item> = []
    /// The mode's own interest set (nil: runs in the mode sleep in the backend's base set), and
    /// whether it holds descriptor sources (then even a poll asks the kernel).
    var interestSet: EpollBackend.InterestSet?
    var hasDescriptors = false
    /// The mode has descriptor sources but no interest set (it could not be made): retried at
    /// each wait, and sleeps are cut short to retry.
    var needsInterestSet = false
    /// The mode's interest set must be made anew before the next sleep (see `remakeInterestSet`).
    var interestSetStale = false
    /// Whether the mode is one of the common modes (they change only through `addCommonMode`,
    /// which bumps the items version too).
    var modeIsCommon = false
    /// The loop's dispatch port (the main queue's descriptor source) when it is in this mode.
    var dispatchPort: FileDescriptorSource?
    /// The mode's count of `RunLoopPendingWork` holding it.
    var pendingWork: PendingWorkCount?
}

/// What a wait does once it has decided to wait: nothing (the deadline passed), block until a
/// deadline (in the kernel: the timerfd armed for it; on the futex: its timeout), or spin on the
/// CPU until a timer is due (``RunLoop/timerSpinWindow``). Made by `SleepPlan.make`, the one place
/// that decides when a sleep ends; the strategy that sleeps performs it.
enum SleepPlan: Equatable {
    case none
    case block(until: Int64)
    case spin(until: Int64)

    /// When a sleep ends: at the mode's next timer (`timerDeadline`, coalesced with its
    /// tolerance) or the run's deadline, whichever is first; no later than `retryAfter` from now
    /// (a loop that must try again to make its interest set, or to open its descriptors); and,
    /// with a spin window, that much before the timer, spinning the rest.
    ///
    /// - Complexity: O(1); reads no clock (`now` is given).
    static func make(timerDeadline: Int64, runDeadline: Int64, now: Int64, retryAfter: Int64?, spinWindow: Int64) -> SleepPlan {
        var deadline = min(timerDeadline, runDeadline)
        guard deadline > now else { return .none }
        if let retryAfter { deadline = min(deadline, now.addingSaturated(retryAfter)) }
        if spinWindow > 0 && timerDeadline <= runDeadline {
            // A timer ends this sleep: wake `spinWindow` early and spin the rest.
            let early = timerDeadline.subtractingSaturated(spinWindow)
            if early <= now { return .spin(until: timerDeadline) }
            deadline = min(deadline, early)
        }
        return .block(until: deadline)
    }
}

/// Buffers a run reuses from pass to pass so that a steady-state pass allocates nothing. Each
/// nesting level has its own (kept in `LoopThreadState.spareScratch` between runs).
struct RunScratch {
    var blocks = Deque<PendingBlock>()
    var otherModes = Deque<PendingBlock>()
    /// An emptied inbox buffer, handed back to the inbox at the next exchange.
    var spareBatch: BlockBuffer?
    var dueTimers = ContiguousArray<TimerEntry>()
    /// The signalled version-0 sources a pass collected, with their signal times (unretained: the
    /// pass's item snapshot holds them).
    var signalled = ContiguousArray<(source: Unmanaged<RunLoopSource>, stamp: UInt64)>()
    /// Descriptor events the last wait collected: the registration's tag and what it reported.
    var kernelEvents = ContiguousArray<EpollBackend.Ready>()
    /// The version-1 sources ready this pass, with their events.
    var readySources1 = ContiguousArray<(item: any Source1Item, events: FileDescriptorSource.Events)>()
}

/// A pass's collected due timers while one of their handlers runs: entries from `next` on are
/// not fired yet (see `doTimers`).
struct TimerBatch {
    var modeIndex = -1
    var entries = ContiguousArray<TimerEntry>()
    var next = 0
}

/// State only the loop's own thread reads or writes.
///
/// Its properties skip Swift's dynamic exclusivity checks (a `begin_access` per use, paid on
/// every pass and every fired timer): one thread uses them, with no overlapping access.
///
/// `@unchecked Sendable` is safe because every access happens on the loop's thread: the callers
/// are the run entry points (`run(mode:for:…)` and the phases it calls), each of which starts with
/// `preconditionOnOwnThread`; `tearDown()`, which runs from the thread-local destructor of the
/// exiting loop thread itself; and `deinit`, when no other reference exists.
final class LoopThreadState: @unchecked Sendable {
    @exclusivity(unchecked) var nextRunID: UInt64 = 0
    @exclusivity(unchecked) var warnedCommonRun = false
    /// Blocks taken from the inbox and not yet run (those for other modes wait here, in order).
    @exclusivity(unchecked) var blocks = Deque<PendingBlock>()
    /// An emptied inbox buffer for `drainInbox`'s next exchange, so that draining allocates nothing.
    @exclusivity(unchecked) var spareInboxBuffer: BlockBuffer?
    /// The last sleep ended with a wakeup from another thread (or was cut short by one).
    @exclusivity(unchecked) var recentCrossThreadWakeUp = false
    /// How long a loop that was just woken by another thread watches for the next wakeup before
    /// sleeping, unless ``RunLoop/wakeUpSpinWindow`` says otherwise: about the cost of one sleep
    /// and wakeup on this kind of machine.
    static let spinNs: Int64 = 5_000
    /// The longest ``RunLoop/wakeUpSpinWindow`` takes: past a millisecond, spinning costs more CPU
    /// than the sleep it saves is worth on any machine.
    static let maximumSpinNs: Int64 = 1_000_000
    /// How often a loop without its kernel descriptors (or a mode without its epoll set) tries
    /// again to open them while it sleeps.
    static let descriptorRetryNs: Int64 = 100_000_000
    /// The loop could not open its kernel descriptors (logged once per such stretch).
    @exclusivity(unchecked) var lackedDescriptors = false
    @exclusivity(unchecked) var spareScratch: [RunScratch] = []
    /// A nested run ended with blocks in `blocks`: the enclosing run looks at them before it
    /// sleeps (see `handedOverWorkPending`).
    var blocksTakenByNestedRun = false
    /// The pass's instrumentation: the phase published, the iteration reporters (Instrumentation/).
    @exclusivity(unchecked) var passes = PassPublishing()
    /// The batch whose timer handler is running (see `doTimers`); `modeIndex` -1 when none.
    @exclusivity(unchecked) var firingBatch = TimerBatch()
    /// Runs in progress (1 in the outermost run).
    @exclusivity(unchecked) var runDepth = 0
    /// A foreign wait in progress (RunLoop+ForeignWait.swift).
    @exclusivity(unchecked) var foreignWait = ForeignWaitState()
    /// Set for a loop made on virtual time (VirtualTime.swift): its waits never block.
    @exclusivity(unchecked) var virtualTimePolicy: (any VirtualTimePolicy)?
    /// The trace recorder's state, while one is attached (Tracing.swift).
    @exclusivity(unchecked) var trace = TraceState()
}

/// What a trace recorder attached to a loop needs between callouts (Tracing.swift). Part of
/// `LoopThreadState`: the loop's thread only.
struct TraceState {
    /// The recorder while one is attached. It changes only between passes of the outermost run,
    /// when no callout is in progress.
    var tracer: (any LoopRecorder)? {
        didSet {
            tracerBox = tracer.map(RecorderBox.init)
            tracerRef = tracerBox.map { Unmanaged.passUnretained($0) }
            tracerTag = tracer?.nameTag ?? 0
        }
    }
    /// ``tracer`` in a box the hooks reach unretained (`RunLoop.recorder(_:)`): a retain and
    /// release per event would cost a third of a recorded event. It changes only between passes
    /// of the outermost run, when no callout is in progress, and ``tracerBox`` keeps it alive.
    var tracerBox: RecorderBox?
    var tracerRef: Unmanaged<RecorderBox>?
    /// ``tracer``'s name tag, read once (items' cached names are checked against it per callout);
    /// 0 while none is attached (what the callout hooks test).
    var tracerTag: UInt32 = 0
    var traceVersion: UInt64 = 0
    /// Repeated callouts folded before they reach ``tracer`` (see Tracing.swift).
    var fold = TraceFold(limit: 0)
    /// Items' name indexes in ``tracer``, by identity (see `RunLoop.itemName`), and the labels'
    /// version they were taken at; at most ``itemNameLimit``.
    var itemNames: [ObjectIdentifier: UInt32] = [:]
    var itemNamesVersion: UInt64 = 0
    static let itemNameLimit = 65_536
    /// The last mode named in the trace, and its name's index.
    var tracedMode: (mode: RunLoop.Mode, name: UInt32)?
}

/// What the pass publishes for instrumentation: the pass count and phase (the seam's word), the
/// iteration reporters (RunLoop+PassInstrumentation.swift). Part of `LoopThreadState`.
struct PassPublishing {
    /// The pass count behind ``RunLoop/PhaseSnapshot/generation``, and the phase published now.
    var generation: UInt64 = 0
    var phase: RunLoop.Phase = .notRunning
    /// The iteration reporters, copied when ``LoopInstrumentation/reportersVersion`` changes.
    var reporters: [(id: UInt64, call: @Sendable (RunLoop.IterationReport) -> Void)] = []
    var reportersVersion: UInt64 = 0
    /// Iteration reporters are being called (see `reportPass`).
    var reporting = false
}

/// A foreign wait (RunLoop+ForeignWait.swift): another event loop sleeps on the loop's behalf.
/// Part of `LoopThreadState`.
struct ForeignWaitState {
    /// A foreign wait is in progress, and the epoll set it polls.
    var inProgress = false
    var set: EpollBackend.InterestSet?
}
