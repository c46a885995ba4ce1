import CRunLoopKit
import Glibc
import Logging
import Synchronization
import SystemPackage

// Threading, in one place (the DocC article "Threading" says the same for users).
//
// Threads. A loop runs only on its own thread: the run entry points and limitDate start with
// preconditionOnOwnThread. Everything else (adding and removing items, perform, stop, wakeUp,
// the instrumentation readers) is safe from any thread.
//
// Locks, outermost first; a lock is never taken while one below it in this list is held:
//   1. The loop's `state` (Mutex<LoopState>): the mode table (each mode's version-0 sources,
//      observers, timer heap, version-1 sources, descriptor registrations and interest set), the
//      common modes and common items, the descriptor owners by number, the running modes, the
//      armed timerfd deadline, `tornDown`. The kernel backend's registration calls and the timerfd
//      arming are made under it (it orders them).
//   2. An item's own lock: a timer's `state`, a version-1 source's `registration`, a version-0
//      source's or an observer's `registrations`. Item methods that need the loop read the loop
//      under the item's lock, let it go, and call the loop, which takes 1 then 2.
//   3. Leaf locks, under which nothing else is taken: a port's `queue`, the block inbox's spin
//      lock, the instrumentation's reporters, the attachments, the backend's `closed` flag.
//   State only the loop's thread touches is in `confined` (LoopThreadState), with no lock.
//
// No lock is held while user code runs: each phase takes its items out under the lock (or from
// the run's copy of the mode's lists, re-read when `itemsVersion` moves) and calls them after.
// What may run deinits is released after the lock (`withState` releases dropped timer entries;
// `mutatingItems` sends wakeups decided under the lock once it is let go). User code is called
// from doObservers, doBlocks, doSources0, doTimers, doSources1 and reportPass (RunLoop+Run.swift),
// from add/remove/invalidate of a version-0 source (onSchedule/onCancel, on the calling thread),
// and from the thread-exit teardown (onCancel, deinits).
//
// The wake protocol (whether a pass sleeps, what ends a sleep, and why no wakeup is lost) is
// written once, with its table of flags and transitions, at the top of Loop/WakeProtocol.swift.

/// A thread's event loop, with CoreFoundation's semantics (CFRunLoop / NSRunLoop), for Linux.
///
/// Every thread has at most one loop, created the first time the thread asks for
/// ``current``; ``main`` is the main thread's and can be reached from any thread. A loop runs only
/// on its own thread, in one mode at a time, and sleeps in the kernel (`epoll_wait`) until one of
/// the mode's timers is due, a source fires, a block is performed, or another thread calls
/// ``wakeUp()``. Items (sources, timers, observers) and blocks can be added from any thread.
///
/// ```swift
/// let loop = RunLoop.current
/// let timer = RunLoopTimer(after: .milliseconds(10), repeating: .milliseconds(10)) { _ in print("tick") }
/// loop.add(timer, forMode: .common)
/// loop.run(mode: .default, for: .seconds(1))
/// ```
///
/// When the thread exits, its loop is torn down: its items are removed (sources get their cancel
/// callbacks) and its kernel descriptors are closed.
public final class RunLoop: Sendable, Hashable, CustomStringConvertible {
    /// Items, modes and blocks: everything other threads may change.
    let state = Mutex(LoopState())
    /// The kernel side, set once the loop's descriptors could be opened (normally at creation;
    /// a loop made while the process was out of descriptors retries at each run and each wait,
    /// and until then sleeps on ``futex``).
    let backendSlot = AtomicLazyReference<EpollBackend>()
    /// The backend opened when the loop was made (the usual case): a `let`, which the hot paths
    /// read without reference counting.
    private let initialBackend: EpollBackend?
    /// The kernel side; nil while the loop's descriptors cannot be opened.
    @inline(__always)
    var backend: EpollBackend? { initialBackend ?? backendSlot.load() }
    /// Whether the loop has its kernel descriptors, without taking a reference (every pass asks).
    @inline(__always)
    var hasKernelDescriptors: Bool { initialBackend != nil || backendSlot.load() != nil }
    /// Where a loop without kernel descriptors sleeps.
    let futex = FutexWord()
    /// The loop sleeps on ``futex``, not in epoll: wakers post the futex.
    let sleepsOnFutex = Atomic<Bool>(false)
    /// `crlk_fork_generation()` when the loop was made: a loop made before a fork(2) shares its
    /// descriptors with the parent and must not be used in the child.
    let forkGeneration: UInt64
    /// State only the loop's own thread touches.
    let confined = LoopThreadState()

    /// The owning thread's kernel id and name, for messages.
    let ownerTID: Int32
    let ownerName: String
    let isMainLoop: Bool

