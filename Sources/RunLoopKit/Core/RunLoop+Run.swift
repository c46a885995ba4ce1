import CRunLoopKit
import DequeModule
import Glibc
import SystemPackage

// The run algorithm, in one place. It follows CoreFoundation's __CFRunLoopRun (the pseudo-code
// of the iOS RunLoop articles); each phase is a function below, and each publishes its name for
// the instrumentation seam (enterPhase).
//
//     run(mode):
//         mode is .common or empty            -> return .finished (no observers)
//         doObservers(entry)
//         repeat:                                                  // beginPass: generation += 1
//             doObservers(beforeTimers); doObservers(beforeSources)
//             doBlocks()
//             handled = doSources0(); if handled { doBlocks() }
//             poll = handled || timeout == 0
//             if dispatchPortIsReady() {            // the main loop: main queue ready, not served
//                 handled1 = serveDispatchPort()    //   last pass -> served now, no sleep announced
//             } else {                              // sleepAndWake:
//                 if !poll { doObservers(beforeWaiting) }
//                 wait(poll)                   // EpollBackend.wait: eventfd, timerfd, fd sources
//                                              // (not with the mode emptied: see `handedOverWorkPending`)
//                 if !poll { doObservers(afterWaiting) }
//                 doTimers()                        // due timers, by fire date
//                 handled1 = doSources1()           // descriptors, ports, the main queue
//             }
//             doBlocks()
//             reportPass()                      // only while an iteration reporter listens
//             exit: (handled || handled1) && returnAfterSourceHandled -> .handledSource
//                   timeout passed -> .timedOut; stop() -> .stopped; mode empty -> .finished
//         doObservers(exit)
//
// Who may call what, and the locks and the wake protocol behind it, are in RunLoop.swift.

extension RunLoop {
    /// Runs the loop once in `mode` until the timeout passes, ``stop()`` is called, the mode has
    /// nothing left to do, or (with `returnAfterSourceHandled`) a source was handled
    /// (`CFRunLoopRunInMode`).
    ///
    /// Running in ``Mode/common``, or in a mode with no sources, timers or pending blocks, returns
    /// ``RunResult/finished`` at once without calling observers. A negative timeout counts as zero:
    /// the loop makes one pass without sleeping. Runs nest: a callback may run the loop again, in
    /// any mode.
    ///
    /// - Precondition: Called on the loop's own thread.
    @discardableResult
    public func run(mode: Mode = .default, for timeout: Duration, returnAfterSourceHandled: Bool = false) -> RunResult {
        preconditionOnOwnThread("run(mode:for:returnAfterSourceHandled:)")
        if mode == .common {
            warnCommonRunOnce()
            return .finished
        }
        openKernelDescriptors()
        let start = LoopClock.now()
        let timeoutNs = timeout.saturatedNanoseconds
        let deadline = timeoutNs <= 0 ? start : start.addingSaturated(timeoutNs)
        // Found, never made (as CFRunLoopRunInMode): perform makes the modes of its blocks.
        guard let modeIndex = indexIfHasWork(mode) else {
            noteEmptyModeRun(mode)
            return .finished
        }
        state.locked { $0.runningModes.append(modeIndex) }
        takeOverOuterTimerBatch(modeIndex)

        var context = beginRun(
            mode: mode, modeIndex: modeIndex, deadline: deadline, pollOnly: timeoutNs <= 0,
            returnAfterSourceHandled: returnAfterSourceHandled)
        if _slowPath(context.pass.tracing) { traceRunBegin(&context) }
        doObservers(.entry, &context)
        let result = runPasses(&context)
        doObservers(.exit, &context)
        if _slowPath(context.pass.tracing) { traceRunEnd(result, &context) }
        endRun(&context)
        return result
    }

    /// Runs in ``Mode/default`` until ``stop()`` is called or the mode has nothing left to do
    /// (`CFRunLoopRun`).
    ///
    /// - Precondition: Called on the loop's own thread.
    public func run() {
        while true {
            let result = run(mode: .default, for: .seconds(1e10))
            if result == .stopped || result == .finished { return }
        }
    }

    /// Runs in ``Mode/default`` until `deadline` (NSRunLoop's `runUntilDate:`): repeats
    /// ``run(mode:before:)-(_,ContinuousClock.Instant)``, so ``stop()`` ends only the current pass, not the whole call; it returns
    /// early only when the mode has nothing to do. A deadline in the past makes one pass.
    ///
    /// ```swift
    /// loop.run(until: .now + .seconds(2))
    /// ```
    ///
    /// - Precondition: Called on the loop's own thread.
    public func run(until deadline: ContinuousClock.Instant) {
        repeat {
            if !runOnce(mode: .default, for: Self.timeout(until: deadline)) { break }
        } while Self.timeout(until: deadline) > .zero
    }

    /// Runs once in `mode` until `deadline` or until a source is handled (NSRunLoop's
    /// `runMode:beforeDate:`). Returns false without running if the mode has nothing to do (or is
    /// ``Mode/common``), true otherwise.
    ///
    /// - Precondition: Called on the loop's own thread.
    @discardableResult
    public func run(mode: Mode, before deadline: ContinuousClock.Instant) -> Bool {
        runOnce(mode: mode, for: Self.timeout(until: deadline))
    }

    /// Runs once in `mode` until `deadline` or until a source is handled (NSRunLoop's
    /// `acceptInputForMode:beforeDate:`).
    ///
    /// - Precondition: Called on the loop's own thread.
    public func acceptInput(mode: Mode, before deadline: ContinuousClock.Instant) {
        acceptInputOnce(mode: mode, for: Self.timeout(until: deadline))
    }

    /// Fires the mode's due timers and returns when the next one is due: NSRunLoop's
    /// `limitDateForMode:`, which an application's own event loop calls to learn how long it may
    /// block before it must run the loop again.
    ///
    /// As Foundation does, it first runs the loop once in `mode` without sleeping (observers see
    /// `entry` ... `exit`; due timers, pending blocks, signalled sources and ready descriptors are
    /// handled). Then it returns nil if the mode has nothing left to do (no sources, timers or
    /// blocks; also for ``Mode/common``), ``distantFuture`` if it has work but no timer, and the
    /// earliest timer's fire date otherwise.
    ///
    /// <!-- snippet: prelude
    /// var running = true
    /// func waitForMyOwnEvents(until deadline: ContinuousClock.Instant) {}
    /// -->
    /// ```swift
    /// while running {
    ///     guard let next = loop.limitDate(forMode: .default) else { break }
    ///     waitForMyOwnEvents(until: next)
    /// }
    /// ```
    ///
    /// - Precondition: Called on the loop's own thread (Foundation returns nil elsewhere; it runs
    ///   the loop, which only its thread may do).
    public func limitDate(forMode mode: Mode) -> ContinuousClock.Instant? {
        preconditionOnOwnThread("limitDate(forMode:)")
        run(mode: mode, for: .seconds(-10), returnAfterSourceHandled: true)
        guard mode != .common, indexIfHasWork(mode) != nil else { return nil }
        return nextTimerFireDate(forMode: mode) ?? Self.distantFuture
    }

