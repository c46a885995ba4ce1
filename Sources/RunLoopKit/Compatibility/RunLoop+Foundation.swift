#if canImport(FoundationEssentials)
import FoundationEssentials
#else
import Foundation
#endif

// Foundation's shapes, for code ported from NSRunLoop and NSTimer: the `Date` forms of the run
// entry points and timers made from `Date` and `TimeInterval`. RunLoopKit's own deadline type is
// `ContinuousClock.Instant` (a monotonic clock: a wall-clock change cannot stretch a run); a `Date`
// here is turned into a time from now once, when the call is made.

extension RunLoop {
    /// The time from now until `date`. A date in the past, and NaN (no date at all, which
    /// CoreFoundation would take as "forever"), give zero: one pass that does not sleep. Dates
    /// beyond the clock's range (`Date.distantFuture` is well within it; an infinite date or
    /// `1e30` s is not) mean no limit.
    static func timeout(until date: Date) -> Duration {
        let seconds = date.timeIntervalSinceNow
        guard seconds > 0 else { return .zero }  // NaN compares false
        guard seconds < 1e12 else { return .seconds(Int64.max) }  // saturates to "never"
        return .seconds(seconds)
    }

    /// Runs in ``Mode/default`` until `deadline` (NSRunLoop's `runUntilDate:`): repeats
    /// ``run(mode:before:)-(_,Date)``, so ``stop()`` ends only the current pass, not the whole
    /// call; it returns early only when the mode has nothing to do. A NaN date makes one pass; an
    /// infinite date runs until the mode is empty. ``run(until:)-(ContinuousClock.Instant)`` is
    /// the same for a monotonic deadline.
    ///
    /// - Precondition: Called on the loop's own thread.
    public func run(until deadline: Date) {
        repeat {
            if !runOnce(mode: .default, for: Self.timeout(until: deadline)) { break }
        } while deadline.timeIntervalSinceNow > 0
    }

    /// Runs once in `mode` until `deadline` or until a source is handled (NSRunLoop's
    /// `runMode:beforeDate:`). Returns false without running if the mode has nothing to do (or is
    /// ``Mode/common``), true otherwise.
    ///
    /// - Precondition: Called on the loop's own thread.
    @discardableResult
    public func run(mode: Mode, before deadline: Date) -> Bool {
        runOnce(mode: mode, for: Self.timeout(until: deadline))
    }

    /// Runs once in `mode` until `deadline` or until a source is handled (NSRunLoop's
    /// `acceptInputForMode:beforeDate:`).
    ///
    /// - Precondition: Called on the loop's own thread.
    public func acceptInput(mode: Mode, before deadline: Date) {
        acceptInputOnce(mode: mode, for: Self.timeout(until: deadline))
    }
}
