import Synchronization

// The wake protocol: every decision about whether a pass sleeps and what ends a sleep, in one
// type. The run algorithm (RunLoop+Run.swift) and the wakers (RunLoop+Waking.swift: wakeUp,
// stop, requestWakeUp; RunLoop+Items.swift: enqueue, for the block that finds the inbox empty)
// call these steps and nothing else touches the flags.
//
// Shared state (atomics; "loop" = written only by the loop's thread):
//
//   flag               writers      set by                               cleared by
//   sleeping           loop         announceSleep (a kernel or futex     skipsSleep (work found),
//                                   wait; a foreign wait, see            endSleep
//                                   RunLoop+ForeignWait.swift)
//   request.pending    any / loop   request (wakeUp, stop, the block     takeRequest (a wait or poll),
//                                   that finds the inbox empty, a        dropLibraryRequest (a pass
//                                   message, an item change)             begins, a run ends) unless
//                                                                        request.byUser is set
//   request.byUser     any / loop   wakeUp while accepting, in the same  takeRequest
//                                   read-modify-write as pending
//   ignoredUserRequest any / loop   wakeUp while not accepting           beginPass (into its result),
//                                                                        beginRun
//   accepting          loop         beginRun, beginPass                  stopAccepting (end of a wait;
//                                                                        before the main queue is
//                                                                        served), endRun (restored)
//   innermostRun       loop         beginRun (the run's id)              endRun (the enclosing run's)
//   stopRequest        any / loop   requestStop (innermostRun's value),  takeStop, endRun
//                                   stopRun (virtual time's driver)
//   source1Attention   any / loop   a version-1 source with work no      the version-1 phase
//                                   descriptor shows (a port's message)  (RunLoop+Run.swift)
//   sleepsOnFutex      loop         FutexWait (no kernel descriptors)    the descriptors opened
//
// Loop-confined state the decisions read (RunLoop+Run.swift): `LoopThreadState.blocksTakenByNestedRun`
// and `RunContext.tookAttention` (a nested run took work of the enclosing run's mode: endRun hands
// it back), `RunContext.ignoredWakeUp` (beginPass's result), `recentCrossThreadWakeUp` (the
// post-wakeup spin); they feed the `handedOver` check of skipsSleep.
//
// Transitions, the loop's side, in the order a run takes them:
//
//   beginRun      innermostRun = id; accepting = true; ignoredUserRequest = false
//   beginPass     accepting = true; dropLibraryRequest (compare-exchange pending -> 0: fails if the
//                 request is the user's); ignored = exchange(ignoredUserRequest, false)
//   a poll        takeRequest (the wait drains the wakeup whether it sleeps or not, as CF's does)
//   a sleep       `sleep(_:_:)`, the one function every real wait sleeps with (and the explorer
//                 drives):
//                 announceSleep: sleeping = true
//                 skipsSleep:    takeRequest || handedOver() -> sleeping = false, no sleep
//                 (plan)         the sleeper's: not at all (the deadline passed, a spin) ->
//                                sleeping = false
//                 (block)        until the eventfd, the timerfd or a descriptor; a wake by the
//                                eventfd with no request pending, no attention and nothing else is
//                                stale: block again
//                 endSleep:      sleeping = false; the sleeper takes the request if the eventfd
//                                woke it
//   after a wait  stopAccepting: accepting = false (CF's ignoreWakeUps, until the next pass)
//   end of pass   takeStop(id)
//   endRun        dropLibraryRequest; accepting = the enclosing run's; innermostRun = the
//                 enclosing run's id; stopRequest: this run's cleared
//
// The waker's side:
//
//   request       fence; pending? -> done; fetch-or(pending) was pending? -> done;
//                 sleeping? -> the caller writes the eventfd (or posts the futex)
//   wakeUp        accepting ? (fence; fetch-or(pending | byUser) was pending? -> done; sleeping?
//                 -> write) : (ignoredUserRequest = true; request)
//   requestStop   stopRequest = innermostRun (0: not running, dropped); then wakeUp
//
// Why no wakeup is lost. The loop stores `sleeping` then loads `request`; a waker stores
// `request` then loads `sleeping` (the store-buffer, or Dekker, pattern). With acquire/release
// only, both loads may read the old values (each store still in its core's store buffer): the loop
// sleeps and the waker does not write. Sequential consistency puts the four operations in one
// order, so one side sees the other. The fence orders the waker's own earlier stores (the block
// pushed, the source's attention flag) before its early return on a pending request. A stale
// eventfd write (a waker saw `sleeping` just as the loop took its request without sleeping) is
// recognised because every write follows a request: a wake with no request pending asked for
// nothing, and a request made after the check finds `sleeping` still set and writes again.
// A version-1 source's attention flag (`source1Attention`, read by `isStale`) is stored
// sequentially consistent for the same reason as `request`.
//
// A kept wakeUp() marks the request as the user's in the same read-modify-write that makes it
// pending, and a pass drops a library request with a compare-exchange that fails on that mark:
// with two separate flags, a pass could read "pending, not the user's", a wakeUp() could mark it
// and return (a request was pending already), and the pass would then drop the user's wakeup (the
// explorer found this in its scenario "a block, a wakeUp() and a nested run").
//
// Why some wakeups are dropped. As CoreFoundation: a wakeUp() while the loop does not accept them
// (not running; from the end of a wait to the next pass) is ignored; a request only the library
// made (a block, a message) is dropped when a pass begins, since the pass looks at every block and
// source anyway. A run nested in a callout may take (and drop) the request another thread made for
// the enclosing run's work; the enclosing run then finds that work with `handedOver` once it has
// announced its sleep, so a request made after that wakes it the usual way.
//
// Tests: WakeProtocolExplorerTests run these steps, with a waker thread's, in every interleaving up
// to a bound (a deterministic schedule explorer), and show that removing a line loses a wakeup.

