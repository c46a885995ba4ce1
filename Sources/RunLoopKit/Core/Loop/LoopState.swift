import DequeModule

/// A block queued with ``RunLoop/perform(inModes:_:)->()``.
struct PendingBlock: Sendable {
    enum Modes: Sendable {
        /// `[.default]`, the usual case, with nothing to retain.
        case defaultOnly
        case one(RunLoop.Mode)
        case many([RunLoop.Mode])
    }

    /// What the block does when it runs.
    enum Work: Sendable {
        /// A closure given to ``RunLoop/perform(inModes:_:)->()``.
        case closure(@Sendable () -> Void)
        /// A job of a task that prefers the loop, run with the loop as its task executor. Carried
        /// without a closure: the runtime's hop to the loop allocates nothing here.
        case taskJob(UnownedJob)
        /// A job isolated to the loop's serial executor (an actor's), run through it so that it
        /// never starts inside another of its jobs.
        case isolatedJob(UnownedJob)
    }

    let modes: Modes
    let work: Work

    init(modes: Modes, body: @escaping @Sendable () -> Void) {
        self.modes = modes
        self.work = .closure(body)
    }

    init(modes: Modes, work: Work) {
        self.modes = modes
        self.work = work
    }

    /// Runs the block on `loop`'s thread, consuming it: the closure is moved out of the block and
    /// called, so its context is released once, after the call, and not retained for it.
    @inline(__always)
    consuming func run(on loop: RunLoop) {
        switch work {
        case .closure(let body): body()
        case .taskJob(let job): job.runSynchronously(on: loop.asUnownedTaskExecutor())
        case .isolatedJob(let job): loop.serialExecutor.run(job)
        }
    }

    /// The block will never run: `loop`'s thread exited. A task's job goes on on the global
    /// concurrent executor (the task is not isolated to the loop; it finds the loop gone); an
    /// actor's job cannot run anywhere else, so its task never resumes (a warning says so).
    func dropped(by loop: RunLoop) {
        switch work {
        case .closure:
            break
        case .taskJob(let job):
            globalConcurrentExecutor.enqueue(ExecutorJob(job))
        case .isolatedJob:
            Diagnostics.warning(
                "a job of an actor pinned to \(loop.shortDescription) came after its thread exited; dropped (the actor's task never resumes)"
            )
        }
    }

    /// Whether the block may run in `mode` (``RunLoop/Mode/common`` matches every common mode).
    @inline(__always)
    func runs(in mode: RunLoop.Mode, modeIsCommon: Bool) -> Bool {
        switch modes {
        case .defaultOnly: mode == .default
        case .one(let wanted): wanted == mode || (modeIsCommon && wanted == .common)
        case .many(let wanted): wanted.contains { $0 == mode || (modeIsCommon && $0 == .common) }
        }
    }
}

/// One descriptor number in one mode's epoll set.
struct WatchedDescriptor: Sendable {
    /// What the registration's events carry (never the number, which the kernel may reuse).
    let tag: UInt64
    /// The mode's sources on this descriptor, in the order they joined.
    var sources: [FileDescriptorSource]
    /// The events registered: the union of what the sources watch.
    var interest: EpollBackend.IOEvents

    /// The union of what the sources watch now.
    var wantedInterest: EpollBackend.IOEvents {
        sources.reduce([]) { $0.union(EpollBackend.IOEvents(rawValue: $1.watchedEvents.rawValue)) }
    }
}