    /// Whether the loop sleeps and what ends its sleep: wakeup requests, the ignore window, stops
    /// (Loop/WakeProtocol.swift).
    let wake = WakeProtocol()
    /// Bumped (under the lock) whenever a mode's sources, observers or timers change, so a run can
    /// keep its mode's item lists between passes and re-read them only after a change.
    let itemsVersion = Atomic<UInt64>(0)
    /// Blocks on their way from ``perform(inModes:_:)->()`` to the loop's thread.
    let inbox = BlockQueue()
    /// Set when the thread exits: blocks performed after that are dropped.
    let blocksClosed = Atomic<Bool>(false)
    /// A version-1 source has something to deliver that its epoll events do not show (a message
    /// port's messages, a descriptor found closed): the next pass scans the mode's version-1
    /// sources.
    let source1Attention = Atomic<Bool>(false)
    /// ``timerSpinWindow`` in nanoseconds.
    let timerSpinNs = Atomic<Int64>(0)
    /// The instrumentation seam: phase, generation, reporters (Instrumentation.swift).
    let instrumentation = LoopInstrumentation()
    /// Per-loop objects of the layers above the core (see ``LoopAttachments``).
    let attachments = LoopAttachments()

    init(ownerTID: Int32, ownerName: String, isMainLoop: Bool) {
        self.ownerTID = ownerTID
        self.ownerName = ownerName
        self.isMainLoop = isMainLoop
        crlk_watch_forks()
        self.forkGeneration = crlk_fork_generation()
        do {
            initialBackend = try EpollBackend(ownerTID: ownerTID)
        } catch {
            initialBackend = nil
            reportMissingDescriptors(error)
        }
    }

    /// Logs, once per stretch without them, that the loop could not open its kernel descriptors.
    private func reportMissingDescriptors(_ error: any Error) {
        guard !confined.lackedDescriptors else { return }
        confined.lackedDescriptors = true
        Diagnostics.error(
            "cannot open the kernel descriptors of \(shortDescription): \(error); until it can (retried at each run and at least every \(LoopThreadState.descriptorRetryNanoseconds / 1_000_000) ms while it sleeps), it sleeps on a futex: timers, blocks, sources and ports keep working, descriptor sources are not watched"
        )
    }

    /// Opens the loop's epoll set, eventfd and timerfd if it has none yet; returns whether it has
    /// them. Out of descriptors, the loop keeps working without them (it sleeps on a futex; timers,
    /// blocks, version-0 sources and ports work, descriptor sources wait) and retries here at each
    /// run and each wait. Loop thread.
    @discardableResult
    func openKernelDescriptors() -> Bool {
        if hasKernelDescriptors { return true }
        do {
            _ = backendSlot.storeIfNil(try EpollBackend(ownerTID: ownerTID))
            sleepsOnFutex.store(false, ordering: .sequentiallyConsistent)
            // The timerfd starts disarmed; the next wait arms it for what is due. Through
            // mutatingItems: a run in progress must re-read its items, which name the epoll set.
            mutatingItems { state in state.armedDeadline = LoopClock.never }
            if confined.lackedDescriptors {
                confined.lackedDescriptors = false
                Diagnostics.warning("\(shortDescription) opened its kernel descriptors; it sleeps in epoll again")
            }
            return true
        } catch {
            reportMissingDescriptors(error)
            return false
        }
    }

    // MARK: Loops and threads

    /// The calling thread's loop, made on first use; on the main thread, `mainLoop()` (the public
    /// door, ``current``, lives with the main-queue integration, which sets the main loop up).
    ///
    /// In a process made by `fork()`, the thread's loop is a new one: a loop made before the fork
    /// shares its kernel descriptors with the parent.
    static func loopOfCurrentThread(mainLoop: () -> RunLoop) -> RunLoop {
        if let raw = pthread_getspecific(ThreadLoops.key) {
            let loop = Unmanaged<RunLoop>.fromOpaque(raw).takeUnretainedValue()
            if !loop.isFromBeforeFork { return loop }
            // The parent's loop, inherited through fork(): left alone (its locks may be held by
            // threads the child does not have) and replaced.
        }
        let loop =
            crlk_is_main_thread()
            ? mainLoop() : RunLoop(ownerTID: crlk_gettid(), ownerName: ThreadLoops.currentName(), isMainLoop: false)
        pthread_setspecific(ThreadLoops.key, Unmanaged.passRetained(loop).toOpaque())
        return loop
    }

    /// How many runs of the loop are in progress (nested runs count each). Any thread.
    package var runDepth: Int { state.locked { $0.runningModes.count } }

    /// Whether the loop was made before this process was forked (so it belongs to the parent).
    @inline(__always)
    var isFromBeforeFork: Bool { forkGeneration != crlk_fork_generation() }

    /// Stops the process with a clear message if the loop was made before a fork (see
    /// ``current``): its descriptors are the parent's, and using them would steal the parent's
    /// wakeups and timers.
    @inline(__always)
    func preconditionNotForked(_ function: StaticString) {
        guard _slowPath(isFromBeforeFork) else { return }
        fatalError(
            "RunLoop.\(function) on \(shortDescription), which was made before this process was forked: its epoll, eventfd and timerfd are shared with the parent process. In a child of fork(), use RunLoop.current or RunLoop.main (new loops), or exec."
        )
    }

