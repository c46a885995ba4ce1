import RunLoopKit
import RunLoopTesting
import SharedTestSupport
import Synchronization
import Testing

import class RunLoopKit.RunLoop

/// A simulated scroll (the seeds' "NSTimer stops while scrolling"): `simulateTracking(for:)`
/// runs the loop in `.tracking` for the whole time, so the test sees what a scroll does to its
/// timers, where a plain nested `.tracking` run with nothing in `.tracking` ends at once.
@Suite struct SimulateTrackingTests {
    /// The recipe that does not work: nothing is in `.tracking`, so the run ends `.finished` at
    /// once (CoreFoundation's emptiness rule) and the "scroll" tests nothing.
    @Test func aPlainTrackingRunWithNothingInTrackingEndsAtOnce() async throws {
        let outcome = try #require(await TestThreads.run(name: "tracking") { () -> (RunLoop.RunResult, Duration, Int) in
            let loop = RunLoop.current
            loop.addCommonMode(.tracking)
            let fired = Atomic<Int>(0)
            let timer = RunLoopTimer(after: .milliseconds(10), repeating: .milliseconds(10)) { _ in
                fired.add(1, ordering: .relaxed)
            }
            loop.add(timer, forMode: .default)
            defer { timer.invalidate() }
            let start = ContinuousClock.now
            let result = loop.run(mode: .tracking, for: .milliseconds(300))
            return (result, ContinuousClock.now - start, fired.load(ordering: .relaxed))
        })
        #expect(outcome.0 == .finished)
        // It returns in microseconds; 250 ms of room for a loaded machine, under the 300 ms asked.
        #expect(outcome.1 < .milliseconds(250))
        #expect(outcome.2 == 0)
    }

    /// On a real loop: for 200 ms of simulated tracking, a timer added for `.common` keeps firing
    /// and one added for `.default` never does.
    @Test func aCommonTimerFiresWhileTrackingAndADefaultOneDoesNot() async throws {
        let outcome = try #require(await TestThreads.run(name: "tracking") { () -> (RunLoop.RunResult, Duration, Int, Int, Bool) in
            let loop = RunLoop.current
            let common = Atomic<Int>(0)
            let defaultOnly = Atomic<Int>(0)
            let inTracking = Atomic<Bool>(true)
            let commonTimer = RunLoopTimer(after: .milliseconds(10), repeating: .milliseconds(10)) { _ in
                common.add(1, ordering: .relaxed)
                if loop.currentMode != .tracking { inTracking.store(false, ordering: .relaxed) }
            }
            let defaultTimer = RunLoopTimer(after: .milliseconds(10), repeating: .milliseconds(10)) { _ in
                defaultOnly.add(1, ordering: .relaxed)
            }
            loop.add(commonTimer, forMode: .common)
            loop.add(defaultTimer, forMode: .default)
            defer {
                commonTimer.invalidate()
                defaultTimer.invalidate()
            }
            let start = ContinuousClock.now
            let result = loop.simulateTracking(for: .milliseconds(200))
            return (
                result, ContinuousClock.now - start, common.load(ordering: .relaxed),
                defaultOnly.load(ordering: .relaxed), inTracking.load(ordering: .relaxed)
            )
        })
        let (result, took, common, defaultOnly, inTracking) = outcome
        #expect(result == .timedOut)
        #expect(took >= .milliseconds(200))
        // About 20 ticks; at least 3 even on a machine that stalls the thread for most of it.
        #expect(common >= 3)
        #expect(inTracking)
        #expect(defaultOnly == 0)
    }

    /// The same on virtual time, exact: a scroll from 100 ms to 400 ms, started by a timer of the
    /// default mode, as a gesture would.
    @Test func onVirtualTimeTheScrollIsExact() async throws {
        try withVirtualTime { time in
            let start = time.start
            let common = LoopBound<[Duration]>([])
            let defaultOnly = LoopBound<[Duration]>([])
            let result = LoopBound<RunLoop.RunResult?>(nil)
            let commonTimer = RunLoopTimer(after: .milliseconds(50), repeating: .milliseconds(50)) { _ in
                common.value.append(RunLoop.now - start)
            }
            let defaultTimer = RunLoopTimer(after: .milliseconds(50), repeating: .milliseconds(50)) { _ in
                defaultOnly.value.append(RunLoop.now - start)
            }
            let fingerDown = RunLoopTimer(after: .milliseconds(100)) { _ in
                result.value = RunLoop.current.simulateTracking(for: .milliseconds(300))
            }
            RunLoop.current.add(commonTimer, forMode: .common)
            RunLoop.current.add(defaultTimer, forMode: .default)
            RunLoop.current.add(fingerDown, forMode: .default)
            try time.advance(by: .milliseconds(600))
            #expect(result.value == .timedOut)
            #expect(common.value == (1...12).map { .milliseconds(50 * $0) })
            // Stalled from 100 ms to 400 ms; then once, late, for the ticks it missed.
            #expect(defaultOnly.value == [50, 100, 400, 450, 500, 550, 600].map { .milliseconds($0) })
            commonTimer.invalidate()
            defaultTimer.invalidate()
        }
    }
}