    /// An instant no deadline reaches: what ``limitDate(forMode:)`` returns for a mode with work
    /// but no timer (Foundation's `Date.distantFuture`), and a deadline for a run with no limit,
    /// as in a keep-alive thread's `while !stopped { loop.run(mode: .default, before: RunLoop.distantFuture) }`.
    public static let distantFuture: ContinuousClock.Instant = LoopClock.instant(LoopClock.never)

    /// The time from now until `deadline`; negative once it has passed (a run then makes one pass
    /// without sleeping).
    static func timeout(until deadline: ContinuousClock.Instant) -> Duration {
        .nanoseconds(LoopClock.nanoseconds(deadline).subtractingSaturated(LoopClock.now()))
    }

    /// `runMode:beforeDate:` for a timeout: the one implementation behind both deadline types.
    func runOnce(mode: Mode, for timeout: Duration) -> Bool {
        preconditionOnOwnThread("run(mode:before:)")
        if mode == .common {
            warnCommonRunOnce()
            return false
        }
        guard indexIfHasWork(mode) != nil else {
            noteEmptyModeRun(mode)
            return false
        }
        run(mode: mode, for: timeout, returnAfterSourceHandled: true)
        return true
    }

    /// `acceptInputForMode:beforeDate:` for a timeout.
    func acceptInputOnce(mode: Mode, for timeout: Duration) {
        preconditionOnOwnThread("acceptInput(mode:before:)")
        run(mode: mode, for: timeout, returnAfterSourceHandled: true)
    }

    // MARK: The passes

    private func runPasses(_ context: inout RunContext) -> RunResult {
        if consumeStop(context) { return .stopped }
        while true {
            beginPass(&context)
            doObservers(.beforeTimers, &context)
            doObservers(.beforeSources, &context)
            doBlocks(&context)
            let sourceHandled = doSources0(&context)
            if sourceHandled { doBlocks(&context) }

            let poll = sourceHandled || context.pollOnly
            let source1Handled: Bool
            if dispatchPortIsReady(&context) {
                // CoreFoundation's `goto handle_msg`: the main queue is served at once; no sleep is
                // announced (no beforeWaiting, no afterWaiting), and timers wait for the next pass.
                // wakeUp() is ignored from here to the next pass, as after a wait (handle_msg sets
                // CF's ignore-wakeups flag on this path too): this pass has no wait to consume one.
                wake.stopAccepting()
                source1Handled = serveDispatchPort(&context)
            } else {
                sleepAndWake(&context, poll: poll)
                doTimers(&context)
                source1Handled = doSources1(&context)
            }
            doBlocks(&context)
            if context.pass.flags & LoopInstrumentation.reportIterations != 0 { reportPass(&context) }

            if (sourceHandled || source1Handled) && context.returnAfterSourceHandled { return .handledSource }
            if context.deadline != LoopClock.never, LoopClock.now() >= context.deadline { return .timedOut }
            if consumeStop(context) { return .stopped }
            if isModeEmpty(&context) { return .finished }
        }
    }

    // MARK: Phases

    /// Calls the mode's observers for `activity`, in order, skipping any that are already running
    /// (an observer is never re-entered by a nested run).
    private func doObservers(_ activity: Activity, _ context: inout RunContext) {
        refreshItems(&context)
        guard context.items.observerMask & activity.rawValue != 0 else { return }
        enterPhase(.observers, &context)
        let observers = context.items.observers
        // Index loops over the retained snapshot: no iterator, so nothing to allocate even in
        // unoptimized builds.
        var index = 0
        while index < observers.count {
            let observer = observers[index]
            index += 1
            guard observer.activities.contains(activity), observer.isValid,
                !observer.firing.exchange(true, ordering: .acquiring)
            else { continue }
            if _slowPath(context.pass.tracing) {
                traceCalloutBegin(observer, .observers, detail: UInt8(activity.rawValue.trailingZeroBitCount), &context)
            }
            calloutBegins(.observer, label: observer.traceNameSlot.calloutLabel.load(ordering: .relaxed))
            observer.handler(observer, activity)
            calloutEnds()
            if _slowPath(context.pass.tracing) { traceCalloutEnd(&context) }
            observer.firing.store(false, ordering: .releasing)
            if !observer.repeats { observer.invalidate() }
        }
    }

    /// CoreFoundation's step before announcing a sleep: on the main loop, in a mode that serves
    /// the main queue, libdispatch's main-queue port is checked without waiting, unless the main
    /// queue was served in the pass before (`didDispatchPortLastTime`; a run's first pass does not
    /// check either). Work queued on the main queue during a pass (by a timer, a source, a block)
    /// is then served at the next pass without a sleep that observers would see.
    @inline(__always)
    private func dispatchPortIsReady(_ context: inout RunContext) -> Bool {
        guard _slowPath(context.items.dispatchPort != nil) else { return false }
        let servedLastPass = context.servedDispatchPortLastPass
        context.servedDispatchPortLastPass = false
        guard !servedLastPass, let port = context.items.dispatchPort else { return false }
        return Poll.isReadable(port.descriptor)
    }

    /// Serves the main queue's port found ready before sleeping, as a version-1 source of the pass.
    private func serveDispatchPort(_ context: inout RunContext) -> Bool {
        guard let port = context.items.dispatchPort else { return false }
        enterPhase(.sources1, &context)
        context.scratch.readySources1.append((port, .readable))
        return performReadySources1(&context)
    }

    /// Announces the sleep, waits (or only polls), and announces the wake: the middle of a pass.
    private func sleepAndWake(_ context: inout RunContext, poll: Bool) {
        if !poll { doObservers(.beforeWaiting, &context) }
        wait(&context, poll: poll)
        wake.stopAccepting()
        // A phase watch that began while the loop slept stamps the rest of this pass (a
        // monitor needs the wake's time; one sleep may have lasted since before it watched).
        if _slowPath(context.pass.flags == 0) {
            context.pass.flags = instrumentation.flags.load(ordering: .relaxed) & LoopInstrumentation.stampPhases
        }
        // A trace needs the wake reason only for a pass that slept (a poll records no sleep).
        if context.pass.flags & LoopInstrumentation.reportIterations != 0 || (context.pass.tracing && !poll) {
            noteWakeReason(poll, &context)
            if context.pass.tracing { traceWake(&context) }
        }
        if !poll { doObservers(.afterWaiting, &context) }
    }