    /// Whether the calling thread is the loop's own thread.
    public var isCurrent: Bool {
        if let raw = pthread_getspecific(ThreadLoops.key) {
            return raw == Unmanaged.passUnretained(self).toOpaque()
        }
        return isMainLoop && crlk_is_main_thread()
    }

    /// Stops the process with a message naming the loop and both threads unless the caller is on
    /// the loop's own thread.
    @inline(__always)
    func preconditionOnOwnThread(_ function: StaticString) {
        preconditionNotForked(function)
        guard !isCurrent else { return }
        wrongThread(function)
    }

    /// Stops the process with a message naming the loop and both threads, and, when the caller
    /// runs in a Swift concurrency task, why it is not on the thread it may expect.
    private func wrongThread(_ function: StaticString) -> Never {
        var message =
            "RunLoop.\(function) called on thread '\(ThreadLoops.currentName())' (tid \(crlk_gettid())), but \(shortDescription) belongs to thread '\(ownerName)' (tid \(ownerTID)); a loop runs only on its own thread"
        if withUnsafeCurrentTask(body: { $0 != nil }) {
            message +=
                ". The caller runs in a Swift concurrency task, on one of the concurrency runtime's pool threads: after an `await` (in an async `main` too) a task resumes on whatever thread its executor picks, not on the thread it started on"
            if isMainLoop {
                message +=
                    ". Run RunLoop.main from a synchronous `main` (before any `await`), and reach it from async code with `await loop.submit { ... }` or an actor pinned to the loop"
            } else {
                message += ". Run a loop from the thread that owns it (a PermanentThread, or a Thread you start), and reach it from async code with `await loop.submit { ... }`"
            }
        }
        // fatalError, not preconditionFailure: the message must name the threads in -O builds too.
        fatalError(message)
    }

    /// Called by the thread-exit hook: removes every item and closes the kernel descriptors.
    func tearDown() {
        let (sources, timers, observers, sources1) = mutatingItems { state in
            state.tornDown = true
            // Every item, those only in the common lists (added for .common, then removed from
            // every mode) included: each holds a reference to this loop that must be cleared. They
            // are let go after the lock, with these lists (a last reference dropped runs deinits).
            var sources: [(RunLoopSource, RunLoop.Mode?)] = []
            var timers: [RunLoopTimer] = state.commonTimers
            var observers: [RunLoopObserver] = state.commonObservers
            for mode in state.modes {
                for source in mode.sources { sources.append((source, mode.name)) }
                for entry in mode.timers.entries where entry.isLive { timers.append(entry.timer) }
                observers.append(contentsOf: mode.observers)
            }
            for source in state.commonSources { sources.append((source, nil)) }
            for index in state.modes.indices {
                state.modes[index].sources.removeAll()
                state.modes[index].observers.removeAll()
                state.modes[index].observerMask = 0
                state.modes[index].timers.removeAll(graveyard: &state.graveyard)
                state.modes[index].timerCount = 0
            }
            state.commonSources.removeAll()
            state.commonObservers.removeAll()
            state.commonTimers.removeAll()
            var sources1: [any Source1Item] = []
            for index in state.modes.indices {
                for item in state.modes[index].sources1 where !sources1.contains(where: { $0 === item }) {
                    sources1.append(item)
                }
                state.modes[index].sources1.removeAll()
                state.modes[index].descriptors.removeAll()
                state.modes[index].descriptorNumbers.removeAll()
                if let set = state.modes[index].interestSet {
                    backend?.closeSet(set)
                    state.modes[index].interestSet = nil
                }
            }
            for item in state.commonSources1 where !sources1.contains(where: { $0 === item }) { sources1.append(item) }
            state.commonSources1.removeAll()
            state.descriptorOwners.removeAll()
            // Untied under each item's lock (see LoopRef); they stay valid and can join another loop.
            for item in sources1 {
                item.withRegistration { registration in
                    guard registration.loop === self else { return }
                    registration.loop = nil
                    registration.modes.removeAll()
                    registration.inCommonModes = false
                }
            }
            return (sources, timers, observers, sources1)
        }
        for timer in timers {
            timer.state.locked { timer in
                if timer.loop === self || timer.loop == nil {
                    timer.loop = nil
                    timer.modes.removeAll()
                    timer.inCommonModes = false
                }
            }
        }
        for observer in observers { observer.registrations.locked { $0.removeAll { $0.loop === self } } }
        for (source, mode) in sources {
            source.registrations.locked { $0.removeAll { $0.loop === self } }
            if let mode { source.cancelCallout?(self, mode) }
        }
        // A descriptor source or port whose thread is gone can never deliver again: invalidated,
        // so owned descriptors are closed and later sends throw instead of piling up.
        for item in sources1 { item.invalidateItem() }
        // Blocks still queued can never run now; the thread exit drops them (this runs on the
        // loop's own thread, the queue's consumer).
        blocksClosed.store(true, ordering: .releasing)
        inbox.removeAll()
        confined.blocks.removeAll()
        backend?.close()
    }

