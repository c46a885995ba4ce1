import CRunLoopKit
import Glibc
import SystemPackage

/// Thin wrappers over the Linux system calls the loop uses, in the manner of SwiftNIO's
/// `Linux.swift`: each retries on `EINTR` and turns failure into an `Errno`.
enum Syscall {
    /// Runs `body` until it does not fail with `EINTR`; throws the `Errno` of any other failure.
    @inline(__always)
    static func retryingOnInterrupt<T: BinaryInteger>(_ body: () -> T) throws(Errno) -> T {
        while true {
            let result = body()
            if result >= 0 { return result }
            let error = errno
            if error == EINTR { continue }
            throw Errno(rawValue: error)
        }
    }

    static func epollCreate() throws(Errno) -> Int32 {
        try retryingOnInterrupt { epoll_create1(Int32(EPOLL_CLOEXEC)) }
    }

    static func eventFD() throws(Errno) -> Int32 {
        try retryingOnInterrupt { eventfd(0, Int32(EFD_CLOEXEC) | Int32(EFD_NONBLOCK)) }
    }

    static func timerFD() throws(Errno) -> Int32 {
        try retryingOnInterrupt { timerfd_create(CLOCK_BOOTTIME, Int32(TFD_CLOEXEC) | Int32(TFD_NONBLOCK)) }
    }

    /// `epoll_ctl`: adds (`EPOLL_CTL_ADD`), changes (`EPOLL_CTL_MOD`) or removes
    /// (`EPOLL_CTL_DEL`) `fd`'s registration in `epfd`, its events tagged with `tag`.
    static func epollControl(_ epfd: Int32, _ operation: Int32, fd: Int32, events: UInt32, tag: UInt64) throws(Errno) {
        var event = epoll_event()
        event.events = events
        event.data.u64 = tag
        _ = try retryingOnInterrupt { epoll_ctl(epfd, operation, fd, &event) }
    }

    /// Registers `fd` with `epfd` for `events`, tagging its events with `tag`.
    static func epollAdd(_ epfd: Int32, fd: Int32, events: UInt32, tag: UInt64) throws(Errno) {
        var event = epoll_event()
        event.events = events
        event.data.u64 = tag
        _ = try retryingOnInterrupt { epoll_ctl(epfd, EPOLL_CTL_ADD, fd, &event) }
    }

    /// Waits for events; returns how many were written to `events`. `EINTR` returns 0 (a wakeup
    /// with nothing to handle) so the caller re-evaluates its deadlines.
    static func epollWait(
        _ epfd: Int32, _ events: UnsafeMutablePointer<epoll_event>, capacity: Int32, timeoutMs: Int32
    ) throws(Errno) -> Int32 {
        let count = epoll_wait(epfd, events, capacity, timeoutMs)
        if count >= 0 { return count }
        let error = errno
        if error == EINTR { return 0 }
        throw Errno(rawValue: error)
    }

    /// Adds one to an eventfd's counter. `EAGAIN` (the counter is full) means a wakeup is already
    /// pending, which is all a write wants.
    static func eventFDSignal(_ fd: Int32) throws(Errno) {
        var one: UInt64 = 1
        while true {
            let written = write(fd, &one, 8)
            if written == 8 { return }
            let error = errno
            if error == EINTR { continue }
            if error == EAGAIN { return }
            throw Errno(rawValue: error)
        }
    }

    /// Reads and so resets an eventfd or timerfd counter; `EAGAIN` (nothing to read) is fine.
    static func drainCounter(_ fd: Int32) throws(Errno) {
        var value: UInt64 = 0
        while true {
            let count = read(fd, &value, 8)
            if count >= 0 { return }
            let error = errno
            if error == EINTR { continue }
            if error == EAGAIN { return }
            throw Errno(rawValue: error)
        }
    }

    /// Arms a timerfd for the absolute `CLOCK_BOOTTIME` deadline, or disarms it for
    /// `LoopClock.never`.
    static func armTimer(_ fd: Int32, deadlineNs: Int64) throws(Errno) {
        let target = deadlineNs == LoopClock.never ? -1 : max(1, deadlineNs)
        _ = try retryingOnInterrupt { crlk_timerfd_arm_abs(fd, target) }
    }

    /// Closes `fd`. `EINTR` from close(2) on Linux means the descriptor is closed already, so it is
    /// not retried (retrying could close a reused number).
    static func close(_ fd: Int32) {
        _ = Glibc.close(fd)
    }
}
