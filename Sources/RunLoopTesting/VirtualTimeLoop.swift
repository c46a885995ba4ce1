import RunLoopKit

import class RunLoopKit.RunLoop

/// Runs `body` with the calling thread on virtual time and a fresh ``VirtualTimeLoop`` as its
/// current loop, then tears that loop down and gives the thread its clock and loop back.
///
/// Inside `body`, `RunLoop.current` is the virtual-time loop and every clock read
/// of RunLoopKit on this thread is virtual: a `RunLoopTimer(after:)` made here is due that long
/// after the virtual now. Time moves only when the test says so (``VirtualTimeLoop/advance(by:in:maxPasses:)-9wgxh``)
/// or when a callout says it took time (``VirtualTimeLoop/elapse(_:)``); nothing sleeps, and the
/// machine's speed changes nothing.
///
/// <!-- snippet: prelude
/// import Testing
/// -->
/// ```swift
/// try withVirtualTime { time in
///     let fires = LoopBound<[Duration]>([])  // the callbacks run on this thread
///     let timer = RunLoopTimer(after: .seconds(1), repeating: .seconds(1)) { _ in
///         fires.value.append(time.elapsed)
///     }
///     RunLoop.current.add(timer, forMode: .default)
///     try time.advance(by: .seconds(3))
///     #expect(fires.value == [.seconds(1), .seconds(2), .seconds(3)])
/// }
/// ```
///
/// `body` must stay on this thread: call it from synchronous code (a synchronous test function,
/// or a synchronous closure inside an async one). The loop is not meant to escape `body`; its
/// methods stop the process with a message if they are called from another thread or after
/// `body` returned.
///
/// - Complexity: Making and tearing down the loop costs what a thread's loop does (an epoll set,
///   an eventfd and a timerfd, opened and closed).
public func withVirtualTime<Result, Failure: Error>(
    _ body: (VirtualTimeLoop) throws(Failure) -> Result
) throws(Failure) -> Result {
    let loop = VirtualTimeLoop()
    defer { loop.close() }
    return try body(loop)
}

/// A run loop on virtual time, for deterministic tests of code built on RunLoopKit: made by
/// ``withVirtualTime(_:)``.
///
/// It runs the real run algorithm: ``advance(by:in:maxPasses:)-9wgxh`` runs the loop in a mode while the
/// clock moves to the target, with a full pass (observers, blocks, sources, timers, descriptors,
/// and what other modules place in the pass: idle tasks, commits, release pools) at each instant
/// something is due; ``runUntilIdle(in:maxPasses:)-7obqd`` runs it at the current instant until it would
/// sleep, and reports work that never settles as ``VirtualTimeError/livelock(at:passes:trail:)``.
/// Where the loop would sleep, it polls its descriptor sources instead, so pipes and sockets
/// still work.
///
/// What stays on real time: `RunLoop.timerSpinWindow` (the loop never spins), display
/// links and anything else driven by a kernel timer of its own, and clocks other than RunLoopKit's
/// (`ContinuousClock.now`, `Date()`): compute instants from ``now``.
///
/// Callbacks may capture it (it is `Sendable`): they run on the scope's thread, which is the only
/// thread its members accept.
public final class VirtualTimeLoop: @unchecked Sendable {
    // Why `@unchecked Sendable` is safe: `start` is a constant and `runLoop` reads a constant
    // (Sendable) loop; every other member first checks (`checkThread`, preconditions also in -O
    // builds) that the caller is on the thread withVirtualTime put on virtual time, comparing
    // only constants (the thread id) before it reads any state, and only then touches `scope`'s
    // and `trail`'s mutable state; so all their uses come from that one thread, in program order.
    // `close()` runs on it too, from withVirtualTime's `defer`, and the scope checks the thread
    // itself.
    private let scope: VirtualTimeScope
    /// What the current drive allows, and why the loop ended its runs (the core's wait asks it).
    private let drive = VirtualTimeDrive()
    private let trail: ActivityTrail

    /// The virtual instant ``withVirtualTime(_:)`` started at (the real clock's reading then).
    public let start: ContinuousClock.Instant

    /// The loop, which is `RunLoop.current` on this thread while the scope lasts.
    public var runLoop: RunLoop { scope.loop }

