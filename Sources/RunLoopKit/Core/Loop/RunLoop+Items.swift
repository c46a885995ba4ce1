import CRunLoopKit
import Glibc
import Synchronization
import SystemPackage

// Adding, removing and finding a loop's items (sources, observers, timers), its modes and its
// blocks, from any thread; every change goes through `mutatingItems` or `withState`.

extension RunLoop {
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
            // A timer firing now still counts until it leaves the mode (as in CoreFoundation).
            let firingTimer = state.modes[index].firing
            let firing = firingTimer.countedNs
            // Every timer reports its date as given (a past one stays as given, queued or firing),
            // while the order is that of the dates they fire at.
            if let next = state.modes[index].timers.peekLive(graveyard: &state.graveyard), next.fireNs <= firing {
                return LoopClock.instant(next.timer.state.locked { $0.reportedNs })
            }
            if !firingTimer.left, let timer = firingTimer.firingTimer {
                return LoopClock.instant(timer.takeUnretainedValue().state.locked { $0.reportedNs })
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

    /// Hands a block to the loop's inbox and wakes the loop; drops it once the loop's thread has
    /// exited (a closure with a warning; a job as ``PendingBlock/dropped(by:)`` says). The inbox
    /// decides under its lock, so a block is either queued before the thread's exit closes the
    /// inbox (and the exit drops it the same way) or refused here: none is left behind.
    ///
    /// Only the block that finds the inbox empty asks for the wakeup; why the others need not is
    /// in `BlockQueue`'s documentation.
    @inline(__always)
    func enqueue(_ block: consuming PendingBlock) {
        preconditionNotForked("perform(_:)")
        switch inbox.push(block, firstPush: { wake.request() }) {
        case .queued(let signal):
            if signal { signalSleeper() }
        case .refused(let refused):
            if case .closure = refused.work {
                Diagnostics.warning("block performed on \(shortDescription) after its thread exited; dropped")
            }
            refused.dropped(by: self)
        }
    }

    /// Runs `body` under the lock and bumps ``itemsVersion`` before unlocking: every change to a
    /// mode's sources, observers or timers goes through here.
    @inline(__always)
    @discardableResult
    func mutatingItems<Result: Sendable>(_ body: (inout LoopState) -> Result) -> Result {
        var attention = false
        let result = withState { state in
            let result = body(&state)
            state.checkInvariants()
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
}
