import CRunLoopKit
import Glibc

// Virtual time: the core's side of RunLoopTesting's `VirtualTimeLoop`.
//
// A thread on virtual time reads its own clock (`LoopClock.now()`, through crlk_loop_now_ns), so
// the run algorithm, timers made on the thread and every deadline use it, unchanged. Its loop is
// made for the purpose and is the thread's current loop meanwhile; that loop never blocks: where
// it would sleep, it polls its descriptors and, if nothing is ready, moves the thread's clock to
// when the sleep would have ended (the mode's next timer or the run's deadline). A run is then a
// sequence of full passes at the instants something is due, with no real time passing.
//
// Adding or rescheduling a timer still arms the loop's timerfd (with a virtual deadline): harmless,
// since the virtual loop's timerfd is its own, never waited on (its waits poll), and closed when
// the scope ends.

/// What a drive of a virtual-time loop allows: the policy the loop's wait strategy
/// (`VirtualTimeWait`, WaitStrategies.swift) asks where it would otherwise decide alone. The
/// mechanism (never blocking, the clock's jumps, ending runs) is the core's; the limits (pass
/// counts, livelock, idle stops) and what the driver reports are RunLoopTesting's. Called on the
/// loop's thread only (the thread on virtual time).
package protocol VirtualTimePolicy: AnyObject {
    /// A pass reached its wait at `now`: whether every run must end, out to the driver (a limit
    /// broken now or earlier in the drive).
    func passEndsEveryRun(at now: Int64) -> Bool
    /// The loop would sleep at `now` with nothing due (`outermost`: in the driver's own run):
    /// whether that run ends here instead of moving the clock.
    func endsRunWhereItWouldSleep(at now: Int64, outermost: Bool) -> Bool
    /// A run with no deadline and no timer was about to sleep: only another thread could wake it,
    /// and on virtual time none would. The run ends.
    func sleepsForever(at now: Int64)
    /// Code polled a clock-based deadline at `now` (RunLoopScheduling's `IdleDeadline`): whether
    /// the deadline should say it is spent, because the clock never moves while it is polled.
    func deadlinePolled(at now: Int64) -> Bool
}

/// A thread put on virtual time with its own loop, until ``leave()``.
package final class VirtualTimeScope {
    /// The loop, current on the thread while the scope lasts.
    package let loop: RunLoop
    /// What the loop's drives allow (RunLoopTesting's).
    package let policy: any VirtualTimePolicy
    private let thread: Int32
    private let retainedLoop: UnsafeMutableRawPointer
    private let previousLoop: UnsafeMutableRawPointer?
    private let previousOnVirtualTime: Bool
    private let previousVirtualNow: Int64
    /// Whether ``leave()`` has finished.
    package private(set) var hasLeft = false
    private var isLeaving = false

    /// Whether this scope is the innermost on its thread (its loop is the thread's current one).
    package var isInnermost: Bool { !hasLeft && loop.isCurrent }

    /// Puts the calling thread on virtual time at `startNs` with a new loop as its current loop
    /// (``RunLoop/current``): what a test made on this thread, and everything the loop does, reads
    /// the virtual clock. Scopes nest; each ``leave()`` restores what was before.
    package init(startNs: Int64, policy: any VirtualTimePolicy) {
        thread = crlk_gettid()
        previousLoop = pthread_getspecific(ThreadLoops.key)
        var previousNow: Int64 = 0
        previousOnVirtualTime = crlk_set_virtual_time(true, startNs, &previousNow)
        previousVirtualNow = previousNow
        let loop = RunLoop(ownerTID: thread, ownerName: ThreadLoops.currentName(), isMainLoop: false)
        loop.confined.virtualTimePolicy = policy
        loop.virtualClockNs.store(startNs, ordering: .releasing)
        self.loop = loop
        self.policy = policy
        retainedLoop = Unmanaged.passRetained(loop).toOpaque()
        pthread_setspecific(ThreadLoops.key, retainedLoop)
    }

    /// Whether the calling thread is the one this scope put on virtual time.
    package var isOnScopeThread: Bool { crlk_gettid() == thread }

    /// The thread's virtual clock, in the loop clock's nanoseconds.
    package var nowNs: Int64 { LoopClock.now() }

    /// Moves the thread's virtual clock to `ns` (never back).
    package func setNow(_ ns: Int64) {
        loop.setVirtualNow(max(ns, LoopClock.now()))
    }

    /// Tears the loop down (its items removed, their cancel callbacks called, its descriptors
    /// closed), as a thread's exit does, and restores the thread's clock and current loop. Only on
    /// the scope's thread; a second call does nothing.
    package func leave() {
        fatalPrecondition(isOnScopeThread, "RunLoopKit: a virtual-time scope is left on the thread that made it")
        guard !hasLeft, !isLeaving else { return }
        isLeaving = true
        // The teardown's callbacks run while the loop is still the thread's (see ThreadLoops.key),
        // on virtual time, and may still ask the scope for the time.
        loop.tearDown()
        hasLeft = true
        pthread_setspecific(ThreadLoops.key, previousLoop)
        Unmanaged<RunLoop>.fromOpaque(retainedLoop).release()
        var ignored: Int64 = 0
        _ = crlk_set_virtual_time(previousOnVirtualTime, previousVirtualNow, &ignored)
    }
}

extension RunLoop {
    /// For deadlines that code polls from a callout (RunLoopScheduling's `IdleDeadline`): on a loop
    /// on virtual time, counts the poll and returns true once the clock has not moved for
    /// polls its policy allows (a million, in RunLoopTesting: the deadline should then say it is
    /// spent; the drive ends with the reason). False, and nothing counted, on a real clock or off
    /// the loop's thread.
    package func deadlineStalledOnVirtualTime() -> Bool {
        guard isCurrent, let policy = confined.virtualTimePolicy else { return false }
        return policy.deadlinePolled(at: LoopClock.now())
    }
}

extension RunLoop {
    /// Moves the calling thread's virtual clock to `ns` and publishes it as this loop's (for
    /// ``now`` read from other threads). On the loop's thread, on virtual time.
    func setVirtualNow(_ ns: Int64) {
        crlk_set_virtual_now(ns)
        virtualClockNs.store(ns, ordering: .releasing)
    }

    /// The calling thread's loop while the thread is on virtual time (the innermost scope's loop),
    /// without making one; nil on a thread on real time. Any thread: two thread-local reads.
    package static var virtualTimeLoopOfCurrentThread: RunLoop? {
        guard crlk_is_on_virtual_time(), let raw = pthread_getspecific(ThreadLoops.key) else { return nil }
        let loop = Unmanaged<RunLoop>.fromOpaque(raw).takeUnretainedValue()
        return loop.virtualNowNs == nil ? nil : loop
    }

    /// Whether the loop is on virtual time (made by RunLoopTesting's `withVirtualTime`). Any thread.
    package var isOnVirtualTime: Bool { virtualNowNs != nil }

    /// The loop's virtual clock if it is on virtual time, from any thread.
    var virtualNowNs: Int64? {
        let ns = virtualClockNs.load(ordering: .acquiring)
        return ns == .min ? nil : ns
    }
}
