import CRunLoopKit
import Glibc
import SharedTestSupport
import Synchronization
import Testing

@testable import RunLoopKit

// The robustness tests: stress, thread exit, bad input, lost wakeups (and the keep-alive, echo
// server and dead-loop suites). Their suites are marked `.exclusive(.robustness)`
// (SharedTestSupport): several load both cores for seconds or count the process's threads and
// descriptors exactly, and their bounds assume no other suite of the group runs alongside.
// Iteration counts scale with `RUNLOOPKIT_STRESS_SCALE` (default 1; 0.1 under a sanitizer) and
// time-boxed phases with `RUNLOOPKIT_STRESS_SECONDS`.

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
