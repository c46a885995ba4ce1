import CRunLoopKit
import Glibc
import Synchronization
import Testing

@testable import RunLoopKit

/// Issue 2's robustness tests: stress, thread exit, bad input, lost wakeups.
///
/// The suites are serialized among themselves: several of them load both cores for seconds, and
/// their time bounds assume they do not compete with each other. Iteration counts scale with
/// `RUNLOOPKIT_STRESS_SCALE` (default 1; 0.1 under a sanitizer) and time-boxed phases with
/// `RUNLOOPKIT_STRESS_SECONDS`.
@Suite(.serialized) struct Robustness {}

/// A seed for this run: `RUNLOOPKIT_STRESS_SEED` if set, else from the clock.
func stressSeed() -> UInt64 {
    if let raw = getenv("RUNLOOPKIT_STRESS_SEED"), let seed = UInt64(String(cString: raw)) { return seed }
    return UInt64(bitPattern: crlk_boottime_ns())
}

/// Seconds since `start`, for reports.
func secondsSince(_ start: ContinuousClock.Instant) -> Double {
    let (seconds, attoseconds) = (ContinuousClock.now - start).components
    return Double(seconds) + Double(attoseconds) / 1e18
}

/// Writes `text` to the standard error descriptor directly (unbuffered).
func writeToStandardError(_ text: String) {
    var text = text
    text.withUTF8 { bytes in _ = write(2, bytes.baseAddress, bytes.count) }
}
