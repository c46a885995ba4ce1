import Clocks
import RunLoopKit
import RunLoopTesting
import SharedTestSupport
import Synchronization
import Testing

// The same debouncer (Debouncers.swift: an unstructured Task that sleeps on an injected clock),
// driven by the same script, on RunLoopTesting's virtual time and on swift-clocks' `TestClock`
// (pointfreeco/swift-clocks 1.1.1), 200 runs each, counting the runs that give the expected
// answer. The figures go in the RunLoopTesting article "Testing async code on virtual time".
//
// The difference is where the debouncer's Task runs. Under `withVirtualTime` it runs on the
// virtual loop, inside `advance(by:)`, so its sleep is registered before the clock moves. With
// `TestClock` it runs on the global pool, and `advance(by:)` can only yield (swift-clocks'
// `Task.megaYield`) and hope the task has registered its sleep by then.

/// What the script observes after each step: values delivered so far.
private let expectedObservations: [[Int]] = [[], [], [3], [3], [3, 4]]

/// Sends 1 and 2; after 200 ms sends 3; looks after 299 ms (nothing) and 300 ms (3); sends 4
/// 200 ms later; looks after 299 ms and 300 ms.
private func script(
    clock: any Clock<Duration>, advance: (Duration) async throws -> Void
) async throws -> [[Int]] {
    let delivered = Mutex<[Int]>([])
    let debouncer = Debouncer<Int>(clock: clock, delay: .milliseconds(300)) { value in
        delivered.locked { $0.append(value) }
    }
    var observed: [[Int]] = []
    debouncer.send(1)
    debouncer.send(2)
    try await advance(.milliseconds(200))
    debouncer.send(3)
    observed.append(delivered.locked { $0 })
    try await advance(.milliseconds(299))
    observed.append(delivered.locked { $0 })
    try await advance(.milliseconds(1))
    observed.append(delivered.locked { $0 })
    try await advance(.milliseconds(200))
    debouncer.send(4)
    try await advance(.milliseconds(299))
    observed.append(delivered.locked { $0 })
    try await advance(.milliseconds(1))
    observed.append(delivered.locked { $0 })
    // A run that went wrong may leave a task sleeping on a clock nobody advances again (TestClock
    // registers a sleep late); cancelled, it ends instead of staying suspended for good.
    debouncer.cancel()
    return observed
}

@Suite struct TestClockComparisonTests {
    /// 200, or 20 under a sanitizer: each run hops the test's task through the global pool,
    /// which other suites hold for long stretches there.
    static let runs = TestThreads.sanitized ? 20 : 200

    @Test func theSameDebouncerOnVirtualTimeAndOnTestClock() async throws {
        var virtualPasses = 0
        let virtualStart = ContinuousClock.now
        for _ in 0..<Self.runs {
            let observed = try await withVirtualTime { time in
                try await script(clock: time.clock) { try await time.advance(by: $0) }
            }
            if observed == expectedObservations { virtualPasses += 1 }
        }
        let virtualTime = ContinuousClock.now - virtualStart

        var testClockPasses = 0
        let testClockStart = ContinuousClock.now
        for _ in 0..<Self.runs {
            let clock = TestClock()
            let observed = try await script(clock: clock) { await clock.advance(by: $0) }
            if observed == expectedObservations { testClockPasses += 1 }
        }
        let testClockTime = ContinuousClock.now - testClockStart

        print(
            """
            TestClockComparison: \(Self.runs) runs of the same debouncer script
              RunLoopTesting withVirtualTime: \(virtualPasses)/\(Self.runs) expected, \(perRun(virtualTime)) per run
              swift-clocks TestClock:         \(testClockPasses)/\(Self.runs) expected, \(perRun(testClockTime)) per run
            """)
        #expect(virtualPasses == Self.runs)
        // TestClock's count is reported, not asserted: it depends on the pool's scheduling.
    }

    private func perRun(_ total: Duration) -> String {
        let micros = Double(total.components.seconds) * 1e6 + Double(total.components.attoseconds) / 1e12
        return "\(Int((micros / Double(Self.runs)).rounded())) µs"
    }
}