    // MARK: Modes

    /// The mode of the innermost run in progress; nil when the loop is not running.
    public var currentMode: Mode? {
        state.locked { state -> Mode? in
            guard let index = state.runningModes.last else { return nil }
            return state.modes[index].name
        }
    }

    /// Every mode the loop has made (modes are made on first use and never removed).
    public var allModes: Set<Mode> { state.locked { Set($0.modes.map(\.name)) } }

    /// The modes ``Mode/common`` stands for; starts as `[.default]`.
    public var commonModes: Set<Mode> { state.locked { Set($0.commonModes) } }

    /// Makes `mode` common: every item added for ``Mode/common``, now and later, is in it too.
    /// Adding ``Mode/common`` itself, or a mode already common, does nothing.
    public func addCommonMode(_ mode: Mode) {
        let joined = mutatingItems { state in
            let joined = state.makeCommon(mode, loop: self)
            rearmForEarlierTimers(&state)
            return joined
        }
        for source in joined { source.scheduleCallout?(self, mode) }
    }

    // MARK: Sources

    /// Adds a version-0 source to `mode` (``Mode/common``: every common mode). Adding an
    /// invalidated source, or one already there, does nothing.
    ///
    /// - Complexity: O(n) in the sources of the mode.
    public func add(_ source: RunLoopSource, forMode mode: Mode) {
        if !addIfAlive(source, forMode: mode) { warnAddedAfterExit(source) }
    }

    /// ``add(_:forMode:)-(RunLoopSource,_)`` for the library's own sources: false, without a
    /// warning, when the loop's thread has exited (nothing added).
    @discardableResult
    func addIfAlive(_ source: RunLoopSource, forMode mode: Mode) -> Bool {
        guard source.isValid else { return true }
        var dead = false
        let joined: [Mode] = mutatingItems { state in
            guard !state.tornDown else {
                dead = true
                return []
            }
            // Registered first, under the source's lock, which invalidate() takes after clearing
            // `valid`: either it sees this registration (and removes the source, after this
            // lock is released), or this sees `valid == false` and adds nothing.
            let (accepted, fresh) = source.registrations.locked { places -> (Bool, Bool) in
                guard source.isValid else { return (false, false) }
                let fresh = !places.contains { $0.loop === self }
                if !places.contains(where: { $0.loop === self && $0.mode == mode }) {
                    places.append(ItemRegistration(loop: LoopRef(self), mode: mode))
                }
                return (true, fresh)
            }
            return accepted ? state.add(source, for: mode, fresh: fresh) : []
        }
        for joinedMode in joined { source.scheduleCallout?(self, joinedMode) }
        return !dead
    }

    /// Removes a source from `mode` (``Mode/common``: from every common mode and from the common
    /// items); its cancel callback runs once per mode it leaves.
    public func remove(_ source: RunLoopSource, forMode mode: Mode) {
        let left = mutatingItems { state in
            let left = state.remove(source, for: mode)
            // Under the loop's lock, so a concurrent add of the same source and mode is ordered
            // entirely before or after this removal.
            if mode == .common || left.contains(mode) {
                source.registrations.locked { places in places.removeAll { $0.loop === self && $0.mode == mode } }
            }
            return left
        }
        for leftMode in left { source.cancelCallout?(self, leftMode) }
    }

    /// Whether `source` is in `mode` (for ``Mode/common``: whether it was added for the common
    /// modes).
    public func contains(_ source: RunLoopSource, inMode mode: Mode) -> Bool {
        state.locked { $0.contains(source, in: mode) }
    }

    // MARK: Observers

    /// Adds an observer to `mode`. An observer belongs to one loop: adding it to a second loop
    /// (or adding an invalidated one) does nothing.
    public func add(_ observer: RunLoopObserver, forMode mode: Mode) {
        guard observer.isValid else { return }
        let alive = mutatingItems { state -> Bool in
            guard !state.tornDown else { return false }
            let (accepted, fresh) = observer.registrations.locked { places -> (Bool, Bool) in
                guard observer.isValid else { return (false, false) }
                if places.contains(where: { $0.loop !== self }) { return (false, false) }
                let fresh = places.isEmpty
                if !places.contains(where: { $0.mode == mode }) {
                    places.append(ItemRegistration(loop: LoopRef(self), mode: mode))
                }
                return (true, fresh)
            }
            if accepted { state.add(observer, for: mode, fresh: fresh) }
            return true
        }
        // Logged with no lock held: a log handler is user code.
        if !alive {
            warnAddedAfterExit(observer)
        } else if observer.isValid, !observer.registrations.locked({ $0.contains { $0.loop === self } }) {
            Diagnostics.warning("\(observer) already belongs to another run loop; not added to \(shortDescription)")
        }
    }

    /// Removes an observer from `mode`.
    public func remove(_ observer: RunLoopObserver, forMode mode: Mode) {
        mutatingItems { state in
            state.remove(observer, for: mode)
            observer.registrations.locked { places in places.removeAll { $0.loop === self && $0.mode == mode } }
        }
    }