    /// Runs the blocks queued for this mode, first in, first out. Blocks queued meanwhile wait for
    /// the next pass; blocks for other modes stay queued, in order.
    private func doBlocks(_ context: inout RunContext) {
        let hasOlder = !confined.blocks.isEmpty
        let batch = inbox.exchange(&context.scratch.spareBatch)
        guard hasOlder || batch != nil else { return }
        enterPhase(.blocks, &context)
        refreshItems(&context)
        let modeIsCommon = context.items.modeIsCommon
        if hasOlder {
            // Blocks kept from earlier passes (for other modes) are older than the inbox's.
            swap(&confined.blocks, &context.scratch.blocks)
            while let block = context.scratch.blocks.popFirst() {
                if block.runs(in: context.mode, modeIsCommon: modeIsCommon) {
                    if _slowPath(context.pass.tracing) { traceBlockBegin(&context) }
                    calloutBegins(.block, label: 0)
                    block.body()
                    calloutEnds()
                    if _slowPath(context.pass.tracing) { traceCalloutEnd(&context) }
                } else {
                    context.scratch.otherModes.append(block)
                }
            }
        }
        if let batch {
            while let block = batch.popFirst() {
                if block.runs(in: context.mode, modeIsCommon: modeIsCommon) {
                    if _slowPath(context.pass.tracing) { traceBlockBegin(&context) }
                    calloutBegins(.block, label: 0)
                    block.body()
                    calloutEnds()
                    if _slowPath(context.pass.tracing) { traceCalloutEnd(&context) }
                } else {
                    context.scratch.otherModes.append(block)
                }
            }
            context.scratch.spareBatch = batch
        }
        if !context.scratch.otherModes.isEmpty {
            // Ahead of anything a nested run moved there meanwhile: they are older.
            confined.blocks.prepend(contentsOf: context.scratch.otherModes)
            context.scratch.otherModes.removeAll(keepingCapacity: true)
        }
    }

    /// Moves the blocks other threads performed into the loop's own queue, in order.
    @inline(__always)
    private func drainInbox() {
        inbox.takeAll(appendingTo: &confined.blocks, spare: &confined.spareInboxBuffer)
    }

    /// The index of `mode` if a run in it has something to do (sources, timers or pending blocks
    /// for it; observers do not count); nil for an empty mode or one never made (modes are found,
    /// never made, by a run, as `CFRunLoopRunInMode` does). Loop thread only.
    private func indexIfHasWork(_ mode: Mode) -> Int? {
        let (index, noItems, modeIsCommon) = state.locked { state -> (Int?, Bool, Bool) in
            guard let index = state.modeIndex[mode] else { return (nil, true, false) }
            return (index, state.hasNoItems(index), state.isCommon(mode))
        }
        guard let index else { return nil }
        return noItems && !hasBlocks(for: mode, modeIsCommon: modeIsCommon) ? nil : index
    }

    private func hasBlocks(for mode: Mode, modeIsCommon: Bool) -> Bool {
        drainInbox()
        return confined.blocks.contains { $0.runs(in: mode, modeIsCommon: modeIsCommon) }
    }

    /// Performs the signalled version-0 sources of the mode; returns whether any was performed.
    /// As CoreFoundation, it first collects the signalled sources, then performs them in ascending
    /// order, equal orders by signal time: a source signalled by a callback of this pass waits for
    /// the next pass. With `returnAfterSourceHandled`, stops after the first.
    private func doSources0(_ context: inout RunContext) -> Bool {
        refreshItems(&context)
        let sources = context.items.sources
        var index = 0
        while index < sources.count {
            let source = sources[index]
            index += 1
            let stamp = source.signalStamp.load(ordering: .relaxed)
            // Unretained: `sources` holds them for the whole pass.
            if stamp != 0 { context.scratch.signalled.append((Unmanaged.passUnretained(source), stamp)) }
        }
        guard !context.scratch.signalled.isEmpty else { return false }
        enterPhase(.sources0, &context)
        sortBySignalTime(&context.scratch.signalled)
        var handled = false
        index = 0
        while index < context.scratch.signalled.count {
            let source = context.scratch.signalled[index].source.takeUnretainedValue()
            index += 1
            if source.signalStamp.exchange(0, ordering: .acquiring) != 0, source.isValid {
                if _slowPath(context.pass.tracing) { traceCalloutBegin(source, .sources0, &context) }
                calloutBegins(.source, label: source.traceNameSlot.calloutLabel.load(ordering: .relaxed))
                source.performCallout()
                calloutEnds()
                if _slowPath(context.pass.tracing) { traceCalloutEnd(&context) }
                handled = true
                if context.returnAfterSourceHandled { break }
            }
        }
        context.scratch.signalled.removeAll(keepingCapacity: true)
        return handled
    }

    /// Orders collected sources by (order, signal time). They come sorted by order, so this only
    /// reorders runs of equal orders: an insertion sort, which allocates nothing.
    private func sortBySignalTime(_ list: inout ContiguousArray<(source: Unmanaged<RunLoopSource>, stamp: UInt64)>) {
        guard list.count > 1 else { return }
        var end = 1
        while end < list.count {
            let moving = list[end]
            let order = moving.source.takeUnretainedValue().order
            var position = end
            while position > 0, list[position - 1].source.takeUnretainedValue().order == order,
                list[position - 1].stamp > moving.stamp
            {
                list[position] = list[position - 1]
                position -= 1
            }
            list[position] = moving
            end += 1
        }
    }

