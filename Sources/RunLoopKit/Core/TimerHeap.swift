/// One scheduling of a timer in one mode's heap.
struct TimerEntry {
    /// When the timer is due.
    var fireNs: Int64
    /// The latest it may fire (`fireNs + tolerance`).
    var latestNs: Int64
    /// Insertion number: the tie-break for equal fire dates.
    var sequence: UInt64
    /// The timer's generation when the entry was made; stale once the timer's moves on.
    var generation: UInt64
    let timer: RunLoopTimer

    @inline(__always)
    var isLive: Bool { timer.generation.load(ordering: .acquiring) == generation }

    @inline(__always)
    static func precedes(_ a: TimerEntry, _ b: TimerEntry) -> Bool {
        a.fireNs < b.fireNs || (a.fireNs == b.fireNs && a.sequence < b.sequence)
    }
}

/// A binary min-heap of timer entries ordered by (fire date, insertion), one per mode.
///
/// Rescheduling or removing a timer does not search the heap: it bumps the timer's generation,
/// which makes its old entries stale, and pushes a fresh entry. Stale entries are dropped when they
/// reach the top, and the heap is rebuilt when they outnumber the live ones, so its size stays
/// within twice the live timers (plus a constant).
///
/// A plain binary heap rather than swift-collections' `Heap` (a min-max heap) because
/// ``coalescedDeadline()`` walks the tree and prunes subtrees by their root, which needs the
/// binary layout.
struct TimerHeap {
    private(set) var entries: ContiguousArray<TimerEntry> = []

    var isEmpty: Bool { entries.isEmpty }
    var count: Int { entries.count }

    /// Adds an entry.
    ///
    /// - Complexity: O(log n).
    mutating func insert(_ entry: TimerEntry) {
        entries.append(entry)
        siftUp(entries.count - 1)
    }

    /// The earliest live entry, dropping stale entries from the top first.
    ///
    /// - Complexity: O(log n) per stale entry dropped, O(1) otherwise.
    mutating func peekLive() -> TimerEntry? {
        while !entries.isEmpty {
            let top = entries[0]
            if top.isLive { return top }
            removeTop()
        }
        return nil
    }

    /// Removes and returns the earliest live entry if it is due at `now`.
    ///
    /// - Complexity: O(log n).
    mutating func popDue(now: Int64) -> TimerEntry? {
        guard let top = peekLive(), top.fireNs <= now else { return nil }
        removeTop()
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
        if entry.isLive, entry.latestNs < deadline, !entry.timer.firing.load(ordering: .relaxed) {
            deadline = entry.latestNs
        }
        visit(2 * index + 1, buffer, &deadline)
        visit(2 * index + 2, buffer, &deadline)
    }

    /// Rebuilds the heap from its live entries once stale ones outnumber `liveCount`.
    ///
    /// - Complexity: O(n) when it rebuilds, O(1) otherwise; amortized O(1) per stale entry.
    mutating func compactIfNeeded(liveCount: Int) {
        guard entries.count > 64, entries.count > 2 * liveCount + 32 else { return }
        entries.removeAll { !$0.isLive }
        var index = entries.count / 2 - 1
        while index >= 0 {
            siftDown(index)
            index -= 1
        }
    }

    /// Drops every entry.
    mutating func removeAll() { entries.removeAll() }

    private mutating func removeTop() {
        let last = entries.removeLast()
        guard !entries.isEmpty else { return }
        entries[0] = last
        siftDown(0)
    }

    private mutating func siftUp(_ start: Int) {
        entries.withUnsafeMutableBufferPointer { heap in
            var child = start
            let moving = heap[child]
            while child > 0 {
                let parent = (child - 1) / 2
                guard TimerEntry.precedes(moving, heap[parent]) else { break }
                heap[child] = heap[parent]
                child = parent
            }
            heap[child] = moving
        }
    }

    private mutating func siftDown(_ start: Int) {
        entries.withUnsafeMutableBufferPointer { heap in
            let count = heap.count
            var parent = start
            let moving = heap[parent]
            while true {
                var child = 2 * parent + 1
                guard child < count else { break }
                if child + 1 < count, TimerEntry.precedes(heap[child + 1], heap[child]) { child += 1 }
                guard TimerEntry.precedes(heap[child], moving) else { break }
                heap[parent] = heap[child]
                parent = child
            }
            heap[parent] = moving
        }
    }
}
