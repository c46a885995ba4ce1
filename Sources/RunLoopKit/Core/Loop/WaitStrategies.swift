import CRunLoopKit

// How a loop waits, once a pass has reached its middle (RunLoop+Wait.swift's `wait` picks one
// per wait, statically dispatched). Whether it may sleep at all, and what ends a sleep, is the
// wake protocol's (WakeProtocol.swift); a strategy is how the sleep happens:
//
//   KernelWait       epoll_wait on the mode's interest set, the timerfd armed for the deadline
//                    (or a spin on the CPU before a timer, with RunLoop.timerSpinWindow)
//   FutexWait        a loop that could not open its descriptors: a futex, retried
//   SpinAfterWakeUp  a wrapper: after a wakeup from another thread, watch for the next one
//                    briefly before the inner strategy sleeps
//   VirtualTimeWait  never blocks: jumps the thread's clock to when the sleep would end; what a
//                    drive allows (pass limits, livelock, idle stops) is its policy's, which
//                    RunLoopTesting provides (VirtualTimePolicy)
//
// The steps: `begin` (false ends the wait there), then `poll` for a wait that must not block, or
// the waiting phase and `sleep`. The two that block (KernelWait, FutexWait) sleep through the wake
// protocol's `sleep` with a sleeper of their own (what to plan, how to block), and plan with
// `SleepPlan.make`: when a sleep ends is decided there, once.

/// One way for a loop to wait (see the table above). Called on the loop's thread.
protocol LoopWaitStrategy {
    /// Before anything: false ends the wait (and the pass goes on) without polling or sleeping.
    func begin(_ loop: RunLoop, _ context: inout RunContext) -> Bool
    /// A wait that must not block: takes a pending wakeup and what the kernel has ready.
    func poll(_ loop: RunLoop, _ context: inout RunContext)
    /// A sleep, in the waiting phase already: until a wakeup, the mode's next timer or the run's
    /// deadline.
    func sleep(_ loop: RunLoop, _ context: inout RunContext)
}

extension LoopWaitStrategy {
    func begin(_ loop: RunLoop, _ context: inout RunContext) -> Bool { true }
}

/// The usual wait: `epoll_wait` on the mode's interest set (the loop's base set when the mode
/// watches no descriptor), which holds the eventfd wakers write and the timerfd armed for the
/// sleep's deadline.
struct KernelWait: LoopWaitStrategy {
    let backend: EpollBackend

    func poll(_ loop: RunLoop, _ context: inout RunContext) {
        _ = loop.wake.takeRequest()
        loop.askKernel(&context, backend)
    }

    func sleep(_ loop: RunLoop, _ context: inout RunContext) {
        var sleeper = Sleeper(loop: loop, backend: backend)
        switch loop.wake.sleep(&sleeper, &context) {
        case .skipped:
            loop.confined.recentCrossThreadWakeUp = true
            loop.askKernel(&context, backend)
        case .didNotBlock:
            if case .spin(let until) = sleeper.plan {
                loop.spinUntilTimer(until, &context, backend)
            } else {
                loop.askKernel(&context, backend)
            }
        case .woke:
            loop.confined.recentCrossThreadWakeUp = loop.takeWaitOutcome(sleeper.outcome)
        }
    }

    /// The kernel's side of the wake protocol's sleep: the plan (the timerfd armed for a block),
    /// then `epoll_wait` on the mode's set.
    struct Sleeper: WakeSleeper {
        let loop: RunLoop
        let backend: EpollBackend
        var plan = SleepPlan.none
        var outcome = EpollBackend.WaitOutcome()

        func handedOverWork(_ context: RunContext) -> Bool { loop.handedOverWorkPending(context) }

        mutating func plansToBlock(_ context: inout RunContext) -> Bool {
            plan = loop.planKernelSleep(context)
            if case .block = plan { return true }
            return false
        }

        mutating func block(_ context: inout RunContext) -> SleepEnd {
            outcome = backend.wait(in: context.items.interestSet ?? backend.baseSet, blocking: true, into: &context.scratch.kernelEvents)
            return SleepEnd(
                wokenByEventfd: outcome.wokenByAnotherThread,
                foundOtherWork: outcome.timerExpired || !context.scratch.kernelEvents.isEmpty)
        }
    }
}

/// After a wakeup from another thread more work usually follows within microseconds: before the
/// inner strategy sleeps, watch for it briefly (`RunLoop.spinForWakeUp`, at most
/// ``RunLoop/wakeUpSpinWindow``, 5 µs by default). Only in modes without descriptor sources (their events
/// would wait out the spin), and only right after a cross-thread wakeup, so an idle loop or one
/// woken by its own timers never spins.
struct SpinAfterWakeUp<Inner: LoopWaitStrategy>: LoopWaitStrategy {
    let inner: Inner

