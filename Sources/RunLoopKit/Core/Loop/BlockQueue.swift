import CRunLoopKit
import DequeModule
import Glibc
import Synchronization

/// The queue that carries ``RunLoop/perform(inModes:_:)->()`` blocks from any thread to the loop's
/// thread.
///
/// Double buffering behind a small test-and-test-and-set lock. Producers append to the queue's
/// ``BlockBuffer``; the loop takes the whole buffer at once by exchanging it for an empty one it
/// kept from last time, then runs the blocks outside the lock. Each critical section is one
/// append or one pointer exchange, a few nanoseconds, so the lock is held too briefly to be worth
/// parking a thread for: `Synchronization.Mutex` sends contended waiters down its kernel slow
/// path, which measured about a sixth of the time of a producer and a loop exchanging a million
/// blocks. Waiters here spin with a CPU pause, then yield the CPU if the holder was descheduled.
///
/// Blocks are moved into and out of the buffer (no retain and release of the closure on the
/// way), which a `Deque` append could not do: it copied the element, a retain on the producer and
/// a release later, about a sixth of a producer's time.
///
/// A linked lock-free queue was tried too: it costs a node allocation per block, freed on the
/// other thread, and glibc's per-thread caches made that slower than this lock.
///
/// Only the push that finds the queue empty asks for a wakeup, under the lock (`firstPush`):
/// while blocks wait, a push writes nothing the loop reads, so a producer running ahead of its
/// loop pays no fence and no cache miss for the loop's wake flags. A push that finds blocks
/// waiting knows a request was made after the first of them and that the loop has not taken
/// them since (taking them empties the queue under the same lock). What keeps such a block from
/// waiting with the loop asleep is the loop's side: every place that drops or takes a request
/// either takes the queue after (a pass's blocks phase) or looks at ``hasReady`` once it has
/// announced its sleep (the wake protocol's `handedOver` check, a foreign wait's look, virtual
/// time's), so a request dropped without the queue taken (a nested run's end) loses nothing.
///
/// `@unchecked Sendable`: `filling` (and the buffer it points to) is read and written only while
/// `spin` is held (acquired with an acquiring exchange, released with a releasing store), and
/// `hasPending` is atomic.
final class BlockQueue: @unchecked Sendable {
    // What producers and the loop both touch, in the object's first 16 bytes of fields: those
    // start 16-byte aligned, so they share one cache line at any address, and a push or an
    // exchange moves one line, not two. The padding keeps the next object off that line.
    private let spin = SpinLock()
    private let hasPending = Atomic<Bool>(false)
    /// Set under the lock by ``close()``: pushes are refused from then on.
    private var closed = false
    /// Owned (+1). Unmanaged so that a push touches only the buffer, not its reference count: the
    /// count's cache line would otherwise travel between the producers and the loop.
    private var filling = Unmanaged.passRetained(BlockBuffer())
    private let padding = CacheLinePadding()

    /// What ``push(_:firstPush:)`` did with a block.
    enum Pushed {
        /// Queued; `signal`: the loop sleeps and must be woken (its eventfd written), outside the
        /// lock.
        case queued(signal: Bool)
        /// Refused: the queue is closed (its loop's thread exited); the block is handed back.
        case refused(PendingBlock)
    }

    /// Appends a block. The push that finds the queue empty calls `firstPush` under the lock (it
    /// asks for the loop's wakeup: no lock, no user code) and returns its answer; the others
    /// return `.queued(signal: false)`. Once the queue is closed, hands the block back. Any
    /// thread.
    ///
    /// - Complexity: O(1) amortized.
    @inline(__always)
    func push(_ block: consuming PendingBlock, firstPush: () -> Bool) -> Pushed {
        lock()
        if _slowPath(closed) {
            unlock()
            return .refused(block)
        }
        // Kept alive by `filling`'s +1: no retain and release of the buffer for the append (the
        // block is moved in through an optional the closure can take it from).
        var moved = Optional(block)
        filling._withUnsafeGuaranteedRef { $0.append(moved.take()!) }
        var signal = false
        // Written only under the lock: a relaxed load is exact here.
        if !hasPending.load(ordering: .relaxed) {
            hasPending.store(true, ordering: .relaxed)
            signal = firstPush()
        }
        unlock()
        return .queued(signal: signal)
    }

    /// Whether blocks are queued (a hint: exact for the consumer once it has synchronized with the
    /// producer through the loop's wakeup flag).
    var hasReady: Bool { hasPending.load(ordering: .acquiring) }

