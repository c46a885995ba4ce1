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

extension RunLoopTimer {
    /// A timer that first fires at `date` and then, if `repeats`, every `interval` seconds:
    /// Foundation's `Timer(fire:interval:repeats:block:)`. Add it to a loop to start it.
    ///
    /// As in Foundation, a repeating timer's interval of zero or less becomes 0.1 ms, and a
    /// one-shot timer ignores `interval`. A date in the past (or NaN) fires at the loop's next
    /// pass; an interval or date beyond the clock's range (infinity) means never.
    public convenience init(
        fire date: Date, interval: TimeInterval, repeats: Bool, block: @escaping @Sendable (RunLoopTimer) -> Void
    ) {
        let delay = RunLoop.timeout(until: date)
        self.init(
            fireAt: LoopClock.instant(LoopClock.now().addingSaturated(delay.saturatedNanoseconds)),
            interval: repeats ? Self.repeatInterval(seconds: interval) : .zero, handler: block)
    }

    /// A timer that first fires `interval` seconds after it is made and then, if `repeats`,
    /// every `interval` seconds: Foundation's `Timer(timeInterval:repeats:block:)`, with Darwin's
    /// first fire date (swift-corelibs-foundation fires such a timer at once instead). Add it to a
    /// loop to start it.
    public convenience init(
        timeInterval interval: TimeInterval, repeats: Bool, block: @escaping @Sendable (RunLoopTimer) -> Void
    ) {
        self.init(fire: Date(timeIntervalSinceNow: interval.isNaN ? 0 : interval), interval: interval, repeats: repeats, block: block)
    }

    /// Makes a timer as ``init(timeInterval:repeats:block:)`` does and adds it to the calling
    /// thread's loop in ``RunLoop/Mode/default``: Foundation's
    /// `Timer.scheduledTimer(withTimeInterval:repeats:block:)`. Remember NSTimer's first pitfall:
    /// such a timer stops while the loop runs in ``RunLoop/Mode/tracking``; add it to
    /// ``RunLoop/Mode/common`` yourself when it must keep firing.
    @discardableResult
    public static func scheduledTimer(
        withTimeInterval interval: TimeInterval, repeats: Bool, block: @escaping @Sendable (RunLoopTimer) -> Void
    ) -> RunLoopTimer {
        let timer = RunLoopTimer(timeInterval: interval, repeats: repeats, block: block)
        RunLoop.current.add(timer, forMode: .default)
        return timer
    }

    /// The repeat interval in seconds (0 for a one-shot timer): Foundation's `timeInterval`.
    public var timeInterval: TimeInterval { Double(interval.saturatedNanoseconds) / 1e9 }

    /// Foundation's rule for a repeating timer's interval: at least 0.1 ms; infinite means never
    /// again (the clock saturates).
    static func repeatInterval(seconds: TimeInterval) -> Duration {
        guard seconds > 0.0001 else { return .microseconds(100) }  // NaN compares false
        guard seconds < 1e12 else { return .seconds(Int64.max) }
        return .seconds(seconds)
    }
}
