import CRunLoopKit
import Glibc
import Synchronization
import SystemPackage

/// The kernel side of one run loop: an epoll instance the loop sleeps in, an eventfd other
/// threads write to wake it, and a timerfd armed for the loop's next timer deadline.
///
/// Events carry a tag instead of the descriptor number, so a number the kernel reuses can never
/// deliver a stale event to a new owner.
final class KernelWaiter: Sendable {
    static let wakeTag: UInt64 = 1
    static let timerTag: UInt64 = 2

    let epollFD: Int32
    let wakeFD: Int32
    let timerFD: Int32
    /// `true` once the descriptors are closed. Wakers hold it while writing so that a teardown
    /// can never close the eventfd between their check and their write (the number could be
    /// reused by then).
    private let closed = Mutex(false)

    /// Opens the descriptors.
    ///
    /// - Throws: The `Errno` of the first system call that failed (`EMFILE` when the process is out
    ///   of descriptors); nothing is leaked.
    init() throws(Errno) {
        let epollFD = try Syscall.epollCreate()
        var opened = [epollFD]
        do throws(Errno) {
            let wakeFD = try Syscall.eventFD()
            opened.append(wakeFD)
            let timerFD = try Syscall.timerFD()
            opened.append(timerFD)
            try Syscall.epollAdd(epollFD, fd: wakeFD, events: UInt32(CRLK_EPOLLIN), tag: Self.wakeTag)
            try Syscall.epollAdd(epollFD, fd: timerFD, events: UInt32(CRLK_EPOLLIN), tag: Self.timerTag)
            self.epollFD = epollFD
            self.wakeFD = wakeFD
            self.timerFD = timerFD
        } catch {
            for fd in opened { Syscall.close(fd) }
            throw error
        }
    }

    /// Wakes the loop: makes its eventfd readable. Safe from any thread, after close too.
    func signal() {
        closed.locked { closed in
            guard !closed else { return }
            do throws(Errno) { try Syscall.eventFDSignal(wakeFD) } catch {
                // Only EBADF/EINVAL are possible here, and they would be a bug in this type.
                preconditionFailure("RunLoopKit: writing the wakeup eventfd \(wakeFD) failed: \(error)")
            }
        }
    }

    /// Closes the descriptors; later signals do nothing.
    func close() {
        closed.locked { closed in
            guard !closed else { return }
            closed = true
            Syscall.close(epollFD)
            Syscall.close(wakeFD)
            Syscall.close(timerFD)
        }
    }

    deinit { close() }
}

/// A wakeup that needs no descriptor: a futex word, where a loop that could not open its kernel
/// descriptors sleeps (`crlk_futex_wait` / `crlk_futex_post`).
///
/// `@unchecked Sendable` is safe because the word is only ever read and written through the C
/// atomics of those two functions, and it is freed only when the last reference goes.
final class FutexWord: @unchecked Sendable {
    private let word: UnsafeMutablePointer<UInt32>

    init() {
        word = .allocate(capacity: 1)
        word.initialize(to: 0)
    }

    deinit { word.deallocate() }

    /// Wakes the sleeper (or makes its next wait return at once).
    func post() { crlk_futex_post(word) }

    /// Sleeps until posted or `timeoutNs` passes; consumes a post.
    func wait(timeoutNs: Int64) { _ = crlk_futex_wait(word, timeoutNs) }
}