/// The loop's wake state and every step that reads or writes it (see the table above).
///
/// A noncopyable value stored in ``RunLoop``: the hot paths reach its atomics without a reference.
struct WakeProtocol: ~Copyable, Sendable {
    // What a block's or a message's sender touches comes first, together; what only the loop
    // writes at every pass (`accepting`) and what only runs and stops change come after the
    // padding, on other cache lines: the loop's pass-by-pass stores then do not take the line a
    // sender is about to read from it.

    /// A wakeup asked for and not yet taken (``pending``), which makes the next wait return at
    /// once, and whether it includes one asked for with `wakeUp()` or `stop()` while heard
    /// (``byUser``), which a new pass keeps. One word, so that marking and dropping cannot cross.
    let requestWord = Atomic<UInt8>(0)
    static let pending: UInt8 = 1
    static let byUser: UInt8 = 2
    /// Set while the loop sleeps (or is about to); wakers write the eventfd only then.
    let sleeping = Atomic<Bool>(false)
    /// A version-1 source has something to deliver that its epoll events do not show (a message
    /// port's messages, a descriptor found closed): the next pass scans the mode's version-1
    /// sources, and a wake by the eventfd is not stale. Stored sequentially consistent, as
    /// `request`: it is the waker's side of the same Dekker pattern.
    let source1Attention = Atomic<Bool>(false)
    /// The loop sleeps on its futex, not in epoll (it could not open its descriptors): wakers post
    /// the futex.
    let sleepsOnFutex = Atomic<Bool>(false)
    private let padding = CacheLinePadding()
    /// Whether a `wakeUp()` now is kept until a wait takes it: CoreFoundation's `ignoreWakeUps`,
    /// inverted. Written by the loop's thread only.
    let accepting = Atomic<Bool>(false)
    /// A `wakeUp()` came while the loop did not accept them; relaxed, ordered by `request`.
    let ignoredUserRequest = Atomic<Bool>(false)
    /// The id of the innermost run in progress, 0 when not running.
    let innermostRun = Atomic<UInt64>(0)
    /// The id of the run `stop()` asked to end.
    let stopRequest = Atomic<UInt64>(0)

    #if DEBUG
    /// The interleaving explorer's scheduler (tests only): called before each shared step.
    let explorer: (any WakeStepScheduler)?
    /// A line of the protocol the explorer's tests leave out, to show that they find the bug.
    let omitted: Line?

    init(explorer: (any WakeStepScheduler)? = nil, omitting omitted: Line? = nil) {
        self.explorer = explorer
        self.omitted = omitted
    }
    #else
    init() {}
    #endif