/// One mode's items. Sources and observers are kept sorted by order (stable), so a run takes a
/// snapshot by retaining the array: no copy unless the array changes while the snapshot is held.
struct ModeState: Sendable {
    let name: RunLoop.Mode
    var sources: ContiguousArray<RunLoopSource> = []
    var observers: ContiguousArray<RunLoopObserver> = []
    var observerMask: UInt = 0
    var timers = TimerHeap()
    var timerCount = 0
    /// While the loop fires a batch of this mode's due timers: the timer firing now (the batch's
    /// earliest not yet done), which left the heap when the batch was taken but, as in
    /// CoreFoundation, still counts for ``RunLoop/nextTimerFireDate(forMode:)`` until it leaves
    /// the mode.
    var firing = FiringTimer()
    /// Version-1 sources (descriptor sources and message ports), sorted by order (stable).
    var sources1: ContiguousArray<any Source1Item> = []
    /// The descriptors the mode's epoll set watches, by number: one registration each (the kernel
    /// keys registrations by file and number), serving every source of the mode on it.
    var descriptors: [Int32: WatchedDescriptor] = [:]
    /// The number each registration's tag stands for.
    var descriptorNumbers: [UInt64: Int32] = [:]
    /// The interest set may hold a registration that could not be deleted (its number was closed
    /// while another reference kept the file open): the set is made anew before the next sleep.
    var interestSetStale = false
    /// The mode's own interest set (the loop's wakeup and timer descriptors plus the mode's
    /// descriptor sources), made when its first descriptor source joins; nil until then, and runs
    /// in the mode sleep in the backend's base set.
    var interestSet: EpollBackend.InterestSet?
    /// Making the interest set failed (logged once until it succeeds).
    var interestSetFailed = false
    /// How many `RunLoopPendingWork` objects hold the mode (the common modes' count is the loop's
    /// `commonPendingWork`): a reference, read by runs without the lock.
    let pendingWork = PendingWorkCount()

    init(name: RunLoop.Mode) { self.name = name }

    mutating func recomputeObserverMask() {
        observerMask = observers.reduce(0) { $0 | $1.activities.rawValue }
    }
}

/// Everything about a loop that other threads may change, kept under the loop's lock.
struct LoopState: Sendable {
    /// The mode table. Modes are never removed, so an index stays valid for the loop's life.
    var modes: ContiguousArray<ModeState> = []
    var modeIndex: [RunLoop.Mode: Int] = [:]
    var commonModes: [RunLoop.Mode] = []
    /// Items added for ``RunLoop/Mode/common``, which join modes made common later.
    var commonSources: [RunLoopSource] = []
    var commonObservers: [RunLoopObserver] = []
    var commonTimers: [RunLoopTimer] = []
    var commonSources1: [any Source1Item] = []
    /// The descriptor sources on the loop, by number: several may share one descriptor (a read and
    /// a write source on a socket); a source whose descriptor differs from theirs (device and
    /// inode) means the number was closed and reused.
    var descriptorOwners: [Int32: [FileDescriptorSource]] = [:]
    /// The modes (indexes) of the runs in progress, innermost last.
    var runningModes: [Int] = []
    /// The deadline the loop's timerfd is armed for; `LoopClock.never` when disarmed or expired.
    var armedDeadline = LoopClock.never
    var nextTimerSequence: UInt64 = 1
    var tornDown = false
    /// The main queue's port (``RunLoop/main`` only): checked before a pass announces a sleep.
    var dispatchPort: FileDescriptorSource?
    /// Heap entries dropped under the lock; their retains are released once it is let go (see
    /// `RunLoop.withState`), because releasing the last reference to a timer runs its handler's
    /// captures' deinits, which may call back into the loop.
    var graveyard = ContiguousArray<TimerEntry>()
    /// A change under the lock found a version-1 source with something to deliver (a descriptor
    /// found closed) or a mode whose sleep must change (a new epoll set): the loop is told once
    /// the change is published and the lock let go (see `RunLoop.mutatingItems`), so it cannot
    /// wake and go back to sleep on the old item lists.
    var attentionAfterChange = false
    /// A change under the lock needs the loop to compute its sleep again (a timer added while it
    /// sleeps on the futex, with no timerfd to re-arm): woken once the lock is let go.
    var wakeAfterChange = false
    /// Errors found under the lock, logged once it is let go (a log handler is user code).
    var deferredErrors: [String] = []

    init() {
        // The default mode is always index 0 (index(of:) relies on it).
        modes.append(ModeState(name: .default))
        modeIndex[.default] = 0
        commonModes = [.default]
    }

