import CRunLoopKit

/// One scheduling of a timer in one mode's heap.
///
/// An entry holds one manual retain of its timer, so that moving entries around the heap (each
/// sift moves several) costs no reference counting. Ownership of that retain moves with the entry:
/// ``init(fireNs:latestNs:sequence:generation:timer:)`` takes it, ``TimerHeap/insert(_:)`` hands it
/// to the heap, the heap releases the entries it drops, and a pop hands it to the caller, who
/// calls ``release()`` when done.
struct TimerEntry {
    /// When the timer is due.
    var fireNs: Int64
    /// The latest it may fire (`fireNs + tolerance`).
    var latestNs: Int64
    /// Insertion number: the tie-break for equal fire dates.
    var sequence: UInt64
    /// The timer's generation when the entry was made; stale once the timer's moves on.
    var generation: UInt64
    private let owned: Unmanaged<RunLoopTimer>

    init(fireNs: Int64, latestNs: Int64, sequence: UInt64, generation: UInt64, timer: RunLoopTimer) {
        self.fireNs = fireNs
        self.latestNs = latestNs
        self.sequence = sequence
        self.generation = generation
        self.owned = .passRetained(timer)
    }

    /// The timer (valid while this entry's retain is held).
    var timer: RunLoopTimer { owned.takeUnretainedValue() }

    /// Starts loading the timer object into the cache, ahead of its use.
    @inline(__always)
    func prefetchTimer() { crlk_prefetch(owned.toOpaque(), 128) }

    /// Gives up this entry's retain of its timer.
    func release() { owned.release() }

    @inline(__always)
    var isLive: Bool {
        owned._withUnsafeGuaranteedRef { $0.generation } == generation
    }

    @inline(__always)
    var isFiring: Bool { owned._withUnsafeGuaranteedRef { $0.isFiring } }

    @inline(__always)
    static func precedes(_ a: TimerEntry, _ b: TimerEntry) -> Bool {
        a.fireNs < b.fireNs || (a.fireNs == b.fireNs && a.sequence < b.sequence)
    }
}

/// A min-heap of timer entries ordered by (fire date, insertion), one per mode.
///
/// Rescheduling or removing a timer does not search the heap: it bumps the timer's generation,
/// which makes its old entries stale, and pushes a fresh entry. Stale entries are dropped when they
/// reach the top, and the heap is rebuilt when they outnumber the live ones, so its size stays
/// within twice the live timers (plus a constant).
///
/// A plain 4-ary heap rather than swift-collections' `Heap` (a min-max heap) because
/// ``coalescedDeadline()`` walks the tree and prunes subtrees by their root, which needs a plain
/// d-ary layout. Four children per node halve the depth of a binary heap, and the children sit
/// side by side in memory, which matters once the heap outgrows the caches (100,000 timers are
/// 4 MB of entries).
struct TimerHeap {
    private(set) var entries: ContiguousArray<TimerEntry> = []
    /// Children per node.
    static let arity = 4

    var isEmpty: Bool { entries.isEmpty }
    var count: Int { entries.count }

    /// Adds an entry, taking over its retain.
    ///
    /// - Complexity: O(log n).
    mutating func insert(_ entry: TimerEntry) {
        entries.append(entry)
        siftUp(entries.count - 1)
        checkInvariants()
    }

    /// The earliest live entry (still owned by the heap), dropping stale entries from the top
    /// first; their retains go to `graveyard`, released by the caller once it holds no lock.
    ///
    /// - Complexity: O(log n) per stale entry dropped, O(1) otherwise.
    mutating func peekLive(graveyard: inout ContiguousArray<TimerEntry>) -> TimerEntry? {
        while !entries.isEmpty {
            let top = entries[0]
            if top.isLive { return top }
            removeTop()
            graveyard.append(top)
        }
        return nil
    }

    /// Removes and returns the earliest entry, live or stale, if it is due at `now`; the caller owns
    /// its retain. Unlike a pop that checks liveness it does not touch the timer object, so a loop that pops
    /// a batch of due entries can bring their timers into the cache ahead of use and check
    /// liveness then.
    ///
    /// - Complexity: O(log n).
    mutating func popEarliest(dueBy now: Int64) -> TimerEntry? {
        // Not `entries.first`: unspecialized (in debug builds) it boxes the element.
        guard !entries.isEmpty, entries[0].fireNs <= now else { return nil }
        let top = entries[0]
        removeTop()
        checkInvariants()
        return top
    }