    /// Lines whose removal loses a wakeup (what the explorer's tests remove, one at a time).
    enum Line: Sendable, CaseIterable {
        /// `skipsSleep`'s look at `request` after the sleep was announced.
        case takeRequestAfterAnnouncing
        /// `isStale`'s look at `request`.
        case staleOnlyWithoutRequest
        /// `dropLibraryRequest`'s look at `byUser` (it then drops any pending request).
        case keepUserRequest
        /// `skipsSleep`'s look for work handed over by a nested run.
        case lookForHandedOverWork
    }

    /// Yields to the interleaving explorer before a step other threads can see (debug builds only).
    func step(_ name: StaticString) {
        #if DEBUG
        explorer?.willTake(name)
        #endif
    }

    func keeps(_ line: Line) -> Bool {
        #if DEBUG
        return omitted != line
        #else
        return true
        #endif
    }

    // MARK: The waker's side

    /// Asks for a wakeup; returns whether the caller must wake the sleeping loop (write its
    /// eventfd or post its futex). Coalesced: while a request is pending, nothing more is done.
    func request() -> Bool {
        // A plain load first: while a request is pending (the common case under load) the flag's
        // cache line stays shared; returning on `true` is safe because the fence ordered this
        // waker's work before the load.
        atomicMemoryFence(ordering: .sequentiallyConsistent)
        step("waker: load request")
        if requestWord.load(ordering: .sequentiallyConsistent) & Self.pending != 0 { return false }
        return makePending(Self.pending)
    }

    /// Sets `bits` (pending, and the user's mark) in one read-modify-write; returns whether the
    /// caller must wake the sleeping loop.
    private func makePending(_ bits: UInt8) -> Bool {
        step("waker: fetch-or request")
        if requestWord.bitwiseOr(bits, ordering: .sequentiallyConsistent).oldValue & Self.pending != 0 { return false }
        step("waker: load sleeping")
        return sleeping.load(ordering: .sequentiallyConsistent)
    }

    /// `wakeUp()`: sorts the request into kept (accepted) and ignored, then asks for it. The
    /// request itself is always made, so a stale read of `accepting` can cost an extra pass,
    /// never a lost wakeup. Returns `request()`'s answer, and whether the request was kept.
    func requestByUser() -> (mustSignal: Bool, kept: Bool) {
        step("waker: load accepting")
        guard accepting.load(ordering: .relaxed) else {
            step("waker: ignoredUserRequest = true")
            ignoredUserRequest.store(true, ordering: .relaxed)
            return (request(), false)
        }
        atomicMemoryFence(ordering: .sequentiallyConsistent)
        return (makePending(Self.pending | Self.byUser), true)
    }

    /// `stop()`: marks the innermost run in progress to end. Returns false when the loop is not
    /// running (the stop is dropped, as CoreFoundation drops it); the caller then wakes the loop.
    func requestStop() -> Bool {
        step("waker: load innermostRun")
        let run = innermostRun.load(ordering: .acquiring)
        guard run != 0 else { return false }
        step("waker: stopRequest = run")
        stopRequest.store(run, ordering: .releasing)
        return true
    }

    // MARK: The loop's side

    /// What a nested run restores when it ends.
    struct RunEntry {
        let outerRun: UInt64
        let outerAccepting: Bool
    }

    /// A run starts: it is the one `stop()` ends, and it hears `wakeUp()` from its start
    /// (CoreFoundation's per-run data starts so).
    func beginRun(_ id: UInt64) -> RunEntry {
        step("loop: innermostRun = id")
        let outer = innermostRun.exchange(id, ordering: .acquiringAndReleasing)
        let outerAccepting = accepting.load(ordering: .relaxed)
        step("loop: accepting = true (run)")
        accepting.store(true, ordering: .relaxed)
        ignoredUserRequest.store(false, ordering: .relaxed)
        return RunEntry(outerRun: outer, outerAccepting: outerAccepting)
    }

    /// A pass starts: `wakeUp()` is heard again, and a user request kept earlier in the run (e.g.
    /// from an `entry` observer) still ends the next sleep; a request only the library made is
    /// dropped. Returns whether a `wakeUp()` was ignored since the last pass began.
    func beginPass() -> Bool {
        step("loop: accepting = true (pass)")
        accepting.store(true, ordering: .relaxed)
        dropLibraryRequest()
        // After the drop: its exchange synchronizes with the ignored waker's request, which
        // follows its store of the flag.
        step("loop: take ignoredUserRequest")
        return ignoredUserRequest.load(ordering: .relaxed)
            && ignoredUserRequest.exchange(false, ordering: .relaxed)
    }

