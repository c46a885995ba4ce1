import CRunLoopKit

/// The loop's internal time base: nanoseconds on `CLOCK_BOOTTIME`, the clock Swift's
/// `ContinuousClock` reads on Linux.
///
/// `ContinuousClock.Instant` has no public raw value, so instants are converted through one
/// anchor pair taken at first use: `ns = anchor.ns + (instant - anchor.instant)`. Both directions
/// use the same anchor, so conversions round-trip exactly.
enum LoopClock {
    /// A deadline that never comes.
    static let never = Int64.max

    private static let anchor: (instant: ContinuousClock.Instant, ns: Int64) = {
        let instant = ContinuousClock.now
        let ns = crlk_boottime_ns()
        return (instant, ns)
    }()

    /// Now, in nanoseconds (a vDSO read, no system call).
    @inline(__always)
    static func now() -> Int64 { crlk_boottime_ns() }

    /// Converts an instant to the loop's nanoseconds, saturating far past or future.
    static func nanoseconds(_ instant: ContinuousClock.Instant) -> Int64 {
        anchor.ns.addingSaturated((instant - anchor.instant).saturatedNanoseconds)
    }

    /// Converts the loop's nanoseconds back to an instant.
    static func instant(_ ns: Int64) -> ContinuousClock.Instant {
        anchor.instant.advanced(by: .nanoseconds(ns.subtractingSaturated(anchor.ns)))
    }

    /// A deadline `duration` from `now`, with negative durations clamped to zero.
    static func deadline(after duration: Duration, from now: Int64) -> Int64 {
        now.addingSaturated(max(0, duration.saturatedNanoseconds))
    }
}

extension Duration {
    /// This duration in whole nanoseconds, saturated to `Int64`'s range (±292 years).
    var saturatedNanoseconds: Int64 {
        let (seconds, attoseconds) = components
        let (secondsNs, overflow) = seconds.multipliedReportingOverflow(by: 1_000_000_000)
        if overflow { return seconds < 0 ? Int64.min / 2 : Int64.max / 2 }
        return secondsNs.addingSaturated(attoseconds / 1_000_000_000)
    }
}

extension Int64 {
    @inline(__always)
    func addingSaturated(_ other: Int64) -> Int64 {
        let (sum, overflow) = addingReportingOverflow(other)
        return overflow ? (other > 0 ? .max : .min) : sum
    }

    @inline(__always)
    func subtractingSaturated(_ other: Int64) -> Int64 {
        let (diff, overflow) = subtractingReportingOverflow(other)
        return overflow ? (other < 0 ? .max : .min) : diff
    }
}
