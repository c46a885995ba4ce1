import CRunLoopKit
import Glibc
import SystemPackage

/// A timerfd on the loop's clock (`CLOCK_BOOTTIME`, which `ContinuousClock` reads) that expires on
/// an absolute grid, `first + k × interval`: no drift however late it is read, and a read returns
/// how many expirations passed (so a consumer counts missed ones instead of guessing). For the
/// scheduling module's display link; the descriptor is the caller's to watch (a
/// `FileDescriptorSource`) and to ``close()``.
///
/// In a child forked after it was made, the timerfd is the parent's open file: arming, disarming
/// and reading there do nothing (a read would take the parent's expirations).
package struct PeriodicTimerDescriptor: Sendable {
    /// The timerfd (non-blocking, close-on-exec).
    package let descriptor: Int32
    private let forkGeneration: UInt64

    /// A disarmed timer.
    package init() throws(Errno) {
        descriptor = try Counter.makeTimerFD()
        crlk_watch_forks()
        forkGeneration = crlk_fork_generation()
    }

    @inline(__always)
    private var inForkedChild: Bool { _slowPath(crlk_fork_generation() != forkGeneration) }

    /// Expires at `first` (nanoseconds on the loop's clock), then every `interval` nanoseconds.
    package func arm(firstNanoseconds first: Int64, intervalNanoseconds interval: Int64) throws(Errno) {
        if inForkedChild { return }
        _ = try System.call("timerfd_settime", .library) {
            crlk_timerfd_arm_periodic_abs(descriptor, max(1, first), max(1, interval))
        }
    }

    /// Stops expiring: the descriptor stays unreadable, so its loop is never woken by it.
    package func disarm() throws(Errno) {
        if inForkedChild { return }
        _ = try System.call("timerfd_settime", .library) { crlk_timerfd_arm_periodic_abs(descriptor, -1, 0) }
    }

    /// The expirations since the last read (0 when none: the read would block).
    package func takeExpirations() throws(Errno) -> UInt64 {
        if inForkedChild { return 0 }
        var count: UInt64 = 0
        do throws(Errno) {
            _ = try System.call("read(timerfd)", .library) { read(descriptor, &count, 8) }
        } catch .resourceTemporarilyUnavailable {
            return 0
        }
        return count
    }

    /// The loop clock's now, in nanoseconds (what ``arm(firstNanoseconds:intervalNanoseconds:)``
    /// takes).
    package static func nowNanoseconds() -> Int64 { crlk_boottime_ns() }

    /// Closes the descriptor.
    package func close() { System.close(descriptor) }
}