    /// Whether `observer` is in `mode`.
    public func contains(_ observer: RunLoopObserver, inMode mode: Mode) -> Bool {
        state.locked { $0.contains(observer, in: mode) }
    }

    // MARK: Timers

    /// Schedules a timer in `mode`. A timer belongs to one loop: adding it to a second loop (or
    /// adding an invalidated one) does nothing.
    ///
    /// - Complexity: O(log n) in the timers of the mode.
    public func add(_ timer: RunLoopTimer, forMode mode: Mode) {
        var foreign = false
        var dead = false
        mutatingItems { state in
            guard !state.tornDown else {
                dead = true
                return
            }
            // The deadline to re-arm the timerfd for, if the timer joined the running mode ahead
            // of the armed deadline (see rearmForEarlierTimers; one new entry needs no walk: the
            // new deadline is its latest fire time).
            let rearm = timer.state.locked { timerState -> Int64? in
                guard timerState.valid else { return nil }
                if let owner = timerState.loop, owner !== self {
                    foreign = true
                    return nil
                }
                if timerState.loop == nil {
                    timerState.loop = LoopRef(self)
                    timerState.modes.removeAll()
                    if timerState.sequence == 0 {
                        timerState.sequence = state.nextTimerSequence
                        state.nextTimerSequence += 1
                    }
                }
                var earliest: Int64? = nil
                if mode == .common {
                    if !timerState.inCommonModes {
                        timerState.inCommonModes = true
                        state.commonTimers.append(timer)
                    }
                    for index in state.indexes(for: .common) {
                        if let latest = state.schedule(timer, &timerState, into: index) {
                            earliest = min(earliest ?? latest, latest)
                        }
                    }
                } else {
                    earliest = state.schedule(timer, &timerState, into: state.index(of: mode))
                }
                if timerState.modes.isEmpty && !timerState.inCommonModes { timerState.loop = nil }
                guard earliest != nil, let running = state.runningModes.last, timerState.modes.contains(running),
                    timerState.fireNs < state.armedDeadline
                else { return nil }
                let latest = timerState.fireNs.addingSaturated(timerState.toleranceNs)
                return latest < state.armedDeadline ? latest : nil
            }
            if let rearm { arm(&state, rearm) }
        }
        if foreign {
            Diagnostics.warning("\(timer) already belongs to another run loop; not added to \(shortDescription)")
        }
        if dead { warnAddedAfterExit(timer) }
    }

    /// Makes `source` the loop's dispatch port: in a mode it is in, a pass checks it without
    /// waiting before it announces a sleep, and serves it at once if it is ready (the main queue's
    /// port in CoreFoundation's run algorithm).
    func setDispatchPort(_ source: FileDescriptorSource) {
        mutatingItems { state in state.dispatchPort = source }
    }

    /// Whether the loop's thread has exited and the loop let go of its items (items added from now
    /// on are refused).
    var isTornDown: Bool { state.locked { $0.tornDown } }

    /// Says that `item` was not added because the loop's thread has exited (it could never run).
    func warnAddedAfterExit(_ item: Any) {
        Diagnostics.warning("\(item) not added to \(shortDescription): the loop's thread has exited")
    }

    /// Removes a timer from `mode` (it stays valid and can be added again).
    public func remove(_ timer: RunLoopTimer, forMode mode: Mode) {
        mutatingItems { state in
            timer.state.locked { timerState in
                guard timerState.loop === self else { return }
                var indexes: [Int] = []
                if mode == .common {
                    guard timerState.inCommonModes else { return }
                    timerState.inCommonModes = false
                    state.commonTimers.removeAll { $0 === timer }
                    indexes = state.commonModes.compactMap { state.modeIndex[$0] }
                } else if let index = state.modeIndex[mode] {
                    indexes = [index]
                }
                state.unschedule(timer, &timerState, from: indexes)
                _ = state.repush(timer, timerState)
                if timerState.modes.isEmpty && !timerState.inCommonModes { timerState.loop = nil }
            }
        }
    }

    /// Whether `timer` is in `mode` (for ``Mode/common``: whether it was added for the common
    /// modes).
    public func contains(_ timer: RunLoopTimer, inMode mode: Mode) -> Bool {
        state.locked { state in
            timer.state.locked { timerState in
                guard timerState.loop === self else { return false }
                if mode == .common { return timerState.inCommonModes }
                guard let index = state.modeIndex[mode] else { return false }
                return timerState.modes.contains(index)
            }
        }
    }

    /// The earliest fire date of the valid timers in `mode`; nil if it has none (or for
    /// ``Mode/common``).
    public func nextTimerFireDate(forMode mode: Mode) -> ContinuousClock.Instant? {
        withState { state in
            guard mode != .common, let index = state.modeIndex[mode] else { return nil }
            // A timer firing now still counts, with the date it fires for (as in CoreFoundation).
            let firing = state.modes[index].firingFireNs
            // The earliest queued timer reports its date as given (a past one stays as given).
            if let next = state.modes[index].timers.peekLive(graveyard: &state.graveyard), next.fireNs <= firing {
                return LoopClock.instant(next.timer.state.locked { $0.reportedNs })
            }
            return firing == LoopClock.never ? nil : LoopClock.instant(firing)
        }
    }

