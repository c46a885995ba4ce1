import CRunLoopKit
import DequeModule
import Glibc
import SystemPackage

// The middle of a pass (see RunLoop+Run.swift): whether it sleeps, and how: in the kernel, on a
// futex without descriptors, on the CPU before a timer, or on virtual time. The sleep decision
// itself is the wake protocol's (Loop/WakeProtocol.swift).

extension RunLoop {
    /// Sleeps until a wakeup, the mode's next timer (within its tolerance) or the run's deadline;
    /// a poll only asks the kernel which descriptors are ready. What woke the loop is left for the
    /// phases that follow: descriptor events in the run's scratch, a wakeup consumed.
    ///
    /// How it sleeps is a strategy (WaitStrategies.swift): in epoll (behind the post-wakeup
    /// spin), on a futex while the loop lacks its descriptors, or on virtual time.
    func wait(_ context: inout RunContext, poll: Bool) {
        if context.polledThisPass {
            // The pass asked the kernel already, checking the main queue's port: its answer stands.
            context.polledThisPass = false
            return
        }
        prepareToWait(&context)
        if _slowPath(confined.virtualTimePolicy != nil), let policy = confined.virtualTimePolicy {
            return wait(with: VirtualTimeWait(policy: policy), &context, poll: poll)
        }
        guard let backend else { return wait(with: FutexWait(), &context, poll: poll) }
        wait(with: SpinAfterWakeUp(inner: KernelWait(backend: backend)), &context, poll: poll)
    }

    /// The steps every strategy shares: a poll (or a wait a version-1 source's work makes one)
    /// takes what is ready; a sleep starts the waiting phase, then the strategy sleeps.
    @inline(__always)
    private func wait<Strategy: LoopWaitStrategy>(with strategy: Strategy, _ context: inout RunContext, poll: Bool) {
        guard strategy.begin(self, &context) else { return }
        if poll || sources1Pending(context) {
            strategy.poll(self, &context)
            return
        }
        enterPhase(.waiting, &context)
        if _slowPath(context.pass.tracing) { traceSleepBegin(&context) }
        strategy.sleep(self, &context)
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
        if hasInputFromOtherThreads { return true }
        let (timerDeadline, set) = state.locked { state -> (Int64, EpollBackend.InterestSet?) in
            guard let index = state.runningModes.last else { return (LoopClock.never, nil) }
            let mode = state.modes[index]
            return (mode.timers.coalescedDeadline(), mode.descriptors.isEmpty ? nil : mode.interestSet)
        }
        if timerDeadline != LoopClock.never && timerDeadline <= LoopClock.now() { return true }
        guard let set, let backend else { return false }
        return backend.hasReadyDescriptor(in: set)
    }

    /// Whether another thread has handed the loop something: a wakeup requested, blocks in the
    /// inbox, or a version-1 source asking for attention (a port's messages). The inbox is looked
    /// at itself, not only through the request: only the block that finds it empty asks for a
    /// wakeup, and a nested run may have dropped that request with the blocks still there. A hint
    /// (each flag read once); loop thread.
    @inline(__always)
    var hasInputFromOtherThreads: Bool {
        wake.hasRequest || inbox.hasReady || wake.source1Attention.load(ordering: .sequentiallyConsistent)
    }