    /// Fires the mode's due timers in order of fire date (then insertion), as CoreFoundation's
    /// `__CFRunLoopDoTimers`: the timers due now are collected first, then each fires if, at its
    /// turn, it is still valid, on this loop, not already firing, and due (an earlier handler of
    /// the batch may have moved or invalidated it). A repeating timer then moves to the first point
    /// of its schedule after now, unless its handler set a later fire date; a one-shot timer is
    /// invalidated.
    private func doTimers(_ context: inout RunContext) {
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
    private func takeOverOuterTimerBatch(_ modeIndex: Int) {
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
        let outerFiring = state.locked { state -> Int64 in
            while let entry = state.modes[modeIndex].timers.popEarliest(dueBy: now) {
                context.scratch.dueTimers.append(entry)
            }
            let outer = state.modes[modeIndex].firingFireNs
            // From now until it is rescheduled, the first timer to fire counts for
            // nextTimerFireDate (it left the heap).
            // An index loop: `first(where:)`, unspecialized in debug builds, allocates.
            var index = 0
            while index < context.scratch.dueTimers.count {
                if context.scratch.dueTimers[index].isLive {
                    state.modes[modeIndex].firingFireNs = context.scratch.dueTimers[index].fireNs
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
            let following = index < due ? context.scratch.dueTimers[index].fireNs : outerFiring
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
                if timer.intervalNs == 0 {
                    retireOneShot(timer, modeIndex: modeIndex, following: following)
                } else {
                    rescheduleAfterFire(timer, firedAt: firedAt, modeIndex: modeIndex, following: following)
                }
                floorRestored = following == outerFiring
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
        if !floorRestored { state.locked { state in state.modes[modeIndex].firingFireNs = outerFiring } }
        context.scratch.dueTimers.removeAll(keepingCapacity: true)
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
    private func retireOneShot(_ timer: RunLoopTimer, modeIndex: Int, following: Int64) {
        let (handler, otherLoop) = withState { state -> (HeldHandler, RunLoop?) in
            state.modes[modeIndex].firingFireNs = following
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
    private func rescheduleAfterFire(_ timer: RunLoopTimer, firedAt: Int64, modeIndex: Int, following: Int64) {
        var invalidated = false
        var movedTo: (loop: RunLoop, fireNs: Int64)? = nil
        withState { state in
            state.modes[modeIndex].firingFireNs = following
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

    /// Handles the version-1 sources that are ready: descriptor sources the last wait reported,
    /// and sources that asked for attention (message ports with messages, descriptors found
    /// closed), in ascending order (equal orders: oldest source first). With
    /// `returnAfterSourceHandled`, handles one callout (CoreFoundation handles the one port that
    /// woke it). Returns whether a callout ran.
    private func doSources1(_ context: inout RunContext) -> Bool {
        var attention =
            source1Attention.load(ordering: .relaxed) && source1Attention.exchange(false, ordering: .acquiring)
        if attention { context.tookAttention = true }
        if !context.sources1Scanned {
            context.sources1Scanned = true
            attention = true
        }
        guard !context.scratch.kernelEvents.isEmpty || attention else { return false }
        enterPhase(.sources1, &context)
        refreshItems(&context)
        if !context.scratch.kernelEvents.isEmpty {
            let unknownTag = state.locked { state -> Bool in
                let mode = state.modes[context.modeIndex]
                var unknownTag = false
                for ready in context.scratch.kernelEvents {
                    guard let number = mode.descriptorNumbers[ready.tag], let watch = mode.descriptors[number] else {
                        // A registration the mode could not delete (see remakeInterestSet).
                        unknownTag = true
                        continue
                    }
                    let reported = FileDescriptorSource.Events(rawValue: ready.events.rawValue)
                    for source in watch.sources {
                        // Each source hears what it watches, and hang-ups and errors.
                        let mine = reported.intersection(source.watchedEvents.union([.hangUp, .error]))
                        if !mine.isEmpty { context.scratch.readySources1.append((source, mine)) }
                    }
                }
                return unknownTag
            }
            if unknownTag { mutatingItems { state in state.modes[context.modeIndex].interestSetStale = true } }
            context.scratch.kernelEvents.removeAll(keepingCapacity: true)
        }
        if attention {
            for item in context.items.sources1 where item.needsAttention {
                if !context.scratch.readySources1.contains(where: { $0.item === item }) {
                    context.scratch.readySources1.append((item, []))
                }
            }
        }
        sortByOrder(&context.scratch.readySources1)
        return performReadySources1(&context)
    }

    /// Calls out to the ready version-1 sources, in order (one only, for a run that returns after
    /// a handled source); those left over are looked at again next pass.
    private func performReadySources1(_ context: inout RunContext) -> Bool {
        var handled = false
        var index = 0
        while index < context.scratch.readySources1.count {
            let (item, events) = context.scratch.readySources1[index]
            index += 1
            if _slowPath(context.pass.tracing) { traceCalloutBegin(item, .sources1, &context) }
            calloutBegins(item.calloutKind, label: item.calloutLabel)
            let performed = item.perform(events: events, onlyOne: context.returnAfterSourceHandled, on: self)
            calloutEnds()
            if _slowPath(context.pass.tracing) { traceCalloutEnd(&context) }
            if _slowPath(context.items.dispatchPort != nil) && item === context.items.dispatchPort && !events.isEmpty {
                context.servedDispatchPortLastPass = true
            }
            if performed {
                handled = true
                if context.returnAfterSourceHandled { break }
            }
        }
        if index < context.scratch.readySources1.count {
            // Left for the next pass: descriptors are reported again (level-triggered); the rest
            // must be looked at again.
            source1Attention.store(true, ordering: .sequentiallyConsistent)
        }
        context.scratch.readySources1.removeAll(keepingCapacity: true)
        return handled
    }

    /// Insertion sort by (order, id): the list is short (one wait's events at most, plus the
    /// sources that asked for attention), and this allocates nothing.
    private func sortByOrder(_ ready: inout ContiguousArray<(item: any Source1Item, events: FileDescriptorSource.Events)>) {
        guard ready.count > 1 else { return }
        for end in 1..<ready.count {
            let moving = ready[end]
            var position = end
            while position > 0,
                (ready[position - 1].item.order, ready[position - 1].item.id) > (moving.item.order, moving.item.id)
            {
                ready[position] = ready[position - 1]
                position -= 1
            }
            ready[position] = moving
        }
    }

    /// Sleeps until a wakeup, the mode's next timer (within its tolerance) or the run's deadline;
    /// a poll only asks the kernel which descriptors are ready. What woke the loop is left for the
    /// phases that follow: descriptor events in the run's scratch, a wakeup consumed.
    private func wait(_ context: inout RunContext, poll: Bool) {
        prepareToWait(&context)
        if _slowPath(confined.virtualTime != nil) { return waitOnVirtualTime(&context, poll: poll) }
        guard let backend else { return waitWithoutDescriptors(&context, poll: poll) }
        if poll || sources1Pending(context) {
            _ = wake.takeRequest()
            askKernel(&context, backend)
            return
        }
        enterPhase(.waiting, &context)
        if _slowPath(context.pass.tracing) { traceSleepBegin(&context) }
        // After a wakeup from another thread more work usually follows within microseconds:
        // watch for it briefly before paying for a sleep and a wakeup (see spinForWakeUp).
        if !context.items.hasDescriptors && confined.recentCrossThreadWakeUp && spinForWakeUp() {
            _ = wake.takeRequest()
            return
        }
        wake.announceSleep()
        if wake.skipsSleep(handedOver: { handedOverWorkPending(context) }) {
            confined.recentCrossThreadWakeUp = true
            askKernel(&context, backend)
            return
        }
        switch planSleep(context) {
        case .none:
            wake.endSleep()
            askKernel(&context, backend)
        case .spin(let until):
            wake.endSleep()
            spinUntilTimer(until, &context, backend)
        case .kernel:
            let set = context.items.interestSet ?? backend.baseSet
            var outcome = backend.wait(in: set, blocking: true, into: &context.scratch.kernelEvents)
            while wake.isStale(
                wokenByEventfd: outcome.wokenByAnotherThread,
                foundOtherWork: outcome.timerExpired || !context.scratch.kernelEvents.isEmpty,
                attention: { source1Attention.load(ordering: .sequentiallyConsistent) })
            {
                outcome = backend.wait(in: set, blocking: true, into: &context.scratch.kernelEvents)
            }
            wake.endSleep()
            confined.recentCrossThreadWakeUp = takeWaitOutcome(outcome)
        }
    }

    /// Whether the loop has input its next pass would handle, so that it would not sleep now: a
    /// wakeup requested (``wakeUp()``, a block or message from another thread), a port message,
    /// a timer of the current mode that is due, or a ready descriptor of the current mode (asked
    /// of the kernel without taking it). What idle-time work checks between tasks to yield at
    /// once to real input (see `RunLoopScheduling`'s `IdleDeadline`).
    ///
    /// Meaningful on the loop's own thread while it runs; false elsewhere.
    ///
    /// - Complexity: O(1) and no system call when the mode watches no descriptor; otherwise one
    ///   non-blocking `epoll_wait`.
    public var hasPendingInput: Bool {
        guard isCurrent else { return false }
        if wake.hasRequest || source1Attention.load(ordering: .relaxed) { return true }
        let (timerDeadline, set) = state.locked { state -> (Int64, EpollBackend.InterestSet?) in
            guard let index = state.runningModes.last else { return (LoopClock.never, nil) }
            let mode = state.modes[index]
            return (mode.timers.coalescedDeadline(), mode.descriptors.isEmpty ? nil : mode.interestSet)
        }
        if timerDeadline != LoopClock.never && timerDeadline <= LoopClock.now() { return true }
        guard let set, let backend else { return false }
        return backend.hasReadyDescriptor(in: set)
    }

    /// Brings the kernel side up to date before a wait: the loop's descriptors opened if it lacks
    /// them, the mode's interest set made (or made anew), and the item lists re-read (observers
    /// just called may have changed them; a nested run may even have made this mode's set anew).
    private func prepareToWait(_ context: inout RunContext) {
        if !hasKernelDescriptors { openKernelDescriptors() }
        refreshItems(&context)
        if context.items.needsInterestSet {
            // Its descriptor sources joined while its set could not be made: try again.
            mutatingItems { state in _ = interestSet(context.modeIndex, &state) }
            refreshItems(&context)
        } else if context.items.interestSetStale {
            mutatingItems { state in remakeInterestSet(context.modeIndex, &state) }
            refreshItems(&context)
        }
    }

    /// Whether a version-1 source has work that no descriptor shows (a port's messages, possibly
    /// sent while the loop ran in another mode): it keeps the loop awake, as a Mach port with a
    /// message does in CoreFoundation.
    @inline(__always)
    private func sources1Pending(_ context: RunContext) -> Bool {
        source1Attention.load(ordering: .sequentiallyConsistent)
            || (!context.sources1Scanned && context.items.sources1.contains { $0.needsAttention })
    }

    /// How the loop waits once it has announced its sleep: not at all (the deadline passed), in
    /// the kernel with the timerfd armed for the deadline, or on the CPU until a timer is due.
    private func planSleep(_ context: RunContext) -> SleepPlan {
        let spinWindow = timerSpinNs.load(ordering: .relaxed)
        return withState { state -> SleepPlan in
            let timerDeadline = state.modes[context.modeIndex].timers.coalescedDeadline()
            var deadline = min(timerDeadline, context.deadline)
            let now = LoopClock.now()
            guard deadline > now else { return .none }
            if context.items.needsInterestSet {
                deadline = min(deadline, now.addingSaturated(LoopThreadState.descriptorRetryNanoseconds))
            }
            if spinWindow > 0 && timerDeadline <= context.deadline {
                // A timer ends this sleep: wake `spinWindow` early and spin the rest.
                let early = timerDeadline.subtractingSaturated(spinWindow)
                if early <= now { return .spin(until: timerDeadline) }
                deadline = early
            }
            if deadline != state.armedDeadline { arm(&state, deadline) }
            return .kernel
        }
    }

    /// The wait of a loop that could not open its kernel descriptors: on a futex, until a wakeup,
    /// the next timer, the run's deadline, or the next attempt to open them.
    private func waitWithoutDescriptors(_ context: inout RunContext, poll: Bool) {
        if poll || sources1Pending(context) {
            _ = wake.takeRequest()
            return
        }
        enterPhase(.waiting, &context)
        if _slowPath(context.pass.tracing) { traceSleepBegin(&context) }
        sleepsOnFutex.store(true, ordering: .sequentiallyConsistent)
        wake.announceSleep()
        if wake.skipsSleep(handedOver: { handedOverWorkPending(context) }) { return }
        defer { wake.endSleep() }
        let deadline = state.locked { state in
            min(state.modes[context.modeIndex].timers.coalescedDeadline(), context.deadline)
        }
        let now = LoopClock.now()
        guard deadline > now else { return }
        futex.wait(timeoutNs: min(deadline - now, LoopThreadState.descriptorRetryNanoseconds))
        _ = wake.takeRequest()
    }

    /// The wait of a loop on virtual time (VirtualTime.swift): it never blocks. Descriptors are
    /// polled (they work as usual); a sleep becomes a jump of the thread's clock to when it would
    /// have ended, the mode's next timer or the run's deadline, and the next pass runs at that
    /// instant. It ends the run instead when the driver asked for that
    /// (``VirtualTimeControl/stopWhenIdle``), when a pass limit is broken (here or in a nested
    /// run: every run ends, out to the driver), or when nothing but another thread could end the
    /// sleep.
    private func waitOnVirtualTime(_ context: inout RunContext, poll: Bool) {
        guard let control = confined.virtualTime else { return }
        if let broken = control.brokenLimit ?? control.countPass(at: LoopClock.now()) {
            // Every run ends, out to the driver; a run with a deadline gets there at once, so
            // that `run(until:)` and its kind stop repeating.
            control.record(broken, at: LoopClock.now())
            control.countUnwoundRun()
            if context.deadline != LoopClock.never { crlk_set_virtual_now(max(context.deadline, LoopClock.now())) }
            wake.stopRun(context.id)
            return
        }
        if poll || sources1Pending(context) {
            _ = wake.takeRequest()
            if let backend { askKernel(&context, backend) }
            return
        }
        enterPhase(.waiting, &context)
        if _slowPath(context.pass.tracing) { traceSleepBegin(&context) }
        let wokenUp = wake.takeRequest() || handedOverWorkPending(context)
        if let backend { askKernel(&context, backend) }
        if wokenUp || !context.scratch.kernelEvents.isEmpty { return }
        let now = LoopClock.now()
        let timerDeadline = withState { $0.modes[context.modeIndex].timers.coalescedDeadline() }
        if timerDeadline <= now { return }  // This pass fires it.
        if control.stopWhenIdle && confined.runDepth == 1 {
            control.record(.idle, at: now)
            wake.stopRun(context.id)
            return
        }
        let wakeAt = min(timerDeadline, context.deadline)
        guard wakeAt != LoopClock.never else {
            control.record(.sleepsForever, at: now)
            wake.stopRun(context.id)
            return
        }
        crlk_set_virtual_now(max(wakeAt, now))
    }

    /// Whether a pass in `mode` would have work now: blocks for it, a signalled version-0 source,
    /// a due timer, a ready descriptor or port, a wakeup asked for. What virtual time's driver
    /// asks after a run it ended where the loop would sleep: the rest of that pass (`afterWaiting`
    /// observers, and the blocks they perform) may have made more. Loop thread only.
    package func hasWorkOnVirtualTime(inMode mode: Mode) -> Bool {
        preconditionOnOwnThread("hasWorkOnVirtualTime(inMode:)")
        typealias Found = (
            sources: ContiguousArray<RunLoopSource>, timer: Int64, common: Bool, set: EpollBackend.InterestSet?
        )
        let found = state.locked { state -> Found? in
            guard let index = state.modeIndex[mode] else { return nil }
            let mode = state.modes[index]
            return (
                mode.sources, mode.timers.coalescedDeadline(), state.isCommon(mode.name),
                mode.descriptors.isEmpty ? nil : mode.interestSet
            )
        }
        guard let found else { return false }
        if found.timer <= LoopClock.now() || wake.hasRequest || source1Attention.load(ordering: .relaxed)
        {
            return true
        }
        if let set = found.set, let backend, backend.hasReadyDescriptor(in: set) { return true }
        if found.sources.contains(where: \.isSignalled) { return true }
        return hasBlocks(for: mode, modeIsCommon: found.common)
    }

    /// Asks the kernel, without blocking, which of the mode's descriptors are ready (nothing to
    /// ask when the mode watches none: timers are checked against the clock).
    private func askKernel(_ context: inout RunContext, _ backend: EpollBackend) {
        guard context.items.hasDescriptors, let set = context.items.interestSet else { return }
        _ = takeWaitOutcome(backend.wait(in: set, blocking: false, into: &context.scratch.kernelEvents))
    }

    /// Takes what a wait found besides descriptor events: a wakeup from another thread (the
    /// request consumed) and the timer's expiry (the timerfd is disarmed). Returns whether
    /// another thread woke the loop.
    private func takeWaitOutcome(_ outcome: EpollBackend.WaitOutcome) -> Bool {
        // An exchange, not a store: it synchronizes with the waker, so what it queued before
        // waking is seen by the phases that follow.
        if outcome.wokenByAnotherThread { _ = wake.takeRequest() }
        if outcome.timerExpired { state.locked { $0.armedDeadline = LoopClock.never } }
        return outcome.wokenByAnotherThread
    }

    /// Waits on the CPU until `deadline` (a timer's) or a wakeup request, whichever comes first
    /// (see ``RunLoop/timerSpinWindow``). `sleeping` is clear meanwhile, so wakers only set the
    /// request flag, which this watches; the mode's descriptors are asked about every few
    /// microseconds.
    private func spinUntilTimer(_ deadline: Int64, _ context: inout RunContext, _ backend: EpollBackend) {
        var spins = 0
        while true {
            if wake.hasRequest {
                // An exchange, not a store: it synchronizes with the waker (see wait).
                _ = wake.takeRequest()
                confined.recentCrossThreadWakeUp = true
                askKernel(&context, backend)
                return
            }
            crlk_cpu_relax()
            spins &+= 1
            if spins & 7 == 0, LoopClock.now() >= deadline {
                confined.recentCrossThreadWakeUp = false
                askKernel(&context, backend)
                return
            }
            if spins & 255 == 0 {
                askKernel(&context, backend)
                if !context.scratch.kernelEvents.isEmpty { return }
            }
        }
    }

    /// Spins for at most ``LoopThreadState/spinNanoseconds`` watching for a wakeup request;
    /// returns whether one came. Used only right after a wakeup from another thread, so an idle
    /// loop or a loop woken by its own timers never spins.
    private func spinForWakeUp() -> Bool {
        let limit = LoopClock.now() &+ LoopThreadState.spinNanoseconds
        var spins = 0
        while !wake.hasRequest {
            crlk_cpu_relax()
            spins &+= 1
            if spins & 31 == 0, LoopClock.now() >= limit {
                confined.recentCrossThreadWakeUp = false
                return false
            }
        }
        return true
    }

    // MARK: Run bookkeeping

    private func beginRun(
        mode: Mode, modeIndex: Int, deadline: Int64, pollOnly: Bool,
        returnAfterSourceHandled: Bool
    ) -> RunContext {
        confined.nextRunID += 1
        let id = confined.nextRunID
        let entry = wake.beginRun(id)
        let scratch = confined.spareScratch.popLast() ?? RunScratch()
        confined.runDepth += 1
        if confined.runDepth == 1 { pickUpTraceBuffer() }
        var context = RunContext(
            id: id, wakeEntry: entry, mode: mode, modeIndex: modeIndex, deadline: deadline,
            pollOnly: pollOnly, returnAfterSourceHandled: returnAfterSourceHandled, scratch: scratch,
            outerPhase: confined.phase,
            outerPhaseStartNs: instrumentation.phaseStartNs.load(ordering: .relaxed))
        context.pass.tracing = confined.tracer != nil
        return context
    }

    private func endRun(_ context: inout RunContext) {
        confined.runDepth -= 1
        if context.wakeEntry.outerRun != 0 {
            // This run may have taken work meant for the enclosing run's mode: a port's attention
            // (cleared while scanning only this mode's sources) and blocks (moved from the inbox
            // to the loop's own queue). The enclosing run looks again before it sleeps.
            if context.tookAttention { source1Attention.store(true, ordering: .sequentiallyConsistent) }
            if !confined.blocks.isEmpty { confined.blocksTakenByNestedRun = true }
        }
        wake.endRun(context.id, context.wakeEntry)
        // The enclosing run's phase again (with the latest generation: the loop moved on), its
        // times first so that a reader of the new phase word finds them.
        if instrumentation.flags.load(ordering: .relaxed) != 0 {
            instrumentation.phaseStartNs.store(context.outerPhaseStartNs, ordering: .relaxed)
            // The enclosing pass is busy again from here (it was not while the nested run slept).
            instrumentation.busyStartNs.store(LoopClock.now(), ordering: .releasing)
        }
        publishPhase(context.outerPhase)
        state.locked { _ = $0.runningModes.popLast() }
        confined.spareScratch.append(context.scratch)
        context.scratch = RunScratch()
    }

    /// Re-reads the mode's item lists if any item changed since the run last read them: between
    /// changes a pass takes no lock for them.
    @inline(__always)
    private func refreshItems(_ context: inout RunContext) {
        guard itemsVersion.load(ordering: .acquiring) != context.items.version else { return }
        state.locked { state in
            let mode = state.modes[context.modeIndex]
            context.items = ModeItems(
                version: itemsVersion.load(ordering: .relaxed),
                sources: mode.sources,
                observers: mode.observers,
                observerMask: mode.observerMask,
                timerCount: mode.timerCount,
                sources1: mode.sources1,
                interestSet: mode.interestSet,
                hasDescriptors: !mode.descriptors.isEmpty && mode.interestSet != nil,
                needsInterestSet: !mode.descriptors.isEmpty && mode.interestSet == nil,
                interestSetStale: mode.interestSetStale,
                modeIsCommon: state.isCommon(mode.name),
                dispatchPort: state.dispatchPort.flatMap { port in mode.sources1.contains { $0 === port } ? port : nil }
            )
        }
    }

    /// Whether the mode has nothing left to do (no sources, timers or blocks for it); lock-free
    /// unless it has neither sources nor timers and blocks are queued.
    private func isModeEmpty(_ context: inout RunContext) -> Bool {
        refreshItems(&context)
        return hasNoWork(context)
    }

    /// Whether the run's items as last read, and the blocks for its mode, leave it nothing to do.
    @inline(__always)
    private func hasNoWork(_ context: RunContext) -> Bool {
        if !context.items.sources.isEmpty || context.items.timerCount > 0 || !context.items.sources1.isEmpty {
            return false
        }
        if !inbox.hasReady && confined.blocks.isEmpty { return true }
        return !hasBlocks(for: context.mode, modeIsCommon: context.items.modeIsCommon)
    }

    /// Starts a pass as CoreFoundation does (the wake protocol's `beginPass`: ``wakeUp()`` heard
    /// again, a kept user wakeup still pending, a library one dropped), and resets the pass's
    /// instrumentation.
    @inline(__always)
    private func beginPass(_ context: inout RunContext) {
        context.ignoredWakeUp = wake.beginPass()
        confined.generation &+= 1
        // Not published yet: the pass's first phase publishes it with the new generation.
        confined.phase = .notRunning
        context.pass.busyStamped = false
        context.pass.begun = true
        let flags = instrumentation.flags.load(ordering: .relaxed)
        context.pass.flags = flags & ~LoopInstrumentation.traceEvents
        if _slowPath(flags & LoopInstrumentation.traceEvents != 0 || confined.tracer != nil) {
            // Only between passes of the outermost run: no callout is in progress there.
            if confined.runDepth == 1 { pickUpTraceBuffer() }
            context.pass.tracing = confined.tracer != nil
        }
        if context.pass.flags & LoopInstrumentation.reportIterations != 0 {
            context.pass.times = PhaseTimes()
            context.pass.wakeReason = .none
        } else if !confined.reporters.isEmpty {
            // The last reporter was removed: its closure goes now, not at the loop's end.
            confined.reporters = []
            confined.reportersVersion = 0
        }
    }

    // MARK: Instrumentation (see Instrumentation.swift)

    /// Enters `phase`: publishes it with the pass's generation (one relaxed store), and while the
    /// loop is instrumented, stamps its start and charges the time since the last change to the
    /// phase that ends.
    @inline(__always)
    private func enterPhase(_ phase: Phase, _ context: inout RunContext) {
        if _slowPath(context.pass.flags != 0) {
            stampPhase(phase, &context)
            context.pass.phase = phase
        } else if confined.phase == phase {
            return  // published already (observers for beforeTimers, then for beforeSources)
        }
        publishPhase(phase)
    }

    @inline(__always)
    private func publishPhase(_ phase: Phase) {
        confined.phase = phase
        instrumentation.phaseWord.store(confined.generation << 8 | UInt64(phase.rawValue), ordering: .relaxed)
    }

    private func stampPhase(_ phase: Phase, _ context: inout RunContext) {
        let now = LoopClock.now()
        if context.pass.phaseStartNs != 0 {
            context.pass.times.add(now - context.pass.phaseStartNs, to: context.pass.phase)
        }
        context.pass.phaseStartNs = now
        instrumentation.phaseStartNs.store(now, ordering: .releasing)
        if phase == .waiting {
            context.pass.busyStamped = false
        } else if !context.pass.busyStamped {
            context.pass.busyStamped = true
            instrumentation.busyStartNs.store(now, ordering: .releasing)
        }
    }

    /// What ended the pass's wait, read from what the wait left behind.
    private func noteWakeReason(_ poll: Bool, _ context: inout RunContext) {
        context.pass.wakeReason =
            if poll {
                .none
            } else if !context.scratch.kernelEvents.isEmpty {
                .descriptor
            } else if confined.recentCrossThreadWakeUp {
                source1Attention.load(ordering: .relaxed) ? .port : .wakeUp
            } else if LoopClock.now() >= context.deadline {
                .timeout
            } else {
                .timer
            }
    }

    /// Hands the pass's report to the loop's iteration reporters, on the loop's thread, with no
    /// lock held.
    private func reportPass(_ context: inout RunContext) {
        enterPhase(context.pass.phase, &context)  // charges the phase in progress up to now
        let report = IterationReport(
            mode: context.mode, generation: confined.generation, wakeReason: context.pass.wakeReason,
            slept: context.pass.wakeReason == .none ? .zero : context.pass.times[.waiting],
            phaseTimes: context.pass.times)
        if confined.reportersVersion != instrumentation.reportersVersion.load(ordering: .acquiring) {
            confined.reportersVersion = instrumentation.reportersVersion.load(ordering: .acquiring)
            confined.reporters = instrumentation.currentReporters
        }
        // A reporter that runs the loop (a nested run) is not re-entered by the nested passes'
        // reports, as an observer is not: those are not delivered.
        guard !confined.reporting else { return }
        confined.reporting = true
        defer { confined.reporting = false }
        // An index loop over the loop's own copy: no lock, no iterator (nothing to allocate).
        let reporters = confined.reporters
        var index = 0
        while index < reporters.count {
            reporters[index].call(report)
            index += 1
        }
    }

    /// Work another thread handed over with a wakeup request that a nested run dropped: blocks,
    /// a version-1 source's attention, a stop of this run. Checked once the loop has announced its
    /// sleep, so a request made after that wakes it the usual way.
    @inline(__always)
    private func handedOverWorkPending(_ context: RunContext) -> Bool {
        if confined.blocksTakenByNestedRun {
            confined.blocksTakenByNestedRun = false
            if confined.blocks.contains(where: { $0.runs(in: context.mode, modeIsCommon: context.items.modeIsCommon) }) {
                return true
            }
        }
        return inbox.hasReady || source1Attention.load(ordering: .sequentiallyConsistent)
            || wake.stopPending(context.id)
            || context.ignoredWakeUp && hasNoWork(context)
    }

    // The last check above: a pass that began after a wakeUp() was ignored (from the end of a
    // sleep to the next pass, as CoreFoundation ignores it) does not sleep with its mode empty
    // (items as `prepareToWait` re-read them). That wakeUp may come from a thread that emptied the
    // mode to end the run: if it removed the last item after the previous pass's emptiness check,
    // nothing else would end this sleep, and the run ends as `.finished` instead. Without an
    // ignored wakeUp, a pass sleeps with its mode empty as CoreFoundation's does (e.g. a run
    // whose only work was a block).

    @inline(__always)
    private func consumeStop(_ context: RunContext) -> Bool {
        wake.takeStop(context.id)
    }

    /// With `RUNLOOPKIT_DEBUG=1`, logs a run that returned at once because its mode is empty: the
    /// usual cause of a keep-alive thread that exits at once (`[runLoop run]` without a
    /// port), which CoreFoundation returns from silently.
    func noteEmptyModeRun(_ mode: Mode) {
        guard Diagnostics.debugEnabled else { return }
        Diagnostics.warning(
            "\(shortDescription) was asked to run in mode \(mode.rawValue), which has no sources, timers or blocks; the run returns .finished at once (add a source, a port or a timer to keep the loop alive)"
        )
    }

    private func warnCommonRunOnce() {
        guard !confined.warnedCommonRun else { return }
        confined.warnedCommonRun = true
        Diagnostics.warning(
            "\(shortDescription) was asked to run in .common, which is a placeholder for the common modes, not a mode; the run returns .finished"
        )
    }
}

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
    /// The enclosing run's phase and its start, published again when this run ends.
    let outerPhase: RunLoop.Phase
    let outerPhaseStartNs: Int64
    /// The current pass's instrumentation.
    var pass = PassInstrumentation()
    /// Whether the main queue's port was served in the pass before (CoreFoundation's
    /// `didDispatchPortLastTime`, true when a run starts): that pass's successor does not check it
    /// before sleeping.
    var servedDispatchPortLastPass = true
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
}

/// What a wait does once it has decided to wait: nothing (the deadline passed), sleep in the
/// kernel, or spin on the CPU until a timer is due (``RunLoop/timerSpinWindow``).
enum SleepPlan {
    case none
    case kernel
    case spin(until: Int64)
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
    /// sleeping: about the cost of one sleep and wakeup on this kind of machine.
    static let spinNanoseconds: Int64 = 5_000
    /// How often a loop without its kernel descriptors (or a mode without its epoll set) tries
    /// again to open them while it sleeps.
    static let descriptorRetryNanoseconds: Int64 = 100_000_000
    /// The loop could not open its kernel descriptors (logged once per such stretch).
    @exclusivity(unchecked) var lackedDescriptors = false
    @exclusivity(unchecked) var spareScratch: [RunScratch] = []
    /// A nested run ended with blocks in `blocks`: the enclosing run looks at them before it
    /// sleeps (see `handedOverWorkPending`).
    var blocksTakenByNestedRun = false
    /// The pass count behind ``RunLoop/PhaseSnapshot/generation``, and the phase published now.
    @exclusivity(unchecked) var generation: UInt64 = 0
    @exclusivity(unchecked) var phase: RunLoop.Phase = .notRunning
    /// The iteration reporters, copied when ``LoopInstrumentation/reportersVersion`` changes.
    @exclusivity(unchecked) var reporters: [(id: UInt64, call: @Sendable (RunLoop.IterationReport) -> Void)] = []
    @exclusivity(unchecked) var reportersVersion: UInt64 = 0
    /// Iteration reporters are being called (see `reportPass`).
    @exclusivity(unchecked) var reporting = false
    /// The batch whose timer handler is running (see `doTimers`); `modeIndex` -1 when none.
    @exclusivity(unchecked) var firingBatch = TimerBatch()
    /// Runs in progress (1 in the outermost run).
    @exclusivity(unchecked) var runDepth = 0
    /// The recording state while a trace buffer is attached (see Tracing.swift), and the attach
    /// version it was made for.
    @exclusivity(unchecked) var tracer: LoopTracer? {
        didSet { tracerRef = tracer.map { Unmanaged.passUnretained($0) } }
    }
    /// ``tracer``, unretained: what the phases call (a retain and release per event would cost
    /// more than the event). It changes only between passes of the outermost run, when no callout
    /// is in progress, and ``tracer`` keeps it alive.
    @exclusivity(unchecked) var tracerRef: Unmanaged<LoopTracer>?
    @exclusivity(unchecked) var traceVersion: UInt64 = 0
    /// The last mode named in the trace, and its name's index.
    @exclusivity(unchecked) var tracedMode: (mode: RunLoop.Mode, name: UInt32)?
    /// Set for a loop made on virtual time (VirtualTime.swift): its waits never block.
    @exclusivity(unchecked) var virtualTime: VirtualTimeControl?
}
