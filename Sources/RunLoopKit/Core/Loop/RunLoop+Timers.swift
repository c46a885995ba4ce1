import CRunLoopKit
import DequeModule
import Glibc
import SystemPackage

// The timers phase of a pass (see RunLoop+Run.swift): due timers fired by fire date, one-shots
// retired, repeating ones rescheduled, and a nested run taking over the rest of a batch.

extension RunLoop {
    /// Fires the mode's due timers in order of fire date (then insertion), as CoreFoundation's
    /// `__CFRunLoopDoTimers`: the timers due now are collected first, then each fires if, at its
    /// turn, it is still valid, on this loop, not already firing, and due (an earlier handler of
    /// the batch may have moved or invalidated it). A repeating timer then moves to the first point
    /// of its schedule after now, unless its handler set a later fire date; a one-shot timer is
    /// invalidated.
    func doTimers(_ context: inout RunContext) {
        refreshItems(&context)
        guard context.items.timerCount > 0 else { return }
        enterPhase(.timers, &context)
        // The batch of a pass further out that is calling a timer handler now (this run is
        // nested in it), set aside while this batch runs.
        var outer = TimerBatch()
        swap(&outer, &confined.firingBatch)
        defer { swap(&outer, &confined.firingBatch) }
        fireDueTimers(&context)
    }

    /// A run starting inside a timer handler, in the mode of that handler's batch, takes over the
    /// timers the batch collected and has not fired yet. In CoreFoundation they stay in the mode,
    /// so the nested run fires those that are due, and its sleep counts them: they go back to the
    /// heap (their retains with them), and the outer pass ends its batch there.
    func takeOverOuterTimerBatch(_ modeIndex: Int) {
        guard confined.firingBatch.modeIndex == modeIndex,
            confined.firingBatch.next < confined.firingBatch.entries.count
        else { return }
        let next = confined.firingBatch.next
        withState { state in
            for index in next..<confined.firingBatch.entries.count {
                state.modes[modeIndex].timers.insert(confined.firingBatch.entries[index])
            }
        }
        confined.firingBatch.entries.removeLast(confined.firingBatch.entries.count - next)
    }

    /// The body of ``doTimers(_:)``: collects the due timers, then fires them one by one.
    private func fireDueTimers(_ context: inout RunContext) {
        let now = LoopClock.now()
        let modeIndex = context.modeIndex
        let outerFiring = state.locked { state -> FiringTimer in
            while let entry = state.modes[modeIndex].timers.popEarliest(dueBy: now) {
                context.scratch.dueTimers.append(entry)
            }
            let outer = state.modes[modeIndex].firing
            // From now until it is rescheduled, the first timer to fire counts for
            // nextTimerFireDate (it left the heap).
            // An index loop: `first(where:)`, unspecialized in debug builds, allocates.
            var index = 0
            while index < context.scratch.dueTimers.count {
                if context.scratch.dueTimers[index].isLive {
                    state.modes[modeIndex].firing = Self.firing(at: index, of: context.scratch.dueTimers, outer: outer)
                    break
                }
                index += 1
            }
            return outer
        }
        guard !context.scratch.dueTimers.isEmpty else { return }
        keepLiveEntries(&context.scratch.dueTimers)
        guard !context.scratch.dueTimers.isEmpty else { return }
        // Whether the last retire or reschedule put `outerFiring` back (then no lock is needed for
        // it at the end).
        var floorRestored = false
        // A big batch of timers does not fit in the caches: each is brought in this far ahead.
        let lookahead = 8
        var index = 0
        // Re-read each time: a run nested in a handler may take the rest of the batch (doTimers).
        while index < context.scratch.dueTimers.count {
            let due = context.scratch.dueTimers.count
            let entry = context.scratch.dueTimers[index]
            if index + lookahead < due { context.scratch.dueTimers[index + lookahead].prefetchTimer() }
            index += 1
            // The entry's retain keeps the timer alive until `entry.release()`.
            unowned(unsafe) let timer = entry.timer
            switch prepareToFire(timer, entry) {
            case .fire(let handler, let firedAt):
                // The rest of the batch is where a nested run can find it while the handler runs.
                confined.firingBatch.modeIndex = modeIndex
                confined.firingBatch.next = index
                swap(&context.scratch.dueTimers, &confined.firingBatch.entries)
                if _slowPath(context.pass.tracing) { traceCalloutBegin(timer, .timers, &context) }
                calloutBegins(.timer, label: TimerLabels.calloutLabel(of: timer))
                handler(timer)
                calloutEnds()
                if _slowPath(context.pass.tracing) { traceCalloutEnd(&context) }
                swap(&context.scratch.dueTimers, &confined.firingBatch.entries)
                confined.firingBatch.modeIndex = -1
                timer.endFiring()
                // After the handler: a run it nested may have taken over the rest of the batch.
                let following = Self.firing(at: index, of: context.scratch.dueTimers, outer: outerFiring)
                if timer.intervalNs == 0 {
                    retireOneShot(timer, modeIndex: modeIndex, following: following)
                } else {
                    rescheduleAfterFire(timer, firedAt: firedAt, modeIndex: modeIndex, following: following)
                }
                floorRestored = index >= context.scratch.dueTimers.count
            case .firingInOuterRun:
                // Its entry goes back to the heap (with its retain) for when the outer run is done.
                state.locked { state in state.modes[modeIndex].timers.insert(entry) }
                floorRestored = false
                continue
            case .skip:
                floorRestored = false
            }
            entry.release()
        }
        if !floorRestored { state.locked { state in state.modes[modeIndex].firing = outerFiring } }
        context.scratch.dueTimers.removeAll(keepingCapacity: true)
    }

