import SharedTestSupport
import Testing

@testable import RunLoopKit

/// The timer heap against a brute-force model: pop order, stale entries, coalesced deadlines.
@Suite struct TimerHeapTests {

    private func entry(_ timer: RunLoopTimer, fire: Int64, tolerance: Int64, sequence: UInt64) -> TimerEntry {
        TimerEntry(
            fireNs: fire, latestNs: fire + tolerance, sequence: sequence,
            generation: timer.generation, timer: timer)
    }

    @Test func popsInFireThenInsertionOrderAndSkipsStaleEntries() {
        var random = SplitMix(seed: 42)
        var heap = TimerHeap()
        var model: [(fire: Int64, sequence: UInt64, timer: RunLoopTimer)] = []
        for sequence in 1...2_000 as ClosedRange<UInt64> {
            let timer = RunLoopTimer(fireAt: .now) { _ in }
            let fire = Int64.random(in: 0..<500, using: &random)  // many equal fire dates
            heap.insert(entry(timer, fire: fire, tolerance: 0, sequence: sequence))
            model.append((fire, sequence, timer))
        }
        // Make every third timer stale, as invalidate() does.
        for (index, item) in model.enumerated() where index % 3 == 0 {
            item.timer.bumpGeneration()
        }
        let expected = model.enumerated().filter { $0.offset % 3 != 0 }.map(\.element)
            .sorted { ($0.fire, $0.sequence) < ($1.fire, $1.sequence) }.map(\.sequence)
        var popped: [UInt64] = []
        while let next = heap.popDue(now: .max) {
            popped.append(next.sequence)
            next.release()  // a popped entry's retain is the caller's
        }
        #expect(popped == expected)
        #expect(heap.isEmpty)
    }

    @Test func coalescedDeadlineMatchesBruteForce() {
        var random = SplitMix(seed: 7)
        for round in 0..<200 {
            var heap = TimerHeap()
            var live: [(fire: Int64, latest: Int64)] = []
            let count = Int.random(in: 0..<60, using: &random)
            for sequence in 0..<count {
                let timer = RunLoopTimer(fireAt: .now) { _ in }
                let fire = Int64.random(in: 0..<1_000, using: &random)
                let tolerance = Int64.random(in: 0..<300, using: &random)
                heap.insert(entry(timer, fire: fire, tolerance: tolerance, sequence: UInt64(sequence)))
                if Bool.random(using: &random) {
                    timer.bumpGeneration()  // stale: must not count
                } else {
                    live.append((fire, fire + tolerance))
                }
            }
            // The smallest latest-fire time over the timers due before it.
            var expected = LoopClock.never
            for timer in live.sorted(by: { $0.fire < $1.fire }) {
                if timer.fire >= expected { break }
                expected = min(expected, timer.latest)
            }
            #expect(heap.coalescedDeadline() == expected, "round \(round)")
            var dropped = ContiguousArray<TimerEntry>()
            heap.removeAll(graveyard: &dropped)
            for entry in dropped { entry.release() }
        }
    }

    @Test func compactionKeepsLiveEntriesAndBoundsSize() {
        var heap = TimerHeap()
        let keep = (0..<100).map { _ in RunLoopTimer(fireAt: .now) { _ in } }
        for (index, timer) in keep.enumerated() {
            heap.insert(entry(timer, fire: Int64(index), tolerance: 0, sequence: UInt64(index)))
        }
        for round in 0..<10_000 {
            let churn = RunLoopTimer(fireAt: .now) { _ in }
            heap.insert(entry(churn, fire: Int64(round), tolerance: 0, sequence: UInt64(1_000 + round)))
            churn.bumpGeneration()
            var dropped = ContiguousArray<TimerEntry>()
            heap.compactIfNeeded(liveCount: keep.count, graveyard: &dropped)
            for entry in dropped { entry.release() }
        }
        #expect(heap.count <= 2 * keep.count + 33)
        var popped = 0
        while let next = heap.popDue(now: .max) {
            popped += 1
            next.release()
        }
        #expect(popped == keep.count)
    }
}

extension TimerHeap {
    /// Test-only: removes and returns the earliest live entry if it is due at `now`; the caller owns its
    /// retain.
    ///
    /// - Complexity: O(log n).
    mutating func popDue(now: Int64) -> TimerEntry? {
        var graveyard = ContiguousArray<TimerEntry>()
        defer { for entry in graveyard { entry.release() } }
        guard let top = peekLive(graveyard: &graveyard), top.fireNs <= now else { return nil }
        return popEarliest(dueBy: now)
    }
}
