import CRunLoopKit

/// The loop's internal time base: nanoseconds on `CLOCK_BOOTTIME`, the clock Swift's
/// `ContinuousClock` reads on Linux.
///
/// `ContinuousClock.Instant` is a frozen struct holding one `Duration` since the clock's epoch
/// (its ABI layout is fixed), so instants convert to and from nanoseconds exactly: an instant made
/// from ``now()`` compares correctly with `ContinuousClock.now`.
enum LoopClock {
    /// A deadline that never comes.
    static let never = Int64.max

    /// Now, in nanoseconds (a vDSO read, no system call).
    @inline(__always)
    static func now() -> Int64 { crlk_boottime_ns() }

    /// Converts an instant to the loop's nanoseconds, saturating far past or future.
    @inline(__always)
    static func nanoseconds(_ instant: ContinuousClock.Instant) -> Int64 {
        unsafeBitCast(instant, to: Duration.self).saturatedNanoseconds
    }

    /// Converts the loop's nanoseconds back to an instant.
    @inline(__always)
    static func instant(_ ns: Int64) -> ContinuousClock.Instant {
        unsafeBitCast(Duration.nanoseconds(ns), to: ContinuousClock.Instant.self)
    }

    /// A deadline `duration` from `now`, with negative durations clamped to zero.
    static func deadline(after duration: Duration, from now: Int64) -> Int64 {
        now.addingSaturated(max(0, duration.saturatedNanoseconds))
    }
}

extension Duration {
    /// This duration in whole nanoseconds (rounded toward zero), saturated to `Int64`'s range
    /// (±292 years).
    @inline(__always)
    var saturatedNanoseconds: Int64 {
        let ns = attoseconds / 1_000_000_000
        if ns > Int128(Int64.max) { return .max }
        if ns < Int128(Int64.min) { return .min }
        return Int64(ns)
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