    /// What a mode's firing timer is once the batch's entry at `index` fires: that entry, with the
    /// one after it (or what counted before the batch) to count if it leaves the mode; past the
    /// batch's end, what counted before it.
    @inline(__always)
    static func firing(at index: Int, of batch: ContiguousArray<TimerEntry>, outer: FiringTimer) -> FiringTimer {
        guard index < batch.count else { return outer }
        // The next live entry: a stale one (a timer moved, removed or invalidated since it was
        // collected) no longer stands for its old date.
        var next = index + 1
        while next < batch.count && !batch[next].isLive { next += 1 }
        let followingNs = next < batch.count ? batch[next].fireNs : outer.countedNs
        let timer = batch[index].timer
        return FiringTimer(
            fireNs: batch[index].fireNs, timer: ObjectIdentifier(timer), firingTimer: .passUnretained(timer), followingNs: followingNs)
    }

    /// Drops the entries that were stale when the batch was taken (a timer moved, removed or
    /// invalidated since), so that a later stale entry means "moved by this batch's handlers".
    /// Each timer then appears at most once: only one of its entries has its generation.
    private func keepLiveEntries(_ batch: inout ContiguousArray<TimerEntry>) {
        let count = batch.count
        let lookahead = 8
        var index = 0
        while index < min(lookahead, count) {
            batch[index].prefetchTimer()
            index += 1
        }
        var kept = 0
        index = 0
        while index < count {
            if index + lookahead < count { batch[index + lookahead].prefetchTimer() }
            let entry = batch[index]
            index += 1
            if entry.isLive {
                batch[kept] = entry
                kept += 1
            } else {
                entry.release()
            }
        }
        batch.removeLast(count - kept)
    }

    /// What to do with one timer of a batch.
    private enum FireDecision {
        case fire(RunLoopTimer.Handler, firedAt: Int64)
        case firingInOuterRun
        case skip
    }

    /// Marks the timer firing if it may fire now. A live entry (the timer unchanged since it was
    /// scheduled) needs no lock: its mark tells it apart. A timer moved by an earlier handler of
    /// this batch fires if, under its lock, it is still valid, on this loop and due.
    @inline(__always)
    private func prepareToFire(_ timer: RunLoopTimer, _ entry: TimerEntry) -> FireDecision {
        let stamp = timer.markFiring()
        if stamp == entry.generation, let handler = timer.handlerWhileFiring {
            return .fire(handler, firedAt: entry.fireNs)
        }
        if stamp & 1 != 0 {
            // Already firing, in a run further out; the mark is theirs.
            return stamp & ~1 == entry.generation ? .firingInOuterRun : .skip
        }
        let decision = timer.state.locked { timerState -> FireDecision in
            guard timerState.valid, timerState.loop === self, timerState.fireNs <= LoopClock.now(),
                let handler = timer.handlerWhileFiring
            else { return .skip }
            return .fire(handler, firedAt: timerState.fireNs)
        }
        if case .skip = decision { timer.finishFiring() }
        return decision
    }

