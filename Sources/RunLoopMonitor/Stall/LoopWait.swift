import CRunLoopMonitor
import Dispatch
import Glibc
import RunLoopKit
import Synchronization

/// Whether a loop's thread is parked in its own wait (an event loop's `epoll_wait` on its own
/// epoll set), read from `/proc/self/task/<tid>/syscall`: the tick sources of RunLoopMonitorNIO
/// and the heartbeat sources of its event loops share it.
///
/// The loop's own set is learnt: the first set the thread is seen waiting in (when the caller
/// allows learning) is taken for the loop's (it is, unless a handler waits in an epoll set of its
/// own before the loop was ever seen idle); a thread waiting in any other set is busy (a nested
/// CFRunLoop or RunLoopKit run, a library's own poller). What was learnt belongs to the thread it
/// was learnt for: a new thread (a new loop in a reused slot) learns afresh, even when a look
/// that read the old thread stores after the change.
package final class LoopWait: Sendable {
    /// The system calls an idle epoll-based event loop waits in, on this architecture (from its
    /// `<sys/syscall.h>`); empty where none is known (no judgement is made: callers fall back).
    package static let epollWaitCalls: Set<Int> = {
        let numbers: [Int] = [Int(crlm_sys_epoll_wait()), Int(crlm_sys_epoll_pwait()), Int(crlm_sys_epoll_pwait2())]
        return Set(numbers.filter { $0 >= 0 })
    }()

    /// The system calls the loop waits in.
    package let calls: Set<Int>
    /// The thread's kernel id in the high half, its loop's descriptor + 1 in the low half; 0
    /// while nothing is learnt.
    private let learnt = Atomic<UInt64>(0)

    /// Where a look found the thread.
    package enum Reading: Equatable {
        /// The thread does not exist.
        case gone
        /// Parked in its loop's own wait.
        case parked
        /// Running, or blocked anywhere else.
        case busy
        /// The kernel's file could not be read (no descriptor left).
        case unknown
    }

    /// Watching a loop that waits in one of `calls`.
    package init(calls: Set<Int>) { self.calls = calls }

    /// Where thread `threadID` is now; learns its loop's descriptor if it is parked in a wait for
    /// the first time and `mayLearn`. Any thread; one read of the kernel's file.
    package func read(threadID: Int32, mayLearn: Bool) -> Reading {
        switch ProcessThreads.kernelState(of: threadID) {
        case .gone: return .gone
        case .unknown: return .unknown
        case .running: return .busy
        case .blocked(let call, let descriptor):
            guard calls.contains(call) else { return .busy }
            let thread = UInt64(UInt32(bitPattern: threadID)) << 32
            let seen = thread | ((descriptor &+ 1) & 0xFFFF_FFFF)
            let known = learnt.load(ordering: .relaxed)
            if known != 0, known & 0xFFFF_FFFF_0000_0000 == thread { return known == seen ? .parked : .busy }
            if mayLearn { learnt.store(seen, ordering: .relaxed) }
            return .parked
        }
    }

    /// Forgets the learnt descriptor (the loop's thread changed).
    package func forget() { learnt.store(0, ordering: .relaxed) }
}