    func begin(_ loop: RunLoop, _ context: inout RunContext) -> Bool { inner.begin(loop, &context) }

    func poll(_ loop: RunLoop, _ context: inout RunContext) { inner.poll(loop, &context) }

    func sleep(_ loop: RunLoop, _ context: inout RunContext) {
        if !context.items.hasDescriptors && loop.confined.recentCrossThreadWakeUp && loop.spinForWakeUp() {
            _ = loop.wake.takeRequest()
            return
        }
        inner.sleep(loop, &context)
    }
}

/// The wait of a loop that could not open its kernel descriptors: on a futex, until a wakeup,
/// the next timer, the run's deadline, or the next attempt to open them.
struct FutexWait: LoopWaitStrategy {
    func poll(_ loop: RunLoop, _ context: inout RunContext) {
        _ = loop.wake.takeRequest()
    }

    func sleep(_ loop: RunLoop, _ context: inout RunContext) {
        loop.wake.sleepsOnFutex.store(true, ordering: .sequentiallyConsistent)
        var sleeper = Sleeper(loop: loop)
        if case .woke = loop.wake.sleep(&sleeper, &context) { _ = loop.wake.takeRequest() }
    }

    /// The futex's side of the wake protocol's sleep: until the plan's deadline, and no longer
    /// than the next attempt to open the descriptors.
    struct Sleeper: WakeSleeper {
        let loop: RunLoop
        var timeoutNs: Int64 = 0

        func handedOverWork(_ context: RunContext) -> Bool { loop.handedOverWorkPending(context) }

        mutating func plansToBlock(_ context: inout RunContext) -> Bool {
            let modeIndex = context.modeIndex
            let timerDeadline = loop.state.locked { $0.modes[modeIndex].timers.coalescedDeadline() }
            let now = LoopClock.now()
            let plan = SleepPlan.make(
                timerDeadline: timerDeadline, runDeadline: context.deadline, now: now,
                retryAfter: LoopThreadState.descriptorRetryNs, spinWindow: 0)
            guard case .block(let deadline) = plan else { return false }
            timeoutNs = deadline - now
            return true
        }

        mutating func block(_ context: inout RunContext) -> SleepEnd {
            loop.futex.wait(timeoutNs: timeoutNs)
            // A post and a timeout look the same: never stale (the pass looks at everything).
            return SleepEnd(wokenByEventfd: true, foundOtherWork: true)
        }
    }
}

/// The wait of a loop on virtual time (VirtualTime.swift): it never blocks. Descriptors are
/// polled (they work as usual); a sleep becomes a jump of the thread's clock to when it would
/// have ended, the mode's next timer or the run's deadline, and the next pass runs at that
/// instant. It ends the run instead when its policy says so: a limit broken (here or in a nested
/// run: every run ends, out to the driver), the driver's run reaching a point where it would
/// sleep, or nothing but another thread able to end the sleep.
struct VirtualTimeWait: LoopWaitStrategy {
    let policy: any VirtualTimePolicy

    func begin(_ loop: RunLoop, _ context: inout RunContext) -> Bool {
        guard policy.passEndsEveryRun(at: LoopClock.now()) else { return true }
        // A run with a deadline gets there at once, so that `run(until:)` and its kind stop
        // repeating.
        if context.deadline != LoopClock.never { loop.setVirtualNow(max(context.deadline, LoopClock.now())) }
        loop.wake.stopRun(context.id)
        return false
    }

    func poll(_ loop: RunLoop, _ context: inout RunContext) {
        _ = loop.wake.takeRequest()
        if let backend = loop.backend { loop.askKernel(&context, backend) }
    }

    func sleep(_ loop: RunLoop, _ context: inout RunContext) {
        let wokenUp = loop.wake.takeRequest() || loop.handedOverWorkPending(context)
        if let backend = loop.backend { loop.askKernel(&context, backend) }
        if wokenUp || !context.scratch.kernelEvents.isEmpty { return }
        let now = LoopClock.now()
        let modeIndex = context.modeIndex
        let timerDeadline = loop.withState { $0.modes[modeIndex].timers.coalescedDeadline() }
        if timerDeadline <= now { return }  // This pass fires it.
        if policy.endsRunWhereItWouldSleep(at: now, outermost: loop.confined.runDepth == 1) {
            loop.wake.stopRun(context.id)
            return
        }
        let wakeAt = min(timerDeadline, context.deadline)
        guard wakeAt != LoopClock.never else {
            policy.sleepsForever(at: now)
            loop.wake.stopRun(context.id)
            return
        }
        loop.setVirtualNow(max(wakeAt, now))
    }
}
