import CRunLoopKit

// How a loop waits, once a pass has reached its middle (RunLoop+Wait.swift's `wait` picks one
// per wait, statically dispatched). Whether it may sleep at all, and what ends a sleep, is the
// wake protocol's (WakeProtocol.swift); a strategy is how the sleep happens:
//
//   KernelWait       epoll_wait on the mode's interest set, the timerfd armed for the deadline
//                    (or a spin on the CPU before a timer, with RunLoop.timerSpinWindow)
//   SpinAfterWakeUp  a wrapper: after a wakeup from another thread, watch for the next one
//                    briefly before the inner strategy sleeps
//   FutexWait        a loop that could not open its descriptors: a futex, retried
//   VirtualTimeWait  never blocks: jumps the thread's clock to when the sleep would end; what a
//                    drive allows (pass limits, livelock, idle stops) is its policy's, which
//                    RunLoopTesting provides (VirtualTimePolicy)
//
// The steps: `begin` (false ends the wait there), then `poll` for a wait that must not block, or
// the waiting phase and `sleep`.

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
    @inline(__always)
    func begin(_ loop: RunLoop, _ context: inout RunContext) -> Bool { true }
}

/// The usual wait: `epoll_wait` on the mode's interest set (the loop's base set when the mode
/// watches no descriptor), which holds the eventfd wakers write and the timerfd armed for the
/// sleep's deadline.
struct KernelWait: LoopWaitStrategy {
    let backend: EpollBackend

    @inline(__always)
    func poll(_ loop: RunLoop, _ context: inout RunContext) {
        _ = loop.wake.takeRequest()
        loop.askKernel(&context, backend)
    }

    @inline(__always)
    func sleep(_ loop: RunLoop, _ context: inout RunContext) {
        loop.wake.announceSleep()
        if loop.wake.skipsSleep(handedOver: { loop.handedOverWorkPending(context) }) {
            loop.confined.recentCrossThreadWakeUp = true
            loop.askKernel(&context, backend)
            return
        }
        switch loop.planSleep(context) {
        case .none:
            loop.wake.endSleep()
            loop.askKernel(&context, backend)
        case .spin(let until):
            loop.wake.endSleep()
            loop.spinUntilTimer(until, &context, backend)
        case .kernel:
            let set = context.items.interestSet ?? backend.baseSet
            var outcome = backend.wait(in: set, blocking: true, into: &context.scratch.kernelEvents)
            while loop.wake.isStale(
                wokenByEventfd: outcome.wokenByAnotherThread,
                foundOtherWork: outcome.timerExpired || !context.scratch.kernelEvents.isEmpty,
                attention: { loop.source1Attention.load(ordering: .sequentiallyConsistent) })
            {
                outcome = backend.wait(in: set, blocking: true, into: &context.scratch.kernelEvents)
            }
            loop.wake.endSleep()
            loop.confined.recentCrossThreadWakeUp = loop.takeWaitOutcome(outcome)
        }
    }
}

/// After a wakeup from another thread more work usually follows within microseconds: before the
/// inner strategy sleeps, watch for it briefly (`RunLoop.spinForWakeUp`, at most
/// `LoopThreadState.spinNs`). Only in modes without descriptor sources (their events
/// would wait out the spin), and only right after a cross-thread wakeup, so an idle loop or one
/// woken by its own timers never spins.
struct SpinAfterWakeUp<Inner: LoopWaitStrategy>: LoopWaitStrategy {
    let inner: Inner

    @inline(__always)
    func begin(_ loop: RunLoop, _ context: inout RunContext) -> Bool { inner.begin(loop, &context) }

    @inline(__always)
    func poll(_ loop: RunLoop, _ context: inout RunContext) { inner.poll(loop, &context) }

    @inline(__always)
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
        loop.sleepsOnFutex.store(true, ordering: .sequentiallyConsistent)
        loop.wake.announceSleep()
        if loop.wake.skipsSleep(handedOver: { loop.handedOverWorkPending(context) }) { return }
        defer { loop.wake.endSleep() }
        let modeIndex = context.modeIndex
        let deadline = loop.state.locked { state in
            min(state.modes[modeIndex].timers.coalescedDeadline(), context.deadline)
        }
        let now = LoopClock.now()
        guard deadline > now else { return }
        loop.futex.wait(timeoutNs: min(deadline - now, LoopThreadState.descriptorRetryNs))
        _ = loop.wake.takeRequest()
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
