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

    /// Now, in nanoseconds: a vDSO read of CLOCK_BOOTTIME (no system call), or the calling
    /// thread's virtual clock while it is on virtual time (RunLoopTesting).
    @inline(__always)
    static func now() -> Int64 { crlk_loop_now_ns() }

    /// `ns`, or now if `ns` is in the past: CoreFoundation's rule for timer fire dates. A date well
    /// in the future (the usual case) is known to be so from the coarse clock, without a precise
    /// read.
    @inline(__always)
    static func notBeforeNow(_ ns: Int64) -> Int64 {
        if ns > crlk_loop_now_upper_bound_ns() { return ns }
        return max(ns, now())
    }

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
    ///
    /// Runs for every timer made or scheduled, three times per `RunLoopTimer` init, so it avoids
    /// division instructions on 128-bit values (a `div` of 128 by 64 bits takes 40–90 cycles):
    /// with `2^64 = q·10^9 + r` (q = 18,446,744,073, r = 709,551,616), the high word contributes
    /// `high·q` whole nanoseconds plus `high·r` attoseconds, which join the low word; what is left
    /// is a 64-bit division by a constant, which compiles to a multiplication.
    ///
    /// - Complexity: O(1).
    @inline(__always)
    package var saturatedNanoseconds: Int64 {
        let atto = attoseconds
        let magnitude = atto.magnitude
        let high = UInt64(truncatingIfNeeded: magnitude >> 64)
        let low = UInt64(truncatingIfNeeded: magnitude)
        // From 2^63 nanoseconds (high ≥ 5·10^8) on, the result does not fit.
        guard high < 500_000_000 else { return atto < 0 ? .min : .max }
        let wholeFromHigh: UInt64 = 18_446_744_073
        let restFromHigh: UInt64 = 709_551_616
        var quotient = high &* wholeFromHigh
        var (rest, carry) = (high &* restFromHigh).addingReportingOverflow(low)
        while carry {
            // rest stands for 2^64 + rest: move the 2^64 out as whole nanoseconds again.
            quotient &+= wholeFromHigh
            (rest, carry) = rest.addingReportingOverflow(restFromHigh)
        }
        quotient &+= rest / 1_000_000_000
        guard quotient <= UInt64(Int64.max) else { return atto < 0 ? .min : .max }
        return atto < 0 ? -Int64(quotient) : Int64(quotient)
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

extension RunLoop {
    /// Now, on the clock RunLoopKit's timers and deadlines use on the calling thread:
    /// `ContinuousClock.now`, or the thread's virtual clock inside RunLoopTesting's
    /// `withVirtualTime` (compute a timer's fire date or a run's deadline from this, and a test on
    /// virtual time stays deterministic).
    public static var now: ContinuousClock.Instant { LoopClock.instant(LoopClock.now()) }

    /// `instant` in the loop clock's nanoseconds (saturated far in the past or future).
    package static func nanoseconds(of instant: ContinuousClock.Instant) -> Int64 { LoopClock.nanoseconds(instant) }

    /// The loop clock now, in nanoseconds (the calling thread's virtual clock on virtual time):
    /// what recorders stamp events with.
    package static var clockNanoseconds: Int64 { LoopClock.now() }

    /// The instant of the loop clock's `nanoseconds`.
    package static func instant(ofNanoseconds nanoseconds: Int64) -> ContinuousClock.Instant {
        LoopClock.instant(nanoseconds)
    }
}