    /// When the loop must wake to serve the timers: the smallest `fireNs + tolerance` over the live
    /// timers due before that moment, `LoopClock.never` if there are none. Waking then, every
    /// timer due by then fires within its tolerance, in one wakeup.
    ///
    /// - Complexity: O(k), k the entries due before the result (the timers that wakeup serves).
    func coalescedDeadline() -> Int64 {
        var deadline = LoopClock.never
        entries.withUnsafeBufferPointer { buffer in visit(0, buffer, &deadline) }
        return deadline
    }

    private func visit(_ index: Int, _ buffer: UnsafeBufferPointer<TimerEntry>, _ deadline: inout Int64) {
        guard index < buffer.count else { return }
        let entry = buffer[index]
        // Children fire no earlier than their parent: a parent at or past the deadline prunes them.
        guard entry.fireNs < deadline else { return }
        // A timer firing in an outer run is skipped, as CoreFoundation skips it when arming: a
        // nested run must not spin on it.
        if entry.isLive, entry.latestNs < deadline, !entry.isFiring {
            deadline = entry.latestNs
        }
        let first = Self.arity * index + 1
        var child = first
        while child < first + Self.arity {
            visit(child, buffer, &deadline)
            child += 1
        }
    }

    /// Rebuilds the heap from its live entries once stale ones outnumber `liveCount` (the mode's
    /// timers, an upper bound on its live entries). The stale entries' retains go to `graveyard`.
    ///
    /// - Complexity: O(n) when it rebuilds, O(1) otherwise; amortized O(1) per stale entry.
    mutating func compactIfNeeded(liveCount: Int, graveyard: inout ContiguousArray<TimerEntry>) {
        guard entries.count > Self.smallHeap, entries.count > 2 * liveCount + 32 else { return }
        rebuild(keeping: { $0.isLive }, graveyard: &graveyard)
    }

    /// Drops the stale entries of `timer`, which just left this heap's mode or was invalidated, so
    /// that nothing here keeps it (and what its handler captured) alive: at once in a small heap,
    /// by ``compactIfNeeded(liveCount:graveyard:)``'s rule in a large one, where a scan per removal
    /// would make removing n timers O(n²).
    ///
    /// - Complexity: O(n) for a heap of at most ``smallHeap`` entries, amortized O(1) otherwise.
    mutating func dropStaleEntries(of timer: RunLoopTimer, liveCount: Int, graveyard: inout ContiguousArray<TimerEntry>) {
        if entries.count <= Self.smallHeap {
            guard entries.contains(where: { $0.timer === timer && !$0.isLive }) else { return }
            rebuild(keeping: { $0.timer !== timer || $0.isLive }, graveyard: &graveyard)
        } else {
            compactIfNeeded(liveCount: liveCount, graveyard: &graveyard)
        }
    }

    /// The capacity a heap keeps however few entries it holds: 262,144 entries, 8 MB (a heap
    /// grown for 100,000 timers has about 131,000).
    static let keptCapacity = 1 << 18

    /// Heaps up to this size drop a departing timer's entries at once.
    static let smallHeap = 64

    /// Keeps the entries `keep` accepts, sends the others to `graveyard`, restores the heap order
    /// and gives back memory a burst of timers left behind.
    ///
    /// - Complexity: O(n).
    private mutating func rebuild(keeping keep: (TimerEntry) -> Bool, graveyard: inout ContiguousArray<TimerEntry>) {
        var kept = 0
        for index in entries.indices {
            let entry = entries[index]
            if keep(entry) {
                entries[kept] = entry
                kept += 1
            } else {
                graveyard.append(entry)
            }
        }
        entries.removeLast(entries.count - kept)
        shrinkIfOversized()
        guard entries.count > 1 else { return }
        var index = (entries.count - 2) / Self.arity
        while index >= 0 {
            siftDown(index)
            index -= 1
        }
        checkInvariants()
    }