    /// Takes an invalidated timer out of every mode.
    func detach(_ timer: RunLoopTimer) {
        mutatingItems { state in
            timer.state.locked { timerState in
                guard timerState.loop === self else { return }
                state.detach(timer, &timerState)
            }
        }
    }

    /// Moves a scheduled timer; returns false if it is no longer on this loop (the caller retries).
    func reschedule(_ timer: RunLoopTimer, fire: (ns: Int64, reported: Int64)?, toleranceNs: Int64?) -> Bool {
        withState { state in
            let done = timer.state.locked { timerState -> Bool in
                guard timerState.loop === self else { return false }
                if let fire { timerState.setFire(fire.ns, reported: fire.reported) }
                if let toleranceNs { timerState.toleranceNs = toleranceNs }
                // A loop being torn down takes no new heap entries (their retains would never be
                // released); the teardown unties the timer next.
                if timerState.valid && !state.tornDown { _ = state.repush(timer, timerState) }
                return true
            }
            if done { rearmForEarlierTimers(&state) }
            return done
        }
    }

    /// Re-arms the timerfd, from whatever thread changed the timers, when the running mode's timers
    /// now need an earlier wakeup than the one armed — as CoreFoundation re-arms a mode's timer
    /// port when a timer is added, without waking the loop. Called with the loop's lock held.
    func rearmForEarlierTimers(_ state: inout LoopState) {
        guard let running = state.runningModes.last else { return }
        let deadline = state.modes[running].timers.coalescedDeadline()
        if deadline < state.armedDeadline { arm(&state, deadline) }
    }

    /// Arms the timerfd for `deadline`. Called with the loop's lock held, which orders the arming
    /// done by the loop's thread and by other threads.
    func arm(_ state: inout LoopState, _ deadline: Int64) {
        // The timerfd is shared with the parent after a fork: arming it from the child would move
        // the parent's wakeup.
        preconditionNotForked("a timer change (add, fireDate, invalidate)")
        guard let backend else {
            // Sleeping on the futex, without a timerfd: woken to compute its sleep again.
            state.wakeAfterChange = true
            return
        }
        do throws(Errno) {
            try backend.arm(deadlineNs: deadline == LoopClock.never ? nil : deadline)
            state.armedDeadline = deadline
        } catch {
            // Not expected (the deadline is within timerfd's range); the loop then wakes to look
            // at its timers again rather than sleep past them.
            state.deferredErrors.append("timerfd_settime on \(shortDescription) failed: \(error); the loop wakes to retry")
            state.wakeAfterChange = true
        }
    }

    // MARK: Blocks

    /// Queues `block` to run on the loop's thread, the next time the loop runs in one of `modes`
    /// (``Mode/common`` matches every common mode), and wakes the loop.
    ///
    /// Blocks run first in, first out; a block queued while blocks run waits for the next pass.
    /// Unlike `CFRunLoopPerformBlock`, this wakes a sleeping loop. An empty `modes` does nothing.
    ///
    /// - Complexity: O(1) amortized.
    public func perform(inModes modes: [Mode] = RunLoop.defaultModeOnly, _ block: @escaping @Sendable () -> Void) {
        guard let first = modes.first else { return }
        if modes.count == 1 && first == .default {
            enqueue(PendingBlock(modes: .defaultOnly, body: block))
            return
        }
        // As CFRunLoopPerformBlock: the block's modes exist from now on (not the placeholder).
        if modes.contains(where: { $0 != .default && $0 != .common }) {
            state.locked { state in
                for mode in modes where mode != .default && mode != .common { _ = state.index(of: mode) }
            }
        }
        enqueue(PendingBlock(modes: modes.count > 1 ? .many(modes) : .one(first), body: block))
    }

    /// Queues `block` to run on the loop's thread the next time the loop runs in the default mode,
    /// and wakes the loop: ``perform(inModes:_:)->()`` with `[.default]`, without looking at a modes
    /// array.
    ///
    /// - Complexity: O(1) amortized.
    public func perform(_ block: consuming @escaping @Sendable () -> Void) {
        enqueue(PendingBlock(modes: .defaultOnly, body: block))
    }

    /// Hands a block to the loop's inbox and wakes the loop; drops it (with a warning) once the
    /// loop's thread has exited.
    @inline(__always)
    private func enqueue(_ block: consuming PendingBlock) {
        preconditionNotForked("perform(_:)")
        guard !blocksClosed.load(ordering: .acquiring) else {
            Diagnostics.warning("block performed on \(shortDescription) after its thread exited; dropped")
            return
        }
        inbox.push(block)
        requestWakeUp()
    }