    /// Drops a pending request unless `wakeUp()` or `stop()` asked for it while it was heard.
    func dropLibraryRequest() {
        step("loop: load request (drop)")
        let word = requestWord.load(ordering: .acquiring)
        guard word & Self.pending != 0 else { return }
        step("loop: compare-exchange request (drop)")
        if keeps(.keepUserRequest) {
            // Fails if a wakeUp() marked the request meanwhile: it stays pending.
            _ = requestWord.compareExchange(expected: Self.pending, desired: 0, ordering: .sequentiallyConsistent)
        } else {
            _ = requestWord.exchange(0, ordering: .sequentiallyConsistent)
        }
    }

    /// From the end of a wait to the next pass, `wakeUp()` is ignored, as in CoreFoundation (this
    /// pass handles what the wait found; the next looks at everything anyway).
    func stopAccepting() {
        step("loop: accepting = false")
        accepting.store(false, ordering: .relaxed)
    }

    /// Takes a pending request: the wait it ends has used it. The exchange (not a store)
    /// synchronizes with the waker, so what it queued before asking is seen by the phases after.
    func takeRequest() -> Bool {
        // A plain load first: a poll with nothing pending (the common case) writes nothing.
        step("loop: load request")
        guard requestWord.load(ordering: .sequentiallyConsistent) & Self.pending != 0 else { return false }
        step("loop: exchange request")
        return requestWord.exchange(0, ordering: .sequentiallyConsistent) & Self.pending != 0
    }

    /// Right after ``announceSleep()`` for a foreign wait (RunLoop+ForeignWait.swift): whether a
    /// request is pending, left pending (the pass the foreign loop runs takes it). The
    /// sequentially consistent load is the loop's side of the Dekker pattern, as in
    /// ``skipsSleep(handedOver:)``.
    func requestPendingAfterAnnouncing() -> Bool {
        step("loop: load request (foreign wait)")
        return requestWord.load(ordering: .sequentiallyConsistent) & Self.pending != 0
    }

    /// Whether a request is pending (a relaxed look, for spinning and for `hasPendingInput`).
    var hasRequest: Bool { requestWord.load(ordering: .relaxed) & Self.pending != 0 }

    /// The loop is about to sleep: from here on, a waker that makes a request writes the eventfd.
    func announceSleep() {
        step("loop: sleeping = true")
        sleeping.store(true, ordering: .sequentiallyConsistent)
    }

    /// Right after ``announceSleep()``: whether the loop must not sleep after all, because a
    /// request is pending (taken) or `handedOver()` finds work that no request announces any more.
    /// The announcement is withdrawn then.
    func skipsSleep(handedOver: () -> Bool) -> Bool {
        let taken = keeps(.takeRequestAfterAnnouncing) && takeRequest()
        guard taken || (keeps(.lookForHandedOverWork) && handedOver()) else { return false }
        endSleep()
        return true
    }

    /// The sleep is over (or withdrawn): wakers no longer write the eventfd.
    func endSleep() {
        step("loop: sleeping = false")
        sleeping.store(false, ordering: .sequentiallyConsistent)
    }

    /// Whether a kernel wait ended only by an eventfd write whose request the loop has already
    /// taken (a waker saw `sleeping` just as the loop took its request without sleeping): with no
    /// request pending, no version-1 source asking for attention and nothing else found, the loop
    /// sleeps on.
    func isStale(_ end: SleepEnd) -> Bool {
        guard end.wokenByEventfd && !end.foundOtherWork else { return false }
        step("loop: load request (stale?)")
        if keeps(.staleOnlyWithoutRequest) && requestWord.load(ordering: .sequentiallyConsistent) & Self.pending != 0 {
            return false
        }
        // Not a step of the explorer's: its model has no version-1 sources (the flag stays clear).
        return !source1Attention.load(ordering: .sequentiallyConsistent)
    }