    /// Checks, in debug builds, what the run algorithm relies on between changes: the mode table
    /// and its index agree (the default mode first), running modes exist (a common mode need not: as
    /// in CoreFoundation it is made only once a common item needs it), a mode's
    /// observer mask covers every observer's activities (a pass skips the observer phase on the
    /// mask alone), and every timer heap is in heap order.
    ///
    /// - Complexity: O(modes), plus each mode's observers up to 512 (above, the last one) and the
    ///   heaps' checks (see `TimerHeap.checkInvariants`).
    func checkInvariants() {
        #if DEBUG
        precondition(modes.first?.name == .default, "LoopState: the default mode is not at index 0")
        precondition(modeIndex.count == modes.count, "LoopState: \(modes.count) modes, \(modeIndex.count) indexed")
        for (index, mode) in modes.enumerated() {
            precondition(
                index == 0 || modeIndex[mode.name] == index,
                "LoopState: mode \(mode.name.rawValue) at \(index) is indexed at \(String(describing: modeIndex[mode.name]))")
            var activities: UInt = 0
            // All of them up to the heaps' limit, above it the last added: adding 100,000 observers
            // one by one must stay linear.
            let checked = mode.observers.count <= TimerHeap.fullCheckLimit ? mode.observers[...] : mode.observers.suffix(1)
            for observer in checked { activities |= observer.activities.rawValue }
            precondition(
                mode.observerMask & activities == activities,
                "LoopState: mode \(mode.name.rawValue)'s observer mask misses activities of its observers")
            mode.timers.checkInvariants()
        }
        for index in runningModes { precondition(index < modes.count, "LoopState: a running mode index is out of range") }
        #endif
    }

    /// Notes that `timer` left the mode at `index`: if it is the one firing there, it no longer
    /// counts for ``RunLoop/nextTimerFireDate(forMode:)`` (CoreFoundation's mode drops it from its
    /// timer list).
    mutating func noteLeft(_ timer: RunLoopTimer, mode index: Int) {
        if modes[index].firing.timer == ObjectIdentifier(timer) { modes[index].firing.left = true }
    }

    /// The index of `mode`, creating the mode if needed.
    mutating func index(of mode: RunLoop.Mode) -> Int {
        if mode == .default { return 0 }  // made first, in init; skips hashing the name
        if let index = modeIndex[mode] { return index }
        modes.append(ModeState(name: mode))
        modeIndex[mode] = modes.count - 1
        return modes.count - 1
    }

    /// The indexes `mode` stands for: every common mode for ``RunLoop/Mode/common``.
    mutating func indexes(for mode: RunLoop.Mode) -> [Int] {
        mode == .common ? commonModes.map { index(of: $0) } : [index(of: mode)]
    }

    func isCommon(_ mode: RunLoop.Mode) -> Bool { commonModes.contains(mode) }

    /// Whether the mode at `index` has neither sources nor timers (observers do not count; pending
    /// blocks are the loop thread's to check).
    func hasNoItems(_ index: Int) -> Bool {
        modes[index].sources.isEmpty && modes[index].timerCount == 0 && modes[index].sources1.isEmpty
    }

    // MARK: Sources

    /// Adds `source`; returns the real modes it joined. `fresh`: the source is on none of this
    /// loop's lists yet, so the membership scans are skipped. Adding for ``RunLoop/Mode/common``
    /// again puts it back in every common mode it was removed from (as CoreFoundation does).
    ///
    /// - Complexity: O(1) amortized for a fresh source whose order is not below the mode's last;
    ///   O(n) otherwise.
    mutating func add(_ source: RunLoopSource, for mode: RunLoop.Mode, fresh: Bool) -> [RunLoop.Mode] {
        if mode == .common, fresh || !commonSources.contains(where: { $0 === source }) {
            commonSources.append(source)
        }
        var joined: [RunLoop.Mode] = []
        for index in indexes(for: mode) where insert(source, into: index, fresh: fresh) {
            joined.append(modes[index].name)
        }
        return joined
    }

    private mutating func insert(_ source: RunLoopSource, into index: Int, fresh: Bool) -> Bool {
        if !fresh && modes[index].sources.contains(where: { $0 === source }) { return false }
        modes[index].sources.insert(source, at: Self.position(ofOrder: source.order, in: modes[index].sources) { $0.order })
        return true
    }

