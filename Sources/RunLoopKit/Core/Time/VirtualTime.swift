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

/// What a driver of a virtual-time loop asks of it and what the loop reports back. Confined to
/// the loop's thread (the thread on virtual time), like the rest of ``LoopThreadState``.
package final class VirtualTimeControl {
    /// Why the loop itself ended a run.
    package enum Stop: Sendable, Equatable {
        /// The driving run reached a point where it would sleep (``stopWhenIdle``).
        case idle
        /// More than ``maxPassesAtInstant`` passes at one instant: work that never settles.
        case livelock
        /// More than ``maxPasses`` passes in one drive.
        case passLimit
        /// A run with no deadline and no timer was about to sleep: only another thread could
        /// wake it, and on virtual time nothing ever would.
        case sleepsForever
        /// A callout polled a clock-based deadline (``pollsPerInstant`` times) at one instant: on
        /// virtual time a callout's work takes no time, so a `while !deadline.shouldYield` loop
        /// would never end.
        case clockStalled
    }

    /// Polls of a clock-based deadline allowed at one instant before ``Stop/clockStalled``.
    package static let pollsPerInstant = 1_000_000
    private var pollInstant = Int64.min
    private var polls = 0

    /// Counts a poll of a deadline at `now`; returns true once the polls at this instant pass
    /// ``pollsPerInstant`` (and records ``Stop/clockStalled``): the deadline should then report
    /// itself spent, so the callout returns and the drive ends with the reason.
    func countPoll(at now: Int64) -> Bool {
        if now != pollInstant {
            pollInstant = now
            polls = 0
        }
        polls += 1
        guard polls > Self.pollsPerInstant else { return false }
        record(.clockStalled, at: now)
        return true
    }

    /// The outermost run ends where it would sleep, instead of moving the clock.
    package var stopWhenIdle = false
    /// Passes allowed at one instant, and in one drive (no limit between drives: a run the test's
    /// body makes itself behaves as in production).
    package var maxPassesAtInstant = Int.max
    package var maxPasses = Int.max
    /// Passes since ``beginDrive(stopWhenIdle:maxPasses:maxPassesAtInstant:)``.
    package private(set) var passes = 0
    /// Passes at the current instant.
    package private(set) var passesAtInstant = 0
    private var instant = Int64.min
    /// Why the loop ended the drive's run, if it did (a broken limit ends every run out to the
    /// driver: each wait checks it first).
    package private(set) var stop: Stop?
    /// The clock when ``stop`` was recorded.
    package private(set) var stopNs: Int64 = 0
    /// Runs ended because a limit was broken: a loop in a callout that keeps starting runs (a
    /// keep-alive `while` loop) cannot be unwound, and past ``unwindLimit`` the process stops
    /// with the reason instead of spinning.
    private var unwoundRuns = 0
    static let unwindLimit = 100_000

    init() {}

    /// The stop recorded, unless it is ``Stop/idle`` (which ends only the driver's run).
    var brokenLimit: Stop? { stop == .idle ? nil : stop }

    /// Resets the counts and the stop for a new drive.
    package func beginDrive(stopWhenIdle: Bool, maxPasses: Int, maxPassesAtInstant: Int) {
        self.stopWhenIdle = stopWhenIdle
        self.maxPasses = maxPasses
        self.maxPassesAtInstant = maxPassesAtInstant
        passes = 0
        passesAtInstant = 0
        instant = Int64.min
        polls = 0
        pollInstant = Int64.min
        stop = nil
        unwoundRuns = 0
    }

    /// Back to no drive: no limits, no idle stop, no recorded stop.
    package func endDrive() {
        beginDrive(stopWhenIdle: false, maxPasses: .max, maxPassesAtInstant: .max)
    }

    /// Counts a pass at `now`; returns the limit it broke, if any.
    func countPass(at now: Int64) -> Stop? {
        if now != instant {
            instant = now
            passesAtInstant = 0
        }
        passes += 1
        passesAtInstant += 1
        if passesAtInstant > maxPassesAtInstant { return .livelock }
        if passes > maxPasses { return .passLimit }
        return nil
    }

    func record(_ reason: Stop, at now: Int64) {
        // The first reason stands: an idle stop does not hide a livelock found in a nested run.
        if stop == nil || stop == .idle {
            stop = reason
            stopNs = now
        }
    }

    /// Counts a run ended because a limit was broken; stops the process past ``unwindLimit``.
    func countUnwoundRun() {
        unwoundRuns += 1
        if unwoundRuns > Self.unwindLimit {
            fatalError(
                "RunLoopTesting: \(stop.map { "\($0)" } ?? "a limit") broken on virtual time, but a callout keeps running the loop (\(Self.unwindLimit) runs ended since): a keep-alive loop inside a callout cannot be unwound; give it an exit condition"
            )
        }
    }
}

/// A thread put on virtual time with its own loop, until ``leave()``.
package final class VirtualTimeScope {
    /// The loop, current on the thread while the scope lasts.
    package let loop: RunLoop
    /// Where the loop's driver and the loop meet.
    package let control: VirtualTimeControl
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
    package init(startNs: Int64) {
        thread = crlk_gettid()
        previousLoop = pthread_getspecific(ThreadLoops.key)
        var previousNow: Int64 = 0
        previousOnVirtualTime = crlk_set_virtual_time(true, startNs, &previousNow)
        previousVirtualNow = previousNow
        let control = VirtualTimeControl()
        let loop = RunLoop(ownerTID: thread, ownerName: ThreadLoops.currentName(), isMainLoop: false)
        loop.confined.virtualTime = control
        self.loop = loop
        self.control = control
        retainedLoop = Unmanaged.passRetained(loop).toOpaque()
        pthread_setspecific(ThreadLoops.key, retainedLoop)
    }

    /// Whether the calling thread is the one this scope put on virtual time.
    package var isOnScopeThread: Bool { crlk_gettid() == thread }

    /// The thread's virtual clock, in the loop clock's nanoseconds.
    package var nowNs: Int64 { LoopClock.now() }

    /// Moves the thread's virtual clock to `ns` (never back).
    package func setNow(_ ns: Int64) {
        crlk_set_virtual_now(max(ns, LoopClock.now()))
    }

    /// Tears the loop down (its items removed, their cancel callbacks called, its descriptors
    /// closed), as a thread's exit does, and restores the thread's clock and current loop. Only on
    /// the scope's thread; a second call does nothing.
    package func leave() {
        precondition(isOnScopeThread, "RunLoopKit: a virtual-time scope is left on the thread that made it")
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
    /// ``VirtualTimeControl/pollsPerInstant`` polls (the deadline should then say it is spent; the
    /// drive ends with the reason). False, and nothing counted, on a real clock or off the loop's
    /// thread.
    package func deadlineStalledOnVirtualTime() -> Bool {
        guard isCurrent, let control = confined.virtualTime else { return false }
        return control.countPoll(at: LoopClock.now())
    }
}
