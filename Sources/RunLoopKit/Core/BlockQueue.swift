import CRunLoopKit
import DequeModule
import Glibc
import Synchronization

/// The queue that carries ``RunLoop/perform(inModes:_:)`` blocks from any thread to the loop's
/// thread.
///
/// A deque behind a small test-and-test-and-set lock. Each critical section is one `append` (a
/// producer) or one `swap` of the whole deque (the loop taking everything queued), a few
/// nanoseconds, so the lock is held too briefly to be worth parking a thread for:
/// `Synchronization.Mutex` sends contended waiters down its kernel slow path, which measured
/// about a sixth of the time of a producer and a loop exchanging a million blocks. Waiters here
/// spin with a CPU pause, then yield the CPU if the holder was descheduled.
///
/// A linked lock-free queue was tried too: it costs a node allocation per block, freed on the
/// other thread, and glibc's per-thread caches made that slower than this lock.
///
/// `@unchecked Sendable`: `pending` is read and written only while `locked` is held (acquired
/// with an acquiring exchange, released with a releasing store), and `hasPending` is atomic.
final class BlockQueue: @unchecked Sendable {
    private let locked = Atomic<Bool>(false)
    private var pending = Deque<PendingBlock>()
    private let hasPending = Atomic<Bool>(false)

    /// Appends a block. Any thread.
    ///
    /// - Complexity: O(1) amortized.
    func push(_ block: PendingBlock) {
        lock()
        pending.append(block)
        hasPending.store(true, ordering: .relaxed)
        unlock()
    }

    /// Whether blocks are queued (a hint: exact for the consumer once it has synchronized with the
    /// producer through the loop's wakeup flag).
    var hasReady: Bool { hasPending.load(ordering: .acquiring) }

    /// Moves every queued block, in order, to the end of `destination` (emptied by swapping when
    /// it is empty, so its storage is reused). Consumer only.
    func takeAll(appendingTo destination: inout Deque<PendingBlock>) {
        guard hasPending.load(ordering: .acquiring) else { return }
        lock()
        if destination.isEmpty {
            swap(&pending, &destination)
        } else {
            destination.append(contentsOf: pending)
            pending.removeAll(keepingCapacity: true)
        }
        hasPending.store(false, ordering: .relaxed)
        unlock()
    }

    /// Drops every queued block.
    func removeAll() {
        lock()
        pending.removeAll()
        hasPending.store(false, ordering: .relaxed)
        unlock()
    }

    @inline(__always)
    private func lock() {
        while locked.exchange(true, ordering: .acquiring) {
            var spins = 0
            while locked.load(ordering: .relaxed) {
                spins += 1
                if spins < 64 { crlk_cpu_relax() } else { sched_yield() }
            }
        }
    }

    @inline(__always)
    private func unlock() { locked.store(false, ordering: .releasing) }
}