    /// A sleep, whole: announced, skipped if work is pending or was handed over, planned (the
    /// sleeper may decide not to block), blocked until a wake that is not stale, ended. Every wait
    /// that sleeps for real calls this (`KernelWait`, `FutexWait`), and so does the interleaving
    /// explorer's model, with a sleeper that blocks on a modeled eventfd: the explorer checks this
    /// code, not a copy of it.
    ///
    /// Returns how the sleep ended; the sleeper then takes what the wake found (descriptor
    /// events, the request).
    func sleep<Sleeper: WakeSleeper>(_ sleeper: inout Sleeper, _ context: inout Sleeper.Context) -> SleepOutcome {
        announceSleep()
        if skipsSleep(handedOver: { sleeper.handedOverWork(context) }) { return .skipped }
        guard sleeper.plansToBlock(&context) else {
            endSleep()
            return .didNotBlock
        }
        var end = sleeper.block(&context)
        while isStale(end) { end = sleeper.block(&context) }
        endSleep()
        return .woke(end)
    }

    /// Takes a stop of run `id`, at the end of its pass.
    func takeStop(_ id: UInt64) -> Bool {
        step("loop: take stopRequest")
        return stopRequest.load(ordering: .relaxed) == id
            && stopRequest.compareExchange(expected: id, desired: 0, ordering: .acquiring).exchanged
    }

    /// Whether a stop of run `id` is pending (a `handedOver` check: a nested run may have taken
    /// the stop's request).
    func stopPending(_ id: UInt64) -> Bool {
        step("loop: load stopRequest")
        return stopRequest.load(ordering: .sequentiallyConsistent) == id
    }

    /// Ends run `id` from the loop's own thread (virtual time's driver: every run ends, out to it).
    func stopRun(_ id: UInt64) {
        stopRequest.store(id, ordering: .relaxed)
    }

    /// Whether any stop is pending (for descriptions).
    var hasStopRequest: Bool { stopRequest.load(ordering: .relaxed) != 0 }

    /// A run ends: requests `wakeUp()` made while it ignored them must not end the enclosing
    /// run's sleep (CoreFoundation never sends them); what other requests were for, the enclosing
    /// wait looks at itself (`handedOver`). The enclosing run is the innermost again.
    func endRun(_ id: UInt64, _ entry: RunEntry) {
        dropLibraryRequest()
        step("loop: accepting = outer's")
        accepting.store(entry.outerAccepting, ordering: .relaxed)
        step("loop: innermostRun = outer")
        innermostRun.store(entry.outerRun, ordering: .releasing)
        _ = stopRequest.compareExchange(expected: id, desired: 0, ordering: .relaxed)
    }
}

/// What ended a sleep's block.
struct SleepEnd {
    /// The eventfd was written (or the futex posted).
    var wokenByEventfd: Bool
    /// Anything else: a timer expired, a descriptor is ready, the sleep's time is up.
    var foundOtherWork: Bool
}

/// How ``WakeProtocol/sleep(_:_:)`` ended.
enum SleepOutcome {
    /// Work was pending once the sleep was announced: no sleep.
    case skipped
    /// The sleeper planned not to block (the deadline passed, a spin before a timer).
    case didNotBlock
    /// The sleeper blocked, and this woke it (not a stale wake).
    case woke(SleepEnd)
}

/// The side of a sleep that is not the wake protocol's: what work was handed over, whether to
/// block, and the block itself. The loop's are the wait strategies (WaitStrategies.swift); the
/// interleaving explorer's blocks on a modeled eventfd.
protocol WakeSleeper {
    associatedtype Context
    /// Work another thread handed over with a request a nested run dropped (see `skipsSleep`).
    func handedOverWork(_ context: Context) -> Bool
    /// Whether to block; false where the sleep's deadline has passed or the sleeper spins instead
    /// (it then acts once the sleep has ended).
    mutating func plansToBlock(_ context: inout Context) -> Bool
    /// Blocks until the eventfd is written, the timer expires or a descriptor is ready.
    mutating func block(_ context: inout Context) -> SleepEnd
}

#if DEBUG
/// The interleaving explorer's hook (tests only): the protocol calls `willTake` before each step
/// another thread can see, and the explorer decides which thread takes the next step.
protocol WakeStepScheduler: Sendable {
    func willTake(_ step: StaticString)
}
#endif
