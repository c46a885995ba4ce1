import CRunLoopKit
import Glibc

// What stress and load tests share across test targets (RunLoopKitTests' robustness suites, the
// lab's echo server tests): a replayable seed, elapsed seconds for reports, unbuffered output.

/// A seed for this run: `RUNLOOPKIT_STRESS_SEED` if set, else from the clock. Tests print it with
/// their failures so that a run can be replayed.
public func stressSeed() -> UInt64 {
    if let raw = getenv("RUNLOOPKIT_STRESS_SEED"), let seed = UInt64(String(cString: raw)) { return seed }
    return UInt64(bitPattern: crlk_boottime_ns())
}

/// Seconds since `start`, for reports.
public func secondsSince(_ start: ContinuousClock.Instant) -> Double {
    let (seconds, attoseconds) = (ContinuousClock.now - start).components
    return Double(seconds) + Double(attoseconds) / 1e18
}

/// Writes `text` to the standard error descriptor directly (unbuffered).
public func writeToStandardError(_ text: String) {
    var text = text
    text.withUTF8 { bytes in _ = write(2, bytes.baseAddress, bytes.count) }
}