    /// Takes every queued block, in order: returns the buffer holding them and leaves `spare`
    /// (which must be empty) in its place; `nil`, and `spare` kept, when nothing is queued.
    /// Consumer only.
    ///
    /// - Complexity: O(1).
    func exchange(_ spare: inout BlockBuffer?) -> BlockBuffer? {
        guard hasPending.load(ordering: .acquiring) else { return nil }
        let empty = Unmanaged.passRetained(spare ?? BlockBuffer())
        spare = nil
        lock()
        let full = filling
        filling = empty
        hasPending.store(false, ordering: .relaxed)
        unlock()
        return full.takeRetainedValue()
    }

    /// Moves every queued block, in order, to the end of `destination`; the emptied buffer becomes
    /// `spare`, for the next exchange. Consumer only.
    ///
    /// - Complexity: O(*n*) for *n* queued blocks.
    func takeAll(appendingTo destination: inout Deque<PendingBlock>, spare: inout BlockBuffer?) {
        guard let full = exchange(&spare) else { return }
        while let block = full.popFirst() { destination.append(block) }
        spare = full
    }

    /// Closes the queue (later pushes are refused) and returns the blocks queued so far, in order,
    /// for the caller to drop. Consumer only.
    func close() -> BlockBuffer {
        let empty = Unmanaged.passRetained(BlockBuffer())
        lock()
        closed = true
        let queued = filling
        filling = empty
        hasPending.store(false, ordering: .relaxed)
        unlock()
        return queued.takeRetainedValue()  // its blocks are handled outside the lock
    }

    deinit { filling.release() }

    @inline(__always)
    private func lock() { spin.lock() }

    @inline(__always)
    private func unlock() { spin.unlock() }
}

/// A growable array of pending blocks that are moved in at the back and out at the front: the
/// unit ``BlockQueue`` hands from producers to the loop.
///
/// `@unchecked Sendable`: a buffer is owned by one side at a time. While it is a queue's filling
/// buffer only code holding that queue's lock touches it; once exchanged out, only the loop's
/// thread does (the lock's release and acquire order the hand-over).
final class BlockBuffer: @unchecked Sendable {
    private var base: UnsafeMutablePointer<PendingBlock>
    private var capacity: Int
    private var count = 0
    private var head = 0
    /// A queue's two buffers are made one after the other, so they would often share a cache
    /// line: the producers writing `count` of one and the loop `head` of the other would then
    /// move it between cores at every block (a run's throughput halved or not, by where malloc
    /// put them). The padding keeps the fields of an object allocated after this one (the other
    /// buffer, the loop's instrumentation) off these fields' lines.
    private let padding = CacheLinePadding()

    /// Capacity a fresh buffer starts with, and the one an emptied buffer shrinks back to when a
    /// burst made it larger than ``shrinkAbove``.
    static let initialCapacity = 256
    /// An emptied buffer larger than this gives its memory back.
    static let shrinkAbove = 1 << 16

    init() {
        capacity = Self.initialCapacity
        base = .allocate(capacity: capacity)
    }

    deinit {
        (base + head).deinitialize(count: count - head)
        base.deallocate()
    }

    /// Whether every block has been taken.
    var isEmpty: Bool { head == count }

    /// Moves `block` in at the back.
    ///
    /// - Complexity: O(1) amortized.
    @inline(__always)
    func append(_ block: consuming PendingBlock) {
        if count == capacity { grow() }
        (base + count).initialize(to: block)
        count += 1
    }

    /// Moves the front block out, or returns `nil` (and resets the emptied buffer for reuse).
    ///
    /// - Complexity: O(1).
    @inline(__always)
    func popFirst() -> PendingBlock? {
        guard head < count else {
            reset()
            return nil
        }
        let block = (base + head).move()
        head += 1
        return block
    }

    private func reset() {
        head = 0
        count = 0
        if capacity > Self.shrinkAbove {
            base.deallocate()
            capacity = Self.initialCapacity
            base = .allocate(capacity: capacity)
        }
    }

    private func grow() {
        let newCapacity = capacity * 2
        let newBase = UnsafeMutablePointer<PendingBlock>.allocate(capacity: newCapacity)
        newBase.moveInitialize(from: base + head, count: count - head)
        base.deallocate()
        base = newBase
        capacity = newCapacity
        count -= head
        head = 0
    }
}

/// 64 bytes of nothing: a stored property of this type keeps the fields before it off the cache
/// line of whatever is allocated next (see ``BlockQueue`` and ``BlockBuffer``).
struct CacheLinePadding: Sendable {
    private let words: (UInt64, UInt64, UInt64, UInt64, UInt64, UInt64, UInt64, UInt64) = (0, 0, 0, 0, 0, 0, 0, 0)
}
