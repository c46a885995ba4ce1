import CRunLoopKit
import Glibc
import SystemPackage

// The Linux system calls the loop makes, one namespace per kernel facility, in the manner of
// SwiftNIO's `Linux.swift` and `System.swift`. Every call goes through `System.call`, which retries
// on EINTR and stops the process on EBADF/EFAULT where the descriptor is the library's own (a bug
// in the library, never a condition to handle); every other failure is thrown as an `Errno` for
// the caller to handle or report. Only `EpollBackend` and `FileIdentity` use these.

enum System {
    /// Whose descriptor a call works on: for the library's own (its epoll sets, eventfd, timerfd)
    /// EBADF and EFAULT are bugs; for a caller's, EBADF means the caller closed it.
    enum Owner {
        case library
        case caller
    }

    /// Runs the system call `body` until it does not fail with EINTR.
    ///
    /// - Throws: The `Errno` of any other failure.
    /// - Precondition: EBADF and EFAULT do not happen on the library's own descriptors; the
    ///   message names the call.
    @inline(__always)
    static func call<T: BinaryInteger>(
        _ name: StaticString, _ owner: Owner, _ body: () -> T
    ) throws(Errno) -> T {
        while true {
            let result = body()
            if result >= 0 { return result }
            let error = errno
            if error == EINTR { continue }
            if owner == .library && (error == EBADF || error == EFAULT) {
                fatalError("RunLoopKit: \(name) on one of the loop's own descriptors failed: \(Errno(rawValue: error)); this is a bug in RunLoopKit")
            }
            throw Errno(rawValue: error)
        }
    }

    /// Closes `fd`. EINTR from close(2) on Linux means the descriptor is closed already, so it is
    /// not retried (a retry could close a number reused meanwhile); other failures mean it was not
    /// open, which only the caller can know to be fine.
    static func close(_ fd: Int32) {
        _ = Glibc.close(fd)
    }
}

/// poll(2), for one descriptor without waiting.
enum Poll {
    /// Whether `fd` is readable now (or reports an error or hang-up, which a read would too).
    static func isReadable(_ fd: Int32) -> Bool {
        var entry = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
        // A zero timeout never blocks; EINTR then only means "not known to be ready".
        return Glibc.poll(&entry, 1, 0) == 1 && entry.revents != 0
    }
}

/// epoll(7).
enum Epoll {
    static func create() throws(Errno) -> Int32 {
        try System.call("epoll_create1", .library) { epoll_create1(Int32(EPOLL_CLOEXEC)) }
    }

    /// `epoll_ctl`: adds, changes or deletes `fd`'s registration in the library's set `epfd`, its
    /// events tagged with `tag`. `fd` may be a caller's descriptor: its EBADF is thrown.
    static func control(
        _ epfd: Int32, _ operation: Int32, fd: Int32, owner: System.Owner, events: UInt32, tag: UInt64
    ) throws(Errno) {
        var event = epoll_event()
        event.events = events
        event.data.u64 = tag
        _ = try System.call("epoll_ctl", owner) { epoll_ctl(epfd, operation, fd, &event) }
    }

    /// Waits up to `timeoutMs` (-1: no limit) for events; returns how many were written. EINTR
    /// returns 0 (a wakeup with nothing to report), so the caller re-evaluates its deadlines.
    static func wait(
        _ epfd: Int32, _ events: UnsafeMutablePointer<epoll_event>, capacity: Int32, timeoutMs: Int32
    ) -> Int32 {
        let count = epoll_wait(epfd, events, capacity, timeoutMs)
        if count >= 0 { return count }
        let error = errno
        if error == EINTR { return 0 }
        // EBADF, EFAULT, EINVAL: the set, the buffer or the capacity is wrong, all the library's.
        fatalError("RunLoopKit: epoll_wait on the loop's set \(epfd) failed: \(Errno(rawValue: error)); this is a bug in RunLoopKit")
    }

    static let readable = UInt32(CRLK_EPOLLIN)
    static let writable = UInt32(CRLK_EPOLLOUT)
    static let hangUp = UInt32(CRLK_EPOLLHUP)
    static let error = UInt32(CRLK_EPOLLERR)
}

/// eventfd(2) and timerfd(2) counters.
enum Counter {
    static func makeEventFD() throws(Errno) -> Int32 {
        try System.call("eventfd", .library) { eventfd(0, Int32(EFD_CLOEXEC) | Int32(EFD_NONBLOCK)) }
    }

    static func makeTimerFD() throws(Errno) -> Int32 {
        try System.call("timerfd_create", .library) {
            timerfd_create(CLOCK_BOOTTIME, Int32(TFD_CLOEXEC) | Int32(TFD_NONBLOCK))
        }
    }

    /// Adds one to an eventfd's counter. EAGAIN (the counter is full) means a wakeup is pending
    /// already, which is all a write wants.
    static func signal(_ fd: Int32, _ owner: System.Owner) throws(Errno) {
        var one: UInt64 = 1
        do throws(Errno) {
            _ = try System.call("write(eventfd)", owner) { write(fd, &one, 8) }
        } catch .resourceTemporarilyUnavailable {
            return
        }
    }

    /// Reads, and so resets, an eventfd or timerfd counter; EAGAIN (nothing to read) is fine.
    static func drain(_ fd: Int32, _ owner: System.Owner) throws(Errno) {
        var value: UInt64 = 0
        do throws(Errno) {
            _ = try System.call("read(counter)", owner) { read(fd, &value, 8) }
        } catch .resourceTemporarilyUnavailable {
            return
        }
    }

    /// Arms a timerfd for the absolute `CLOCK_BOOTTIME` deadline `deadlineNs`, or disarms it
    /// (nil).
    static func arm(_ fd: Int32, deadlineNs: Int64?) throws(Errno) {
        let target = deadlineNs.map { max(1, $0) } ?? -1
        _ = try System.call("timerfd_settime", .library) { crlk_timerfd_arm_abs(fd, target) }
    }
}

/// What a descriptor refers to (device and inode), to tell a number closed and reused from the
/// file it named, and what kind of file it is.
struct FileIdentity: Sendable {
    let device: UInt64
    let inode: UInt64
    /// A regular file or a directory: always "ready", so epoll refuses them.
    let isRegularFileOrDirectory: Bool
    /// A character device: some (/dev/null, /dev/zero) have no readiness to watch.
    let isCharacterDevice: Bool

    /// The identity of what `fd` names now, or the `Errno` of fstat(2) (EBADF: not open).
    static func of(_ fd: Int32) -> Result<FileIdentity, Errno> {
        var info = stat()
        guard fstat(fd, &info) == 0 else { return .failure(Errno(rawValue: errno)) }
        let kind = info.st_mode & S_IFMT
        return .success(
            FileIdentity(
                device: UInt64(info.st_dev), inode: UInt64(info.st_ino),
                isRegularFileOrDirectory: kind == S_IFREG || kind == S_IFDIR, isCharacterDevice: kind == S_IFCHR))
    }

    /// Whether two identities name the same file.
    func isSameFile(as other: FileIdentity) -> Bool { device == other.device && inode == other.inode }

    /// Whether `fd` still names the same file (false when it is closed, or names another file).
    func isStill(_ fd: Int32) -> Bool {
        guard case .success(let now) = Self.of(fd) else { return false }
        return now.isSameFile(as: self)
    }
}