    /// Runs `body` under the lock and bumps ``itemsVersion`` before unlocking: every change to a
    /// mode's sources, observers or timers goes through here.
    @inline(__always)
    @discardableResult
    func mutatingItems<Result: Sendable>(_ body: (inout LoopState) -> Result) -> Result {
        var attention = false
        let result = withState { state in
            let result = body(&state)
            // Every writer holds the lock, so a load and a store (no locked read-modify-write) lose
            // no update.
            itemsVersion.store(itemsVersion.load(ordering: .relaxed) &+ 1, ordering: .releasing)
            attention = state.attentionAfterChange
            state.attentionAfterChange = false
            return result
        }
        if attention { source1NeedsAttention() }
        return result
    }

    /// Runs `body` under the lock, then releases the timer entries it dropped (see
    /// `LoopState.graveyard`) with the lock let go. Every access that may drop heap entries goes
    /// through here.
    @inline(__always)
    func withState<Result: Sendable>(_ body: (inout LoopState) -> Result) -> Result {
        // Optionals, not empty arrays: this runs for every fired timer, and making an empty array
        // is not free (reference counting on the shared empty storage).
        var dropped: ContiguousArray<TimerEntry>? = nil
        var errors: [String]? = nil
        var wakeAfterChange = false
        let result = state.locked { state in
            let result = body(&state)
            if state.wakeAfterChange {
                state.wakeAfterChange = false
                wakeAfterChange = true
            }
            if !state.graveyard.isEmpty {
                dropped = state.graveyard
                state.graveyard = []
            }
            if !state.deferredErrors.isEmpty {
                errors = state.deferredErrors
                state.deferredErrors = []
            }
            return result
        }
        if let dropped { for entry in dropped { entry.release() } }
        if let errors { for message in errors { Diagnostics.error(message) } }
        if wakeAfterChange { requestWakeUp() }
        return result
    }

    /// `[.default]`, made once: a default argument written as a literal would allocate an array on
    /// every call.
    @usableFromInline
    static let defaultModeOnly: [Mode] = [.default]

    // MARK: Waking and stopping

    /// Wakes the loop if it sleeps; if it is running and has not slept yet in this pass, its next
    /// sleep returns at once. Safe from any thread. A wakeup with nothing to do is not a handled
    /// source: the run goes on.
    ///
    /// As in CoreFoundation, a wakeup is ignored while the loop is not running and from the end of
    /// a sleep until the next pass begins (the pass handles what woke it, and the next pass looks
    /// at every source anyway). Unlike CoreFoundation, the next pass does not sleep if the mode
    /// is then empty: the run returns ``RunResult/finished``. So emptying a mode from another
    /// thread and then calling `wakeUp()` always ends the run.
    public func wakeUp() {
        if wake.requestByUser().mustSignal { signalSleeper() }
    }

    /// Whether the loop is sleeping in the kernel right now (or about to).
    public var isWaiting: Bool { wake.sleeping.load(ordering: .acquiring) }

    /// How long before a timer is due the loop stops sleeping in the kernel and spins instead,
    /// trading CPU time for punctuality. `.zero` (the default) sleeps until the timer is due, as
    /// CoreFoundation does: a timer then fires late by the kernel's wakeup latency, tens of
    /// microseconds on a virtual machine and more under load.
    ///
    /// With a window `w`, a sleep that a timer ends is cut short by `w`: the loop wakes `w` early,
    /// then waits out the rest on the CPU, watching for wakeups from other threads. Set it for
    /// frame-aligned or measurement timers where a late fire matters more than a core's time; the
    /// cost is up to `w` of busy CPU per timer fire (a 200 µs window on a 1 ms timer is a fifth of
    /// a core). Observers see the spin as a wait: `beforeWaiting`, then `afterWaiting`, possibly
    /// twice for one timer (once for the early wakeup, once for the spin). Negative values count
    /// as zero. Safe from any thread; takes effect at the loop's next sleep.
    public var timerSpinWindow: Duration {
        get { .nanoseconds(timerSpinNs.load(ordering: .relaxed)) }
        set { timerSpinNs.store(max(0, newValue.saturatedNanoseconds), ordering: .relaxed) }
    }

    /// Ends the innermost run in progress with ``RunResult/stopped``. Safe from any thread. A stop
    /// while the loop is not running is dropped, as in CoreFoundation.
    public func stop() {
        guard wake.requestStop() else {
            if Diagnostics.debugEnabled {
                Diagnostics.warning(
                    "stop() on \(shortDescription), which is not running: dropped, as CoreFoundation drops it (to stop a keep-alive loop, perform { loop.stop() } on it, or clear its keep-running flag)"
                )
            }
            return
        }
        // CFRunLoopStop wakes the loop as CFRunLoopWakeUp does; a pass in progress ends with the
        // stop at its end in any case.
        wakeUp()
    }

    /// The coalesced wakeup: asks for it, and writes the eventfd only if the loop sleeps and no
    /// other waker got there first (the wake protocol's `request`).
    @inline(__always)
    func requestWakeUp() {
        if wake.request() { signalSleeper() }
    }