    /// Where an item of `order` goes in a list sorted by order, after the items of equal order: at
    /// the end when it is not below the last (the usual case, O(1)), else found by binary search.
    static func position<Item>(ofOrder order: Int, in list: ContiguousArray<Item>, _ orderOf: (Item) -> Int) -> Int {
        guard let last = list.last, orderOf(last) > order else { return list.endIndex }
        var low = 0
        var high = list.count - 1
        while low < high {
            let middle = (low + high) / 2
            if orderOf(list[middle]) > order { high = middle } else { low = middle + 1 }
        }
        return low
    }

    /// Removes `source`; returns the real modes it left.
    mutating func remove(_ source: RunLoopSource, for mode: RunLoop.Mode) -> [RunLoop.Mode] {
        if mode == .common {
            guard let position = commonSources.firstIndex(where: { $0 === source }) else { return [] }
            commonSources.remove(at: position)
        } else if modeIndex[mode] == nil {
            return []
        }
        var left: [RunLoop.Mode] = []
        for index in indexes(for: mode) {
            if let position = modes[index].sources.firstIndex(where: { $0 === source }) {
                modes[index].sources.remove(at: position)
                left.append(modes[index].name)
            }
        }
        return left
    }

    func contains(_ source: RunLoopSource, in mode: RunLoop.Mode) -> Bool {
        if mode == .common { return commonSources.contains { $0 === source } }
        guard let index = modeIndex[mode] else { return false }
        return modes[index].sources.contains { $0 === source }
    }

    // MARK: Observers

    /// Adds `observer` (see ``add(_:for:fresh:)-(RunLoopSource,_,_)`` for `fresh` and ``RunLoop/Mode/common``).
    ///
    /// - Complexity: O(1) amortized for a fresh observer whose order is not below the mode's last;
    ///   O(n) otherwise.
    mutating func add(_ observer: RunLoopObserver, for mode: RunLoop.Mode, fresh: Bool) {
        if mode == .common, fresh || !commonObservers.contains(where: { $0 === observer }) {
            commonObservers.append(observer)
        }
        for index in indexes(for: mode) { insert(observer, into: index, fresh: fresh) }
    }

    private mutating func insert(_ observer: RunLoopObserver, into index: Int, fresh: Bool) {
        if !fresh && modes[index].observers.contains(where: { $0 === observer }) { return }
        modes[index].observers.insert(
            observer, at: Self.position(ofOrder: observer.order, in: modes[index].observers) { $0.order })
        modes[index].observerMask |= observer.activities.rawValue
    }

    mutating func remove(_ observer: RunLoopObserver, for mode: RunLoop.Mode) {
        if mode == .common {
            guard let position = commonObservers.firstIndex(where: { $0 === observer }) else { return }
            commonObservers.remove(at: position)
        } else if modeIndex[mode] == nil {
            return
        }
        for index in indexes(for: mode) {
            if let position = modes[index].observers.firstIndex(where: { $0 === observer }) {
                modes[index].observers.remove(at: position)
                modes[index].recomputeObserverMask()
            }
        }
    }

    func contains(_ observer: RunLoopObserver, in mode: RunLoop.Mode) -> Bool {
        if mode == .common { return commonObservers.contains { $0 === observer } }
        guard let index = modeIndex[mode] else { return false }
        return modes[index].observers.contains { $0 === observer }
    }

    // MARK: Timers (the caller holds the timer's lock too, taken after this state's)

    /// Schedules `timer` in the mode at `index` with the timer's current schedule; returns its
    /// latest fire time if it joined, nil if it was there already.
    mutating func schedule(_ timer: RunLoopTimer, _ state: inout TimerState, into index: Int) -> Int64? {
        guard state.modes.insert(index) else { return nil }
        modes[index].timerCount += 1
        return push(timer, state, into: index)
    }

    /// Pushes a heap entry for the timer's current schedule and generation into one mode.
    @discardableResult
    mutating func push(_ timer: RunLoopTimer, _ state: TimerState, into index: Int) -> Int64 {
        let latest = state.fireNs.addingSaturated(state.toleranceNs)
        modes[index].timers.insert(
            TimerEntry(
                fireNs: state.fireNs,
                latestNs: latest,
                sequence: state.sequence,
                generation: timer.generation,
                timer: timer
            )
        )
        modes[index].timers.compactIfNeeded(liveCount: modes[index].timerCount, graveyard: &graveyard)
        return latest
    }

