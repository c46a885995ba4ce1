import RunLoopKit
import RunLoopTesting
import SharedTestSupport
import Synchronization
import Testing

import class RunLoopKit.RunLoop

// Tests whose code needs a loop to run while they await (swiftlang/swift-testing#997: the test
// runner does not run the main loop).

/// A one-shot flag a loop's callback sets and a test awaits.
private final class Fired: Sendable {
    let onMainThread = Atomic<Bool>(false)
    let done = Atomic<Bool>(false)
    var ranOnMainThread: Bool { onMainThread.load(ordering: .relaxed) }
}

@Suite(.serialized) struct PumpingLoopTests {
    /// Under `swift test` on Linux the main thread is parked by libdispatch (`dispatch_main()`),
    /// so RunLoop.main cannot run: the helper says so before the body runs.
    /// (Tests/ConcurrencyProbe's `pump` scenario shows it working where the main thread drains
    /// the main queue.)
    @Test func withoutAMainThreadTheMainLoopHelperSaysWhy() async throws {
        let ran = Fired()
        await #expect(throws: MainLoopUnavailable.self) {
            try await withMainLoopRunning { ran.done.store(true, ordering: .relaxed) }
        }
        let bodyRan = ran.done.load(ordering: .relaxed)
        #expect(!bodyRan)
    }

    /// On a loop thread: the body runs on the loop's thread, before and after suspensions, and
    /// the loop runs its timers meanwhile.
    @Test func aBodyRunsOnItsLoopThread() async throws {
        let placements = try await withLoopThread { loop -> [Bool] in
            var placements = [loop.isCurrent]
            try await loop.clock.sleep(for: .milliseconds(5))
            placements.append(loop.isCurrent)
            await Task.yield()
            placements.append(RunLoop.current === loop)
            return placements
        }
        #expect(placements == [true, true, true])
    }

    /// The trait form: `RunLoop.current` in the test is the thread's running loop.
    @Test(.onLoopThread) func theTraitRunsTheTestOnALoopThread() async throws {
        let loop = RunLoop.current
        #expect(loop.isCurrent)
        try await loop.clock.sleep(for: .milliseconds(2))
        #expect(loop.isCurrent)
        #expect(!RunLoop.main.isCurrent)
    }
}
