import Glibc
import SharedTestSupport
import Testing

@testable import RunLoopKit

/// Findings 2 and 3: dates the loop must survive.
///
/// 2. A timer's fire date far in the past (10^10 s ago: beyond what nanoseconds in an `Int64`
///    hold) must not overflow the loop's arithmetic. As in CoreFoundation, a fire date in the past
///    counts as now for the firing, when the timer is made and when `fireDate` is set: the timer
///    fires at once (first pass), then keeps its interval. `fireDate` reports the date as given
///    (saturated) until the timer fires, as `CFRunLoopTimerGetNextFireDate` does.
/// 3. The `Date` entry points (`run(until:)`, `run(mode:before:)`, `acceptInput(mode:before:)`)
///    take any date: +infinity and 1e30 mean no limit, -infinity and NaN a date in the past (one
///    pass, no sleep).
///
/// The scenarios that trap on a broken library (an overflow, a `Duration` made from a NaN) run
/// in `HostileProbe`, so that a trap fails one test instead of ending the test process.
@Suite(.serialized) struct HostileDateTests {
    // MARK: Finding 2

    /// Made with a fire date in the past, a timer reports that date (1 s ago; 10^10 s ago,
    /// saturated, without a trap), as `CFRunLoopTimerGetNextFireDate` does.
    @Test(arguments: [1.0, 1e10])
    func aFireDateInThePastIsReportedAsGivenWhenTheTimerIsMade(secondsAgo: Double) {
        let before = ContinuousClock.now
        let given = before - .seconds(secondsAgo)
        let timer = RunLoopTimer(fireAt: given, interval: .milliseconds(10)) { _ in }
        #expect(timer.fireDate < before - .seconds(secondsAgo / 2), "fireDate \(timer.fireDate), given \(given)")
    }

    /// Setting `fireDate` to a date in the past on a timer not yet in a loop: reported as given.
    @Test(arguments: [1.0, 1e10])
    func aFireDateInThePastIsReportedAsGivenWhenSet(secondsAgo: Double) {
        let timer = RunLoopTimer(after: .seconds(3600), repeating: .milliseconds(10)) { _ in }
        let before = ContinuousClock.now
        timer.fireDate = before - .seconds(secondsAgo)
        #expect(timer.fireDate < before - .seconds(secondsAgo / 2), "fireDate \(timer.fireDate)")
    }

    /// Made with a fire date 10^10 s in the past, a 10 ms repeating timer fires in the run's first
    /// pass and then every 10 ms: about 10 fires in a 105 ms run (5...12 leaves room for a loaded
    /// machine; a timer stuck in the past would fire on every pass, one that waits 10^10 s never).
    @Test func aTimerMadeWithAFireDateFarInThePastFiresAtOnceThenKeepsItsInterval() throws {
        let probe = try #require(runHostileProbe("past-fire-date-created"))
        try #require(probe.completed, "\(probe.report)")
        #expect(probe.bool("fireDate reported in the past") == true, "\(probe.report)")
        #expect(probe.int("first fire in pass") == 1, "it fires in the first pass: \(probe.report)")
        let fires = probe.int("fires in 105 ms") ?? -1
        #expect((5...12).contains(fires), "\(fires) fires in 105 ms: \(probe.report)")
        #expect(probe.bool("loop thread finished") == true, "\(probe.report)")
    }

    /// The same fire date set from another thread while the loop sleeps (on a 10 ms repeating
    /// timer due in an hour): the loop wakes, the timer fires at once (well within 50 ms, a bound
    /// for a loaded machine) and then every 10 ms, about 11 times in the 105 ms after the set.
    @Test func aFireDateFarInThePastSetWhileTheLoopSleepsFiresAtOnceThenKeepsItsInterval() throws {
        let probe = try #require(runHostileProbe("past-fire-date-set"))
        try #require(probe.completed, "\(probe.report)")
        #expect(probe.bool("fireDate reported in the past") == true, "\(probe.report)")
        #expect(probe.bool("loop thread finished") == true, "the loop must wake and its run end: \(probe.report)")
        let first = probe.double("first fire after the set ms") ?? -1
        #expect(first >= 0 && first < 50, "first fire \(first) ms after the set: \(probe.report)")
        let fires = probe.int("fires within 105 ms of the set") ?? -1
        #expect((5...12).contains(fires), "\(fires) fires in the 105 ms after the set: \(probe.report)")
    }

    // MARK: Finding 3

    /// The three `Date` entry points.
    enum Entry: String, CaseIterable, Sendable {
        case runUntil = "run-until"
        case runBefore = "run-before"
        case acceptInput = "accept-input"
    }

    /// A date without limit (+infinity, 1e30 s after the reference date): the call runs until
    /// the scenario ends it — `run(mode:before:)` and `acceptInput` by a 20 ms timer calling
    /// `stop()` (a keep-alive source holds the mode), `run(until:)` (which `stop()` does not end)
    /// by the mode becoming empty once that one-shot timer has fired.
    @Test(arguments: Entry.allCases, ["inf", "1e30"])
    func aDateWithoutLimitRunsUntilStoppedWithoutCrashing(_ entry: Entry, _ value: String) throws {
        let probe = try #require(runHostileProbe("date", entry.rawValue, value))
        try #require(probe.completed, "\(probe.report)")
        #expect(probe.bool("timer fired") == true, "the run ended before its timer fired: \(probe.report)")
        let elapsed = probe.double("returned after ms") ?? -1
        // At least the timer's 20 ms (less a millisecond of clock granularity); at most 5 s, a
        // bound for a loaded machine that a run without limit which missed its end would pass.
        #expect(elapsed >= 19 && elapsed < 5000, "returned after \(elapsed) ms: \(probe.report)")
        if entry == .runBefore {
            #expect(probe.value("run(mode:before:) returned") == "true", "\(probe.report)")
        }
    }

    /// A date in the past that is not finite (-infinity), or not a number at all (NaN, which
    /// compares false with everything, taken as a date in the past): one pass without sleeping,
    /// returning at once (within 1 s, a bound for a loaded machine; a sleep, even a short one,
    /// shows in the count of `beforeWaiting` calls).
    @Test(arguments: Entry.allCases, ["-inf", "nan"])
    func aDateInThePastOrNaNMakesOnePassWithoutSleepingOrCrashing(_ entry: Entry, _ value: String) throws {
        let probe = try #require(runHostileProbe("date", entry.rawValue, value))
        try #require(probe.completed, "\(probe.report)")
        let elapsed = probe.double("returned after ms") ?? -1
        #expect(elapsed >= 0 && elapsed < 1000, "returned after \(elapsed) ms: \(probe.report)")
        #expect(probe.int("runs entered") == 1, "one run: \(probe.report)")
        #expect(probe.int("sleeps") == 0, "no beforeWaiting, no sleep: \(probe.report)")
    }
}
