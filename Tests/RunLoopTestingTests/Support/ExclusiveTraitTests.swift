import SharedTestSupport
import Synchronization
import Testing

// SharedTestSupport's `.exclusive` trait, tested where it is cheap: two suites of one group,
// each of whose tests holds the group "inside" for a while, never see each other inside. Without
// the trait, Swift Testing runs the two suites in parallel and the counter reaches 2.

private enum ExclusiveProbe {
    static let group = Exclusive.Group()
    static let inside = Atomic<Int>(0)
    static let overlaps = Atomic<Int>(0)
    static let entries = Atomic<Int>(0)

    static func holdInside() async throws {
        if inside.add(1, ordering: .acquiringAndReleasing).newValue > 1 {
            overlaps.add(1, ordering: .relaxed)
        }
        entries.add(1, ordering: .relaxed)
        // Long enough for the other suite's task to have started on a 2-core machine.
        try await Task.sleep(for: .milliseconds(20))
        inside.subtract(1, ordering: .acquiringAndReleasing)
    }
}

@Suite(.serialized, .exclusive(ExclusiveProbe.group)) struct ExclusiveTraitFirstSuite {
    @Test(arguments: 0..<5) func holdsTheGroup(_ index: Int) async throws {
        try await ExclusiveProbe.holdInside()
        #expect(ExclusiveProbe.overlaps.load(ordering: .relaxed) == 0)
    }
}

@Suite(.serialized, .exclusive(ExclusiveProbe.group)) struct ExclusiveTraitSecondSuite {
    @Test(arguments: 0..<5) func holdsTheGroup(_ index: Int) async throws {
        try await ExclusiveProbe.holdInside()
        #expect(ExclusiveProbe.overlaps.load(ordering: .relaxed) == 0)
    }
}
