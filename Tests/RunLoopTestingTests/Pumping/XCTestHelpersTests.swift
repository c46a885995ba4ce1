import RunLoopKit
import RunLoopTesting
import SharedTestSupport
import Synchronization
import XCTest

import class RunLoopKit.RunLoop

/// The pumping helpers from XCTest, whose runner, unlike swift-testing's on Linux, runs its test
/// methods on the process's main thread and drains the main queue while an async test awaits: so
/// `withMainLoopRunning` runs RunLoop.main there, and a synchronous test runs it with
/// `run(timeout:until:)`.
final class XCTestHelpersTests: XCTestCase {
    func testWithMainLoopRunningServesTheMainLoopsTimers() async throws {
        let fired = Atomic(false)
        let onMain = Atomic(false)
        try await withMainLoopRunning {
            let timer = RunLoopTimer(after: .milliseconds(20)) { _ in
                onMain.store(Thread.isMainThread, ordering: .relaxed)
                fired.store(true, ordering: .releasing)
            }
            RunLoop.main.add(timer, forMode: .default)
            let done = await waitUntilAsync { fired.load(ordering: .acquiring) }
            XCTAssertTrue(done)
        }
        XCTAssertTrue(onMain.load(ordering: .relaxed))
    }

    func testWithLoopThreadRunsTheBodyOnTheLoopsThread() async {
        let ticks = Atomic(0)
        let sameLoop = await withLoopThread(name: "xctest-loop") { loop -> Bool in
            let timer = RunLoopTimer(after: .milliseconds(1), repeating: .milliseconds(1)) { _ in
                ticks.add(1, ordering: .relaxed)
            }
            loop.add(timer, forMode: .default)
            // Awaiting on the loop's thread lets the loop run its timer meanwhile.
            _ = await waitUntilAsync { ticks.load(ordering: .relaxed) >= 3 }
            timer.invalidate()
            return RunLoop.current === loop
        }
        XCTAssertTrue(sameLoop)
        XCTAssertGreaterThanOrEqual(ticks.load(ordering: .relaxed), 3)
    }

    func testRunUntilInASynchronousTestOnTheMainThread() {
        XCTAssertTrue(Thread.isMainThread)
        let fired = Atomic(0)
        let timer = RunLoopTimer(after: .milliseconds(1), repeating: .milliseconds(1)) { _ in
            fired.add(1, ordering: .relaxed)
        }
        RunLoop.main.add(timer, forMode: .default)
        XCTAssertTrue(RunLoop.main.run(timeout: .seconds(60)) { fired.load(ordering: .relaxed) == 3 })
        timer.invalidate()
        // The condition stops the run in the pass that made it true: no fourth tick first.
        XCTAssertEqual(fired.load(ordering: .relaxed), 3)
    }

    func testRunUntilReturnsAtOnceForAnEmptyModeAndAtItsTimeout() {
        let empty = RunLoop.Mode(rawValue: "XCTestHelpersTests.empty")
        let start = ContinuousClock.now
        XCTAssertFalse(RunLoop.main.run(mode: empty, timeout: .seconds(60)) { false })
        // An empty mode has nothing that could make the condition true: no wait (bound: far
        // below the 60 s timeout, with room for a loaded machine).
        XCTAssertLessThan(ContinuousClock.now - start, .seconds(30))
        let idle = RunLoop.Mode(rawValue: "XCTestHelpersTests.idle")
        let keepAlive = RunLoopTimer(after: .seconds(3600)) { _ in }
        RunLoop.main.add(keepAlive, forMode: idle)
        defer { keepAlive.invalidate() }
        let waited = ContinuousClock.now
        XCTAssertFalse(RunLoop.main.run(mode: idle, timeout: .milliseconds(50)) { false })
        XCTAssertGreaterThanOrEqual(ContinuousClock.now - waited, .milliseconds(50))
    }
}