    /// Gives back capacity once the heap holds under a quarter of it: a burst of a million timers
    /// must not pin tens of megabytes for the thread's life. Up to ``keptCapacity`` entries are
    /// kept whatever the count: a loop that fires bursts of up to a hundred thousand timers reuses
    /// its buffer (freeing and regrowing it each time was measured to cost a fifth of the firing
    /// rate, through the allocator).
    ///
    /// - Complexity: O(n) when it shrinks.
    private mutating func shrinkIfOversized() {
        guard entries.capacity > Self.keptCapacity, entries.count < entries.capacity / 4 else { return }
        // A new buffer: initializing a ContiguousArray from one would share its storage.
        var smaller = ContiguousArray<TimerEntry>()
        smaller.reserveCapacity(entries.count)
        smaller.append(contentsOf: entries)
        entries = smaller
    }

    /// Drops every entry; their retains go to `graveyard`.
    mutating func removeAll(graveyard: inout ContiguousArray<TimerEntry>) {
        graveyard.append(contentsOf: entries)
        entries = []
    }

    /// The retained capacity, in entries (for tests of the shrinking rule).
    var capacity: Int { entries.capacity }

    private mutating func removeTop() {
        let last = entries.removeLast()
        guard !entries.isEmpty else {
            shrinkIfOversized()
            return
        }
        entries[0] = last
        siftDown(0)
    }

    private mutating func siftUp(_ start: Int) {
        entries.withUnsafeMutableBufferPointer { heap in
            var child = start
            let moving = heap[child]
            while child > 0 {
                let parent = (child - 1) / Self.arity
                guard TimerEntry.precedes(moving, heap[parent]) else { break }
                heap[child] = heap[parent]
                child = parent
            }
            heap[child] = moving
        }
    }

    /// Moves the entry at `start` down to its place. Bottom-up (Floyd): the hole at `start` first
    /// follows the earliest child to a leaf, with no comparison against the moving entry, which
    /// then climbs back, usually no more than a level since it came from the bottom. Each step
    /// also starts loading the next level's children into the cache.
    private mutating func siftDown(_ start: Int) {
        entries.withUnsafeMutableBufferPointer { heap in
            let count = heap.count
            let base = heap.baseAddress!
            let moving = heap[start]
            var hole = start
            while true {
                let first = Self.arity * hole + 1
                guard first < count else { break }
                var child = first
                let end = min(first + Self.arity, count)
                var sibling = first + 1
                while sibling < end {
                    if TimerEntry.precedes(heap[sibling], heap[child]) { child = sibling }
                    sibling += 1
                }
                let grandchildren = Self.arity * child + 1
                if grandchildren < count {
                    crlk_prefetch(base + grandchildren, UInt(MemoryLayout<TimerEntry>.stride * Self.arity))
                }
                heap[hole] = heap[child]
                hole = child
            }
            while hole > start {
                let parent = (hole - 1) / Self.arity
                guard TimerEntry.precedes(moving, heap[parent]) else { break }
                heap[hole] = heap[parent]
                hole = parent
            }
            heap[hole] = moving
        }
    }

    /// Checks, in debug builds, that no entry precedes its parent (the heap order every operation
    /// keeps), as swift-collections' `Heap._checkInvariants` does. Whole heaps up to
    /// ``fullCheckLimit`` entries (what the tests build, mostly) are checked after each change;
    /// larger ones only at the top, so that debug tests with 100,000 timers stay linear.
    ///
    /// - Complexity: O(n) up to ``fullCheckLimit`` entries, O(1) above.
    @inline(__always)
    func checkInvariants() {
        #if DEBUG
        let checked = entries.count <= Self.fullCheckLimit ? entries.count : min(entries.count, Self.arity + 1)
        var index = 1
        while index < checked {
            let parent = (index - 1) / Self.arity
            precondition(
                !TimerEntry.precedes(entries[index], entries[parent]),
                "TimerHeap: entry \(index) (fire \(entries[index].fireNs), sequence \(entries[index].sequence)) precedes its parent \(parent) (fire \(entries[parent].fireNs), sequence \(entries[parent].sequence))"
            )
            index += 1
        }
        #endif
    }

    static let fullCheckLimit = 512
}