    /// Wakes the sleeping loop: writes its eventfd, or posts its futex while it has no descriptors.
    private func signalSleeper() {
        preconditionNotForked("wakeUp()")
        if sleepsOnFutex.load(ordering: .sequentiallyConsistent) {
            futex.post()
        } else {
            backend?.signal()
        }
    }

    // MARK: Identity

    /// Loops are equal only to themselves.
    public static func == (lhs: RunLoop, rhs: RunLoop) -> Bool { lhs === rhs }

    /// Hashes the loop's identity.
    public func hash(into hasher: inout Hasher) { hasher.combine(ObjectIdentifier(self)) }

    var shortDescription: String { "<RunLoop \(objectAddress(self)) thread '\(ownerName)' tid \(ownerTID)>" }
}

/// Where ``RunLoop/main`` lives: made on first use, and made again in a child of fork() (the
/// parent's main loop shares its descriptors with the parent). A compare-and-swap on a retained
/// pointer rather than a lock, because a lock could be held, at the fork, by a thread the child
/// does not have.
enum MainLoopSlot {
    private static let slot = Atomic<UInt>(0)

    /// The main loop; `setUp` runs once on a new one, on the thread that made it.
    static func loop(setUp: (RunLoop) -> Void) -> RunLoop {
        let raw = slot.load(ordering: .acquiring)
        if raw != 0 {
            let loop = Unmanaged<RunLoop>.fromOpaque(UnsafeRawPointer(bitPattern: raw)!).takeUnretainedValue()
            if !loop.isFromBeforeFork { return loop }
        }
        return make(replacing: raw, setUp: setUp)
    }

    private static func make(replacing old: UInt, setUp: (RunLoop) -> Void) -> RunLoop {
        let loop = RunLoop.makeMain()
        let new = UInt(bitPattern: Unmanaged.passRetained(loop).toOpaque())
        let (exchanged, current) = slot.compareExchange(
            expected: old, desired: new, ordering: .acquiringAndReleasing)
        guard exchanged else {
            Unmanaged<RunLoop>.fromOpaque(UnsafeRawPointer(bitPattern: new)!).release()
            return Unmanaged<RunLoop>.fromOpaque(UnsafeRawPointer(bitPattern: current)!).takeUnretainedValue()
        }
        // The replaced loop (the parent's, in a forked child) is left alone, as `current` does.
        setUp(loop)
        return loop
    }
}

extension RunLoop {
    /// A new main loop (see ``MainLoopSlot``).
    fileprivate static func makeMain() -> RunLoop { RunLoop(ownerTID: getpid(), ownerName: "main", isMainLoop: true) }
}

/// The thread-local slot that maps a thread to its loop, and the thread-exit hook.
enum ThreadLoops {
    /// The key; its destructor runs when a thread with a loop exits and tears the loop down.
    static let key: pthread_key_t = {
        var key = pthread_key_t()
        let status = pthread_key_create(&key) { raw in
            guard let raw else { return }
            let loop = Unmanaged<RunLoop>.fromOpaque(raw).takeRetainedValue()
            // A loop inherited through fork() belongs to the parent: left alone.
            guard !loop.isMainLoop, !loop.isFromBeforeFork else { return }
            // The teardown's callbacks (cancel callbacks, deinits) run on this thread, which is
            // still the loop's: the slot points at the loop meanwhile, so `isCurrent`,
            // `RunLoop.current`, `perform(waitUntilDone:)` and `LoopBound` see it. Cleared after,
            // so the destructor is not called again.
            pthread_setspecific(ThreadLoops.key, raw)
            loop.tearDown()
            pthread_setspecific(ThreadLoops.key, nil)
        }
        precondition(status == 0, "RunLoopKit: pthread_key_create failed (\(status))")
        return key
    }()

    /// The calling thread's name, or `tid N` when it has none.
    static func currentName() -> String {
        var buffer = [CChar](repeating: 0, count: 64)
        guard crlk_get_thread_name(&buffer, buffer.count) == 0 else { return "tid \(crlk_gettid())" }
        let name = String(decoding: buffer.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
        return name.isEmpty ? "tid \(crlk_gettid())" : name
    }
}

/// Log messages of the library, through swift-log (`Logger(label: "RunLoopKit")`).
enum Diagnostics {
    /// `RUNLOOPKIT_DEBUG=1` in the environment: misuse that is legal in CoreFoundation and silent
    /// there (a run of an empty mode, a dropped `stop()`) is logged too. Read once.
    static let debugEnabled: Bool = {
        guard let value = getenv("RUNLOOPKIT_DEBUG") else { return false }
        return String(cString: value) == "1"
    }()

    static func warning(_ message: @autoclosure () -> String) {
        Logger(label: "RunLoopKit").warning("\(message())")
    }

    static func error(_ message: @autoclosure () -> String) {
        Logger(label: "RunLoopKit").error("\(message())")
    }
}