    /// Brings the kernel side up to date before a wait: the loop's descriptors opened if it lacks
    /// them, the mode's interest set made (or made anew), and the item lists re-read (observers
    /// just called may have changed them; a nested run may even have made this mode's set anew).
    func prepareToWait(_ context: inout RunContext) {
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
    func sources1Pending(_ context: RunContext) -> Bool {
        wake.source1Attention.load(ordering: .sequentiallyConsistent)
            || (!context.sources1Scanned && context.items.sources1.contains { $0.needsAttention })
    }

    /// How the loop waits once it has announced its sleep (see `SleepPlan.make`), and, for a
    /// block in the kernel, the timerfd armed for its deadline. One look under the lock: a timer
    /// another thread adds meanwhile either is seen here or re-arms the timerfd after
    /// (`rearmForEarlierTimers`), never overwritten by an older plan.
    func planKernelSleep(_ context: RunContext) -> SleepPlan {
        let spinWindow = timerSpinNs.load(ordering: .relaxed)
        return withState { state -> SleepPlan in
            let plan = SleepPlan.make(
                timerDeadline: state.modes[context.modeIndex].timers.coalescedDeadline(),
                runDeadline: context.deadline, now: LoopClock.now(),
                retryAfter: context.items.needsInterestSet ? LoopThreadState.descriptorRetryNs : nil,
                spinWindow: spinWindow)
            if case .block(let deadline) = plan, deadline != state.armedDeadline { arm(&state, deadline) }
            return plan
        }
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
        if found.timer <= LoopClock.now() || wake.hasRequest || wake.source1Attention.load(ordering: .relaxed)
        {
            return true
        }
        if let set = found.set, let backend, backend.hasReadyDescriptor(in: set) { return true }
        if found.sources.contains(where: \.isSignalled) { return true }
        return hasBlocks(for: mode, modeIsCommon: found.common)
    }

    /// Asks the kernel, without blocking, which of the mode's descriptors are ready (nothing to
    /// ask when the mode watches none: timers are checked against the clock).
    func askKernel(_ context: inout RunContext, _ backend: EpollBackend) {
        guard context.items.hasDescriptors, let set = context.items.interestSet else { return }
        _ = takeWaitOutcome(backend.wait(in: set, blocking: false, into: &context.scratch.kernelEvents))
    }

    /// Takes what a wait found besides descriptor events: a wakeup from another thread (the
    /// request consumed) and the timer's expiry (the timerfd is disarmed). Returns whether
    /// another thread woke the loop.
    func takeWaitOutcome(_ outcome: EpollBackend.WaitOutcome) -> Bool {
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
    func spinUntilTimer(_ deadline: Int64, _ context: inout RunContext, _ backend: EpollBackend) {
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

    /// Spins for at most ``wakeUpSpinWindow`` watching for a wakeup request; returns whether one
    /// came (false at once where the window is zero). Used only right after a wakeup from
    /// another thread, so an idle loop or a loop woken by its own timers never spins.
    func spinForWakeUp() -> Bool {
        let window = wakeUpSpinNs.load(ordering: .relaxed)
        guard window > 0 else {
            confined.recentCrossThreadWakeUp = false
            return false
        }
        let limit = LoopClock.now() &+ window
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

    /// Work another thread handed over with a wakeup request that a nested run dropped: blocks,
    /// a version-1 source's attention, a stop of this run. Checked once the loop has announced its
    /// sleep, so a request made after that wakes it the usual way.
    @inline(__always)
    func handedOverWorkPending(_ context: RunContext) -> Bool {
        if confined.blocksTakenByNestedRun {
            confined.blocksTakenByNestedRun = false
            if confined.blocks.contains(where: { $0.runs(in: context.mode, modeIsCommon: context.items.modeIsCommon) }) {
                return true
            }
        }
        return inbox.hasReady || wake.source1Attention.load(ordering: .sequentiallyConsistent)
            || wake.stopPending(context.id)
            || context.ignoredWakeUp && hasNoWork(context)
            || hasNoItems(context) && pendingWorkLetGo(context) != context.pendingWorkLetGo && hasNoWork(context)
    }

    // The last two checks above: a pass that began after a wakeUp() was ignored (from the end of a
    // sleep to the next pass, as CoreFoundation ignores it) does not sleep with its mode empty
    // (items as `prepareToWait` re-read them). That wakeUp may come from a thread that emptied the
    // mode to end the run: if it removed the last item after the previous pass's emptiness check,
    // nothing else would end this sleep, and the run ends as `.finished` instead. Without an
    // ignored wakeUp, a pass sleeps with its mode empty as CoreFoundation's does (e.g. a run
    // whose only work was a block). Nor does a pass whose mode is empty after pending work of it
    // (RunLoopPendingWork) was let go during the run: that work is done at beforeWaiting, just
    // before this check, and a run that waited for it ends `.finished` at the end of this pass.
}
