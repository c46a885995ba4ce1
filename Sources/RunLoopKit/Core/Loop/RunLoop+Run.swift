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
//                   (empty: no sources, timers, blocks or RunLoopPendingWork for the mode)
//         doObservers(exit)
//
// Who may call what, and the locks behind it, are in RunLoop.swift; the wake protocol in
// WakeProtocol.swift. The phases live by concern: observers, blocks and sources here; timers in
// RunLoop+Timers.swift; the wait in RunLoop+Wait.swift; what a pass publishes for the
// instrumentation in ../Instrumentation/RunLoop+PassInstrumentation.swift.

extension RunLoop {
    /// Runs the loop once in `mode` until the timeout passes, ``stop()`` is called, the mode has
    /// nothing left to do, or (with `returnAfterSourceHandled`) a source was handled
    /// (`CFRunLoopRunInMode`).
    ///
    /// Running in ``Mode/common``, or in a mode with no sources, timers, pending blocks or pending
    /// work (``RunLoopPendingWork``), returns ``RunResult/finished`` at once without calling
    /// observers. A negative timeout counts as zero:
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
        // A run waiting for pending work ends once that work is done (see `handedOverWorkPending`);
        // the entry observers would read the items anyway.
        refreshItems(&context)
        context.pendingWorkLetGo = pendingWorkLetGo(context)
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
            if dispatchPortIsReady(&context, poll: poll) {
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
    func doObservers(_ activity: Activity, _ context: inout RunContext) {
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
            calloutBegins(.observer, label: observer.itemLabel.calloutLabel.load(ordering: .relaxed))
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
    ///
    /// A pass that polls rather than sleeps (`poll`) asks the kernel once, for the whole mode, and
    /// looks for the port among what is ready (`pollForDispatchPort`): one system call a pass
    /// instead of two, where the main loop spins through passes (GLib's idle sources).
    @inline(__always)
    private func dispatchPortIsReady(_ context: inout RunContext, poll: Bool) -> Bool {
        guard _slowPath(context.items.dispatchPort != nil) else { return false }
        let servedLastPass = context.servedDispatchPortLastPass
        context.servedDispatchPortLastPass = false
        guard !servedLastPass, let port = context.items.dispatchPort else { return false }
        if poll, let ready = pollForDispatchPort(port, &context) { return ready }
        return Poll.isReadable(port.descriptor)
    }

    /// The poll of a pass that will not sleep, made before the main queue's port is checked (the
    /// pass's wait then takes its answer: `polledThisPass`); whether the port is ready. When it is,
    /// the pass serves the port alone, as CoreFoundation's does: the other descriptors' events
    /// are dropped, and the next pass's wait reports them again (level-triggered). Nil where the
    /// loop does not wait in epoll (no descriptors, virtual time).
    private func pollForDispatchPort(_ port: FileDescriptorSource, _ context: inout RunContext) -> Bool? {
        guard let backend, confined.virtualTimePolicy == nil else { return nil }
        prepareToWait(&context)
        guard let set = context.items.interestSet, context.items.hasDescriptors else { return nil }
        context.polledThisPass = true
        _ = wake.takeRequest()
        _ = takeWaitOutcome(backend.wait(in: set, blocking: false, into: &context.scratch.kernelEvents))
        guard !context.scratch.kernelEvents.isEmpty else { return false }
        let ready = state.locked { state in
            let mode = state.modes[context.modeIndex]
            return context.scratch.kernelEvents.contains { mode.descriptorNumbers[$0.tag] == port.descriptor }
        }
        if ready {
            context.scratch.kernelEvents.removeAll(keepingCapacity: true)
            context.polledThisPass = false
        }
        return ready
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
    func doBlocks(_ context: inout RunContext) {
        let hasOlder = !confined.blocks.isEmpty
        let batch = inbox.exchange(&context.scratch.spareBatch)
        guard hasOlder || batch != nil else { return }
        enterPhase(.blocks, &context)
        refreshItems(&context)
        let modeIsCommon = context.items.modeIsCommon
        if hasOlder {
            // Blocks kept from earlier passes (for other modes) are older than the inbox's.
            swap(&confined.blocks, &context.scratch.blocks)
            while let block = context.scratch.blocks.popFirst() { runOrKeep(block, modeIsCommon: modeIsCommon, &context) }
        }
        if let batch {
            while let block = batch.popFirst() { runOrKeep(block, modeIsCommon: modeIsCommon, &context) }
            context.scratch.spareBatch = batch
        }
        if !context.scratch.otherModes.isEmpty {
            // Ahead of anything a nested run moved there meanwhile: they are older.
            confined.blocks.prepend(contentsOf: context.scratch.otherModes)
            context.scratch.otherModes.removeAll(keepingCapacity: true)
        }
    }

    /// Runs `block` if it is for the run's mode; else keeps it, in order, for a later pass.
    @inline(__always)
    private func runOrKeep(_ block: consuming PendingBlock, modeIsCommon: Bool, _ context: inout RunContext) {
        guard block.runs(in: context.mode, modeIsCommon: modeIsCommon) else {
            context.scratch.otherModes.append(block)
            return
        }
        if _slowPath(context.pass.tracing) { traceBlockBegin(&context) }
        calloutBegins(.block, label: 0)
        block.run(on: self)
        calloutEnds()
        if _slowPath(context.pass.tracing) { traceCalloutEnd(&context) }
    }

    /// Moves the blocks other threads performed into the loop's own queue, in order.
    @inline(__always)
    func drainInbox() {
        inbox.takeAll(appendingTo: &confined.blocks, spare: &confined.spareInboxBuffer)
    }

    /// The index of `mode` if a run in it has something to do (sources, timers, pending work or
    /// pending blocks for it; observers do not count); nil for an empty mode or one never made
    /// (modes are found, never made, by a run, as `CFRunLoopRunInMode` does). Loop thread only.
    private func indexIfHasWork(_ mode: Mode) -> Int? {
        let (index, noItems, modeIsCommon) = state.locked { state -> (Int?, Bool, Bool) in
            guard let index = state.modeIndex[mode] else { return (nil, true, false) }
            let isCommon = state.isCommon(mode)
            let held = state.modes[index].pendingWork.isHeld || (isCommon && commonPendingWork.isHeld)
            return (index, state.hasNoItems(index) && !held, isCommon)
        }
        guard let index else { return nil }
        return noItems && !hasBlocks(for: mode, modeIsCommon: modeIsCommon) ? nil : index
    }

    func hasBlocks(for mode: Mode, modeIsCommon: Bool) -> Bool {
        drainInbox()
        return confined.blocks.contains { $0.runs(in: mode, modeIsCommon: modeIsCommon) }
    }

    /// Performs the signalled version-0 sources of the mode; returns whether any was performed.
    /// As CoreFoundation, it first collects the signalled sources, then performs them in ascending
    /// order, equal orders by signal time: a source signalled by a callback of this pass waits for
    /// the next pass. With `returnAfterSourceHandled`, stops after the first.
    func doSources0(_ context: inout RunContext) -> Bool {
        refreshItems(&context)
        let sources = context.items.sources
        // Unretained: `sources` holds them for the whole pass. One signalled source (the usual
        // case) is handled without the list.
        var first: (source: Unmanaged<RunLoopSource>, stamp: UInt64)?
        var index = 0
        while index < sources.count {
            let source = sources[index]
            index += 1
            let stamp = source.signalStamp.load(ordering: .relaxed)
            guard stamp != 0 else { continue }
            if first == nil && context.scratch.signalled.isEmpty {
                first = (Unmanaged.passUnretained(source), stamp)
                continue
            }
            if let moved = first {
                context.scratch.signalled.append(moved)
                first = nil
            }
            context.scratch.signalled.append((Unmanaged.passUnretained(source), stamp))
        }
        if let first {
            enterPhase(.sources0, &context)
            return performSource0(first.source.takeUnretainedValue(), &context)
        }
        guard !context.scratch.signalled.isEmpty else { return false }
        enterPhase(.sources0, &context)
        sortBySignalTime(&context.scratch.signalled)
        var handled = false
        index = 0
        while index < context.scratch.signalled.count {
            let source = context.scratch.signalled[index].source.takeUnretainedValue()
            index += 1
            if performSource0(source, &context) {
                handled = true
                if context.returnAfterSourceHandled { break }
            }
        }
        context.scratch.signalled.removeAll(keepingCapacity: true)
        return handled
    }

    /// Calls `source` out if it is still signalled and valid (an earlier callout of the pass may
    /// have handled or cancelled it); returns whether it did.
    @inline(__always)
    private func performSource0(_ source: RunLoopSource, _ context: inout RunContext) -> Bool {
        guard source.signalStamp.exchange(0, ordering: .acquiring) != 0, source.isValid else { return false }
        if _slowPath(context.pass.tracing) { traceCalloutBegin(source, .sources0, &context) }
        calloutBegins(.source, label: source.itemLabel.calloutLabel.load(ordering: .relaxed))
        source.performCallout()
        calloutEnds()
        if _slowPath(context.pass.tracing) { traceCalloutEnd(&context) }
        return true
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

    /// Handles the version-1 sources that are ready: descriptor sources the last wait reported,
    /// and sources that asked for attention (message ports with messages, descriptors found
    /// closed), in ascending order (equal orders: oldest source first). With
    /// `returnAfterSourceHandled`, handles one callout (CoreFoundation handles the one port that
    /// woke it). Returns whether a callout ran.
    func doSources1(_ context: inout RunContext) -> Bool {
        var attention =
            wake.source1Attention.load(ordering: .relaxed) && wake.source1Attention.exchange(false, ordering: .acquiring)
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
            // By index: an unoptimized build's iterator over the existentials allocates.
            let sources1 = context.items.sources1
            for index in sources1.indices where sources1[index].needsAttention {
                let item = sources1[index]
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
            wake.source1Attention.store(true, ordering: .sequentiallyConsistent)
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

    // MARK: Run bookkeeping

    func beginRun(
        mode: Mode, modeIndex: Int, deadline: Int64, pollOnly: Bool,
        returnAfterSourceHandled: Bool
    ) -> RunContext {
        confined.nextRunID += 1
        let id = confined.nextRunID
        let entry = wake.beginRun(id)
        let scratch = confined.spareScratch.popLast() ?? RunScratch()
        confined.runDepth += 1
        if confined.runDepth == 1 { pickUpRecorder() }
        var context = RunContext(
            id: id, wakeEntry: entry, mode: mode, modeIndex: modeIndex, deadline: deadline,
            pollOnly: pollOnly, returnAfterSourceHandled: returnAfterSourceHandled, scratch: scratch,
            outerPhase: confined.passes.phase,
            outerPhaseStartNs: instrumentation.phaseStartNs.load(ordering: .relaxed))
        context.pass.tracing = confined.trace.tracer != nil
        return context
    }

    func endRun(_ context: inout RunContext) {
        confined.runDepth -= 1
        if context.wakeEntry.outerRun != 0 {
            // This run may have taken work meant for the enclosing run's mode: a port's attention
            // (cleared while scanning only this mode's sources) and blocks (moved from the inbox
            // to the loop's own queue). The enclosing run looks again before it sleeps.
            if context.tookAttention { wake.source1Attention.store(true, ordering: .sequentiallyConsistent) }
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
    func refreshItems(_ context: inout RunContext) {
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
                dispatchPort: state.dispatchPort.flatMap { port in mode.sources1.contains { $0 === port } ? port : nil },
                pendingWork: mode.pendingWork
            )
        }
    }

    /// Whether the mode has nothing left to do (no sources, timers, pending work or blocks for
    /// it); lock-free unless it has neither sources nor timers and blocks are queued.
    private func isModeEmpty(_ context: inout RunContext) -> Bool {
        refreshItems(&context)
        return hasNoWork(context)
    }

    /// Whether the run's items as last read, the pending work for its mode and the blocks for it
    /// leave it nothing to do.
    @inline(__always)
    func hasNoWork(_ context: RunContext) -> Bool {
        hasNoItems(context) && !holdsPendingWork(context) && hasNoBlocks(context)
    }

    /// Whether the run's items as last read hold no source, timer or version-1 source.
    @inline(__always)
    func hasNoItems(_ context: RunContext) -> Bool {
        context.items.sources.isEmpty && context.items.timerCount == 0 && context.items.sources1.isEmpty
    }

    /// Whether a `RunLoopPendingWork` holds the run's mode (or the common modes, if it is one).
    /// Two atomic loads.
    @inline(__always)
    private func holdsPendingWork(_ context: RunContext) -> Bool {
        context.items.pendingWork?.isHeld == true || (context.items.modeIsCommon && commonPendingWork.isHeld)
    }

    /// How many times pending work of the run's mode (or of the common modes, if it is one) was
    /// let go so far. Two atomic loads.
    @inline(__always)
    func pendingWorkLetGo(_ context: RunContext) -> UInt64 {
        (context.items.pendingWork?.letGo ?? 0) &+ (context.items.modeIsCommon ? commonPendingWork.letGo : 0)
    }

    @inline(__always)
    private func hasNoBlocks(_ context: RunContext) -> Bool {
        if !inbox.hasReady && confined.blocks.isEmpty { return true }
        return !hasBlocks(for: context.mode, modeIsCommon: context.items.modeIsCommon)
    }

    /// Starts a pass as CoreFoundation does (the wake protocol's `beginPass`: ``wakeUp()`` heard
    /// again, a kept user wakeup still pending, a library one dropped), and resets the pass's
    /// instrumentation.
    @inline(__always)
    func beginPass(_ context: inout RunContext) {
        context.ignoredWakeUp = wake.beginPass()
        confined.passes.generation &+= 1
        // Not published yet: the pass's first phase publishes it with the new generation.
        confined.passes.phase = .notRunning
        context.pass.busyStamped = false
        context.pass.begun = true
        let flags = instrumentation.flags.load(ordering: .relaxed)
        context.pass.flags = flags & ~LoopInstrumentation.traceEvents
        if _slowPath(flags & LoopInstrumentation.traceEvents != 0 || confined.trace.tracer != nil) {
            // Only between passes of the outermost run: no callout is in progress there.
            if confined.runDepth == 1 { pickUpRecorder() }
            context.pass.tracing = confined.trace.tracer != nil
        }
        if context.pass.flags & LoopInstrumentation.reportIterations != 0 {
            context.pass.times = PhaseTimes()
            context.pass.wakeReason = .none
        } else if !confined.passes.reporters.isEmpty {
            // The last reporter was removed: its closure goes now, not at the loop's end.
            confined.passes.reporters = []
            confined.passes.reportersVersion = 0
        }
    }

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