    /// Invalidates a one-shot timer after its handler, as `invalidate()` would, in one locked step
    /// (invalid, new generation, out of every mode), and lets go of its handler.
    /// The items version is bumped only if a mode lost its last timer: a run's cached timer count
    /// may stay high otherwise (it only guards a look at the heap), and not re-reading every item
    /// list after each fired timer saves a lock and a copy per pass.
    private func retireOneShot(_ timer: RunLoopTimer, modeIndex: Int, following: FiringTimer) {
        let (handler, otherLoop) = withState { state -> (HeldHandler, RunLoop?) in
            state.modes[modeIndex].firing = following
            let (handler, otherLoop, emptied) = timer.state.locked { timerState -> (HeldHandler, RunLoop?, Bool) in
                // Invalidated while it fired: its handler is this thread's to let go.
                guard timerState.valid else { return (timer.takeHandler(), nil, false) }
                timerState.valid = false
                timer.bumpGeneration()
                let handler = timer.takeHandler()
                guard timerState.loop === self else { return (handler, timerState.loop?.loop, false) }
                return (handler, nil, state.detach(timer, &timerState))
            }
            if emptied { itemsVersion.store(itemsVersion.load(ordering: .relaxed) &+ 1, ordering: .releasing) }
            return (handler, otherLoop)
        }
        // Added to another loop by its own handler: that loop unschedules it under its lock.
        otherLoop?.detach(timer)
        withExtendedLifetime(handler) {}
    }

    /// Moves a repeating timer to the first point of its schedule after now, keeping its phase
    /// (`firedAt + k·interval`), unless its handler set a later fire date (kept) or invalidated
    /// it. Changes to its tolerance or modes do not count as a new date, and a timer the handler
    /// took out of every mode moves on all the same, as in CoreFoundation.
    private func rescheduleAfterFire(_ timer: RunLoopTimer, firedAt: Int64, modeIndex: Int, following: FiringTimer) {
        var invalidated = false
        var movedTo: (loop: RunLoop, fireNs: Int64)? = nil
        withState { state in
            state.modes[modeIndex].firing = following
            timer.state.locked { timerState in
                guard timerState.valid else {
                    invalidated = true
                    return
                }
                guard timerState.fireNs <= firedAt else { return }
                let next = Self.nextFireNs(after: firedAt, interval: timer.intervalNs, now: LoopClock.now())
                if let other = timerState.loop, !(timerState.loop === self) {
                    // Its handler moved it to another loop, whose lock guards its date: set there.
                    movedTo = (other.loop, next)
                    return
                }
                timerState.setFire(next)
                if timerState.loop === self { _ = state.repush(timer, timerState) }
            }
        }
        // Invalidated while it fired: its handler is this thread's to let go (with no lock held).
        if invalidated { timer.releaseHandlerIfInvalid() }
        // Set as `fireDate` is (re-armed there); if it left that loop meanwhile, it is on no loop's
        // schedule and keeps the date it has.
        if let movedTo { _ = movedTo.loop.reschedule(timer, fire: (movedTo.fireNs, movedTo.fireNs), toleranceNs: nil) }
    }

    /// The first point of the schedule `firedAt + k·interval` (k ≥ 1) after `now`; saturates to
    /// `LoopClock.never` for schedules beyond the clock's range.
    static func nextFireNs(after firedAt: Int64, interval: Int64, now: Int64) -> Int64 {
        let next = firedAt.addingSaturated(interval)
        guard next <= now, interval > 0 else { return next }
        let missed = now.subtractingSaturated(firedAt) / interval
        let (points, overflowCount) = missed.addingReportingOverflow(1)
        let (step, overflowStep) = points.multipliedReportingOverflow(by: interval)
        return overflowCount || overflowStep ? LoopClock.never : firedAt.addingSaturated(step)
    }
}