    /// Gives the timer a new generation (making its old entries stale) and pushes fresh entries
    /// into each of its modes; returns the earliest latest-fire time pushed.
    mutating func repush(_ timer: RunLoopTimer, _ state: TimerState) -> Int64 {
        timer.bumpGeneration()
        var earliest = LoopClock.never
        state.modes.forEach { index in earliest = min(earliest, push(timer, state, into: index)) }
        return earliest
    }

    /// Takes the timer out of the modes at `indexes`, making all its entries stale (push fresh ones
    /// for the modes it stays in).
    mutating func unschedule(_ timer: RunLoopTimer, _ state: inout TimerState, from indexes: [Int]) {
        timer.bumpGeneration()
        for index in indexes where state.modes.remove(index) {
            noteLeft(timer, mode: index)
            modes[index].timerCount -= 1
            modes[index].timers.dropStaleEntries(
                of: timer, liveCount: modes[index].timerCount, graveyard: &graveyard)
        }
    }

    /// Takes the timer out of every mode it is in and out of the common items, and unties it from
    /// this loop. Its entries must already be stale (its generation bumped).
    /// Returns whether a mode lost its last timer (which may make it empty).
    @discardableResult
    mutating func detach(_ timer: RunLoopTimer, _ state: inout TimerState) -> Bool {
        var emptied = false
        state.modes.forEach { index in
            noteLeft(timer, mode: index)
            modes[index].timerCount -= 1
            if modes[index].timerCount == 0 { emptied = true }
            modes[index].timers.dropStaleEntries(
                of: timer, liveCount: modes[index].timerCount, graveyard: &graveyard)
        }
        state.modes.removeAll()
        if state.inCommonModes {
            state.inCommonModes = false
            commonTimers.removeAll { $0 === timer }
        }
        state.loop = nil
        return emptied
    }

    // MARK: Common modes

    /// Makes `mode` common and adds every common item to it; returns the sources that joined, for
    /// their schedule callbacks. Timers that join are pushed with their current schedule.
    mutating func makeCommon(_ mode: RunLoop.Mode, loop: RunLoop) -> [RunLoopSource] {
        guard mode != .common, !commonModes.contains(mode) else { return [] }
        commonModes.append(mode)
        // As CFRunLoopAddCommonMode: the mode is made only if there are common items to put in it.
        if commonSources.isEmpty && commonObservers.isEmpty && commonTimers.isEmpty && commonSources1.isEmpty {
            return []
        }
        let index = index(of: mode)
        var joined: [RunLoopSource] = []
        for source in commonSources where insert(source, into: index, fresh: false) { joined.append(source) }
        for observer in commonObservers { insert(observer, into: index, fresh: false) }
        for timer in commonTimers {
            timer.state.locked { state in
                guard state.valid, state.loop === loop else { return }
                _ = schedule(timer, &state, into: index)
            }
        }
        for item in commonSources1 {
            item.withRegistration { registration in
                guard registration.valid, registration.loop === loop else { return }
                loop.join(item, &registration, index, &self)
            }
        }
        return joined
    }
}

/// The timer a mode is firing now (see `ModeState.firing`), and what counts for the mode's next
/// fire date after it.
struct FiringTimer {
    /// Its fire date; `LoopClock.never` when no batch of the mode is firing.
    var fireNs = LoopClock.never
    var timer: ObjectIdentifier?
    /// The same timer, to read the date it reports (a past date given is reported as given while
    /// it fires at `fireNs`, clamped to when it was given). Valid while `timer` is set and
    /// `left` false: its batch entry holds a retain until the mode's firing moves past it.
    var firingTimer: Unmanaged<RunLoopTimer>?
    /// It left the mode during its handler (removed, invalidated): ``followingNs`` counts instead.
    var left = false
    /// The fire date of the batch's next timer, or what counted before the batch.
    var followingNs = LoopClock.never

    /// What counts for the mode's next fire date.
    var countedNs: Int64 { left ? followingNs : fireNs }
}