    /// Now, on the virtual clock.
    public var now: ContinuousClock.Instant {
        checkThread("now")
        return RunLoop.now
    }

    /// The virtual time since ``start``.
    public var elapsed: Duration {
        checkThread("elapsed")
        return RunLoop.now - start
    }

    init() {
        GlobalJobRouting.install()
        let startNs = RunLoop.nanoseconds(of: ContinuousClock.now)
        scope = VirtualTimeScope(startNs: startNs, policy: drive)
        start = RunLoop.instant(ofNanoseconds: startNs)
        trail = ActivityTrail(loop: scope.loop)
    }

    func close() {
        trail.detach()
        scope.leave()
    }

    /// Runs the loop in `mode` while the clock moves forward by `duration`: a full pass at each
    /// instant a timer is due (in deadline order, repeating timers rescheduled as in production),
    /// then, at the end, until the loop would sleep (see ``runUntilIdle(in:maxPasses:)-7obqd``).
    ///
    /// A `RunLoop.stop()` from a callout ends the current run; the clock still moves
    /// to the end (another run takes over). A mode with nothing in it lets the time pass. A run
    /// a callout nests moves the clock as it would in production (it sleeps to its own deadline).
    ///
    /// - Parameters:
    ///   - duration: How far to move the clock; `.zero` runs what is due now.
    ///   - mode: The mode to run in.
    ///   - maxPasses: The most passes this call may take; more end it with
    ///     ``VirtualTimeError/passLimit(at:passes:trail:)``. At most 10,000 passes are allowed at
    ///     any one instant (``VirtualTimeError/livelock(at:passes:trail:)``).
    /// - Throws: ``VirtualTimeError``; the clock is left where the loop stopped.
    /// - Complexity: One pass per instant something is due, plus the passes the work itself takes.
    public func advance(
        by duration: Duration, in mode: RunLoop.Mode = .default, maxPasses: Int = 1_000_000
    ) throws(VirtualTimeError) {
        checkThread("advance(by:)")
        guard duration >= .zero else { throw .negativeDuration(duration) }
        try advance(to: now + duration, in: mode, maxPasses: maxPasses)
    }

    /// Runs the loop in `mode` while the clock moves forward to `target`: see
    /// ``advance(by:in:maxPasses:)-9wgxh``. A target at or before ``now`` runs what is due now.
    ///
    /// - Throws: ``VirtualTimeError``; the clock is left where the loop stopped.
    public func advance(
        to target: ContinuousClock.Instant, in mode: RunLoop.Mode = .default, maxPasses: Int = 1_000_000
    ) throws(VirtualTimeError) {
        checkThread("advance(to:)")
        try checkNotNested("advance(to:)")
        guard maxPasses > 0 else { throw .invalidLimit(maxPasses) }
        let targetNs = RunLoop.nanoseconds(of: target)
        drive.beginDrive(stopWhenIdle: false, maxPasses: maxPasses, maxPassesAtInstant: Self.passesPerInstant)
        defer { drive.endDrive() }
        trail.begin()
        var idleRuns = 0
        while scope.nowNs < targetNs {
            let (passes, before) = (drive.passes, scope.nowNs)
            let result = runLoop.run(mode: mode, for: .nanoseconds(targetNs - scope.nowNs))
            try checkStop()
            // An empty mode (or .common, or a mode never made): time passes with nothing to do.
            if result == .finished { scope.setNow(targetNs) }
            try checkProgress(passes, before, &idleRuns)
        }
        try settle(in: mode, maxPassesAtInstant: Self.passesPerInstant, maxPasses: maxPasses - drive.passes)
    }

    /// Runs the loop in `mode` at the current instant until it would sleep: until no block, no
    /// signalled source, no due timer, no ready descriptor and no wakeup is left. The clock does
    /// not move (unless a callout moves it with ``elapse(_:)``, or a run it nests sleeps).
    ///
    /// - Parameters:
    ///   - mode: The mode to run in.
    ///   - maxPasses: The most passes at one instant: work that has not settled by then (a source
    ///     that signals itself, a block that performs itself, a zero-interval timer) is a livelock.
    ///     Work that moves the clock itself (``elapse(_:)``) never repeats an instant: 100 times
    ///     this many passes in all end it with ``VirtualTimeError/passLimit(at:passes:trail:)``.
    /// - Throws: ``VirtualTimeError/livelock(at:passes:trail:)`` naming the items that ran last.
    public func runUntilIdle(in mode: RunLoop.Mode = .default, maxPasses: Int = 10_000) throws(VirtualTimeError) {
        checkThread("runUntilIdle()")
        try checkNotNested("runUntilIdle()")
        guard maxPasses > 0 else { throw .invalidLimit(maxPasses) }
        trail.begin()
        let (total, overflow) = maxPasses.multipliedReportingOverflow(by: 100)
        try settle(in: mode, maxPassesAtInstant: maxPasses, maxPasses: overflow ? .max : total)
    }

