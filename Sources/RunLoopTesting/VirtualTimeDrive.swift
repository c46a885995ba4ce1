import RunLoopKit

/// What a drive of a ``VirtualTimeLoop`` allows, and what the loop reports back: the policy the
/// core's virtual-time wait asks (`VirtualTimePolicy`). Used on the thread on virtual time only
/// (the loop's and the driver's, which is the same thread).
final class VirtualTimeDrive: VirtualTimePolicy {
    /// Why the loop itself ended a run.
    enum Stop: Sendable, Equatable {
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
    static let pollsPerInstant = 1_000_000
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
    var stopWhenIdle = false
    /// Passes allowed at one instant, and in one drive (no limit between drives: a run the test's
    /// body makes itself behaves as in production).
    var maxPassesAtInstant = Int.max
    var maxPasses = Int.max
    /// Passes since ``beginDrive(stopWhenIdle:maxPasses:maxPassesAtInstant:)``.
    private(set) var passes = 0
    /// Passes at the current instant.
    private(set) var passesAtInstant = 0
    private var instant = Int64.min
    /// Why the loop ended the drive's run, if it did (a broken limit ends every run out to the
    /// driver: each wait checks it first).
    private(set) var stop: Stop?
    /// The clock when ``stop`` was recorded.
    private(set) var stopNs: Int64 = 0
    /// Runs ended because a limit was broken: a loop in a callout that keeps starting runs (a
    /// keep-alive `while` loop) cannot be unwound, and past ``unwindLimit`` the process stops
    /// with the reason instead of spinning.
    private var unwoundRuns = 0
    static let unwindLimit = 100_000

    init() {}

    /// The stop recorded, unless it is ``Stop/idle`` (which ends only the driver's run).
    var brokenLimit: Stop? { stop == .idle ? nil : stop }

    // MARK: VirtualTimePolicy

    func passEndsEveryRun(at now: Int64) -> Bool {
        guard let broken = brokenLimit ?? countPass(at: now) else { return false }
        record(broken, at: now)
        countUnwoundRun()
        return true
    }

    func endsRunWhereItWouldSleep(at now: Int64, outermost: Bool) -> Bool {
        guard stopWhenIdle && outermost else { return false }
        record(.idle, at: now)
        return true
    }

    func sleepsForever(at now: Int64) {
        record(.sleepsForever, at: now)
    }

    func deadlinePolled(at now: Int64) -> Bool {
        // Outside a drive (the test's body running the loop itself) the loop behaves as in
        // production: nothing is counted, and no stop is recorded that would end later runs.
        guard driving else { return false }
        return countPoll(at: now)
    }

    /// A drive (`advance`, `runUntilIdle`) is in progress.
    private var driving = false

    /// Resets the counts and the stop for a new drive.
    func beginDrive(stopWhenIdle: Bool, maxPasses: Int, maxPassesAtInstant: Int) {
        driving = true
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
    func endDrive() {
        beginDrive(stopWhenIdle: false, maxPasses: .max, maxPassesAtInstant: .max)
        driving = false
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
