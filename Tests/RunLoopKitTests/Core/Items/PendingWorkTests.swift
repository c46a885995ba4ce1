import SharedTestSupport
import Synchronization
import Testing

import class RunLoopKit.RunLoop

@testable import RunLoopKit

/// `RunLoopPendingWork`: the emptiness rule counts it as CoreFoundation counts pending blocks.
/// Each test runs on a thread of its own, whose loop has nothing else.
@Suite struct PendingWorkTests {
    /// CoreFoundation, on this machine: a pending block keeps `CFRunLoopRunInMode` from returning
    /// kCFRunLoopRunFinished at once; with nothing pending it does return it.
    @Test func coreFoundationCountsPendingBlocks() async throws {
        let results = try #require(await TestThreads.run(name: "cf") { () -> [String] in
            let driver = CFLoopDriver()
            let empty = driver.run(DiffMode.default, 0.05, returnAfterSourceHandled: false)
            driver.perform([DiffMode.default]) {}
            let pending = driver.run(DiffMode.default, 0.05, returnAfterSourceHandled: false)
            return [empty, pending]
        })
        #expect(results[0] == "finished")
        #expect(results[1] != "finished")
    }

    /// Pending: the mode is not empty (the run sleeps to its timeout: nothing does the work here).
    /// Not pending, invalidated or released: it is.
    @Test func aPendingHoldKeepsItsModeAndNothingElse() async throws {
        let results = try #require(await TestThreads.run(name: "pending") { () -> [String] in
            let loop = RunLoop.current
            let work = RunLoopPendingWork(loop: loop, modes: ["held"])
            var results: [String] = []
            results.append("\(loop.run(mode: "held", for: .milliseconds(20)))")
            work.isPending = true
            work.isPending = true  // counted once
            results.append("\(loop.run(mode: "held", for: .milliseconds(20)))")
            results.append("\(loop.run(mode: .default, for: .milliseconds(20)))")  // not its mode
            results.append("\(loop.run(mode: "held", before: ContinuousClock.now))")
            work.isPending = false
            results.append("\(loop.run(mode: "held", for: .milliseconds(20)))")
            work.isPending = true
            work.invalidate()
            results.append("\(work.isPending)")
            results.append("\(loop.run(mode: "held", for: .milliseconds(20)))")
            do {
                let released = RunLoopPendingWork(loop: loop, modes: ["held"])
                released.isPending = true
            }
            results.append("\(loop.run(mode: "held", for: .milliseconds(20)))")
            return results
        })
        #expect(results == ["finished", "timedOut", "finished", "true", "finished", "false", "finished", "finished"])
    }

    /// ``RunLoop/Mode/common`` holds every common mode, made common before or after.
    @Test func aCommonHoldKeepsEveryCommonMode() async throws {
        let results = try #require(await TestThreads.run(name: "common") { () -> [String] in
            let loop = RunLoop.current
            loop.addCommonMode("early")
            let marker = RunLoopObserver(activities: .entry) { _, _ in }  // makes the common modes
            loop.add(marker, forMode: .common)
            let work = RunLoopPendingWork(loop: loop, modes: [.common])
            work.isPending = true
            loop.addCommonMode("late")
            defer { marker.invalidate() }
            let modes: [RunLoop.Mode] = [.default, "early", "late", "private"]
            return modes.map {
                "\(loop.run(mode: $0, for: .milliseconds(20)))"
            }
        })
        #expect(results == ["timedOut", "timedOut", "timedOut", "finished"])
    }

    /// Work done by a beforeWaiting observer in a run that only it kept alive: the run ends
    /// `.finished` right then, instead of sleeping with its mode empty to the timeout.
    @Test func aRunEndsOnceItsPendingWorkIsDone() async throws {
        let outcome = try #require(await TestThreads.run(name: "done") { () -> (RunLoop.RunResult, Duration, Int) in
            let loop = RunLoop.current
            let work = RunLoopPendingWork(loop: loop, modes: [.default])
            let done = Atomic<Int>(0)
            let observer = RunLoopObserver(activities: .beforeWaiting) { _, _ in
                if work.isPending {
                    done.add(1, ordering: .relaxed)
                    work.isPending = false
                }
            }
            loop.add(observer, forMode: .default)
            defer { observer.invalidate() }
            work.isPending = true
            let start = ContinuousClock.now
            let result = loop.run(mode: .default, for: .seconds(20))
            return (result, ContinuousClock.now - start, done.load(ordering: .relaxed))
        })
        #expect(outcome.0 == .finished)
        // Microseconds; 10 s of room for a loaded machine, half the run's timeout.
        #expect(outcome.1 < .seconds(10))
        #expect(outcome.2 == 1)
    }
}