    private func settle(in mode: RunLoop.Mode, maxPassesAtInstant: Int, maxPasses: Int) throws(VirtualTimeError) {
        drive.beginDrive(stopWhenIdle: true, maxPasses: max(1, maxPasses), maxPassesAtInstant: maxPassesAtInstant)
        defer { drive.endDrive() }
        var idleRuns = 0
        repeat {
            let (passes, before) = (drive.passes, scope.nowNs)
            let result = runLoop.run(mode: mode, for: .seconds(1_000_000_000))
            try checkStop()
            if result == .finished { return }
            try checkProgress(passes, before, &idleRuns)
            // The run ended at the point the loop would sleep; what ran after it in that pass
            // (afterWaiting observers, the blocks they performed) may have made more work.
        } while runLoop.hasWorkOnVirtualTime(inMode: mode)
    }

    /// A run that made no pass and left the clock alone (an `entry` observer that stops every
    /// run) counts as a pass at that instant: repeated, it is a livelock, not a hang.
    private func checkProgress(_ passesBefore: Int, _ nowBefore: Int64, _ idleRuns: inout Int) throws(VirtualTimeError) {
        guard drive.passes == passesBefore, scope.nowNs == nowBefore else {
            idleRuns = 0
            return
        }
        idleRuns += 1
        if idleRuns > drive.maxPassesAtInstant {
            throw .livelock(at: elapsed, passes: idleRuns - 1, trail: trail.lastCallouts())
        }
    }

    /// Moves the clock forward by `duration` without running the loop: what a callout that
    /// works (or blocks) that long does to the clock. From a callout, the loop then finds the
    /// timers that came due meanwhile late, as in production (a repeating timer skips the ticks
    /// it missed).
    ///
    /// - Precondition: `duration` is not negative.
    public func elapse(_ duration: Duration) {
        checkThread("elapse(_:)")
        fatalPrecondition(duration >= .zero, "VirtualTimeLoop.elapse: \(duration) is negative; virtual time never goes back")
        scope.setNow(RunLoop.nanoseconds(of: now + duration))
    }

    /// Passes at one instant that ``advance(by:in:maxPasses:)-9wgxh`` allows before it reports a livelock.
    public static let passesPerInstant = 10_000

    private func checkThread(_ function: StaticString) {
        // The scope's state is read only once the thread is known to be the scope's.
        fatalPrecondition(
            scope.isOnScopeThread,
            "VirtualTimeLoop.\(function): called from another thread; a virtual-time loop is used only on the thread withVirtualTime runs its body on"
        )
        fatalPrecondition(
            scope.isInnermost,
            "VirtualTimeLoop.\(function): called \(scope.hasLeft ? "after withVirtualTime returned" : "inside a nested withVirtualTime, whose clock and loop are the thread's now"); use the innermost scope's VirtualTimeLoop"
        )
    }

    private func checkNotNested(_ function: String) throws(VirtualTimeError) {
        if runLoop.runDepth > 0 { throw .calledFromCallout(function) }
    }

    private func checkStop() throws(VirtualTimeError) {
        guard let stop = drive.stop, stop != .idle else { return }
        let at = RunLoop.instant(ofNanoseconds: drive.stopNs) - start
        let names = trail.lastCallouts()
        switch stop {
        case .livelock: throw .livelock(at: at, passes: drive.passesAtInstant - 1, trail: names)
        case .passLimit: throw .passLimit(at: at, passes: drive.passes - 1, trail: names)
        case .sleepsForever: throw .sleepsForever(at: at, trail: names)
        case .clockStalled: throw .clockStalled(at: at, polls: VirtualTimeDrive.pollsPerInstant, trail: names)
        case .idle: return
        }
    }
}
