import SharedTestSupport
import Synchronization
import Testing

import class RunLoopKit.RunLoop

@testable import RunLoopKit

// RunLoop.perform(after:inModes:_:), PerformRequest.cancel() and RunLoop.cancelPerformRequests().
//
// Waits are bounded runs of the loop (a run with nothing left returns .finished at once); the only
// real-clock assertions are lower bounds (a block never runs before its delay), which hold on any
// machine however loaded.

@Suite struct DelayedPerformTests {
    /// The block runs on the loop's thread, in its mode, no earlier than its delay; the request
    /// then reports it started, and the loop no longer holds anything for it.
    @Test func runsAfterTheDelayInItsMode() async {
        struct Outcome: Sendable {
            var ran = false, onLoopThread = false, mode: RunLoop.Mode?, elapsed = Duration.zero
            var result = RunLoop.RunResult.timedOut, started = false, pendingAfter = -1
        }
        let outcome = await TestThreads.run(name: "rlk-delayed") { () -> Outcome in
            let loop = RunLoop.current
            let outcome = Mutex(Outcome())
            let start = ContinuousClock.now
            let request = loop.perform(after: .milliseconds(30)) {
                outcome.locked {
                    $0.ran = true
                    $0.onLoopThread = loop.isCurrent
                    $0.mode = loop.currentMode
                    $0.elapsed = ContinuousClock.now - start
                }
            }
            #expect(request.isPending)
            #expect(loop.pendingPerformRequestCount == 1)
            // The request's timer is the mode's only item: the run finishes once it has fired.
            let result = loop.run(mode: .default, for: .seconds(10))
            return outcome.locked {
                $0.result = result
                $0.started = request.hasStarted
                $0.pendingAfter = loop.pendingPerformRequestCount
                return $0
            }
        }
        guard let outcome else { return }
        #expect(outcome.ran && outcome.onLoopThread)
        #expect(outcome.mode == .default)
        #expect(outcome.elapsed >= .milliseconds(30))
        #expect(outcome.result == .finished)
        #expect(outcome.started)
        #expect(outcome.pendingAfter == 0)
    }

    /// The seeds' image-loading trick (`performSelector:withObject:afterDelay:inModes:
    /// @[NSDefaultRunLoopMode]`): work for `.default` only waits while the loop runs in
    /// `.tracking`, even well past its delay, and runs as soon as the loop is back in `.default`.
    @Test func imageLoadingTrickWaitsWhileTrackingAndRunsInDefault() async {
        struct Outcome: Sendable {
            var ranDuringTracking = true, trackingResult = RunLoop.RunResult.finished, pastDue = false
            var stillPending = false, ranIn: RunLoop.Mode?, defaultResult = RunLoop.RunResult.timedOut
        }
        let outcome = await TestThreads.run(name: "rlk-image") { () -> Outcome in
            let loop = RunLoop.current
            // Something else keeps .tracking alive (the scroll view's events).
            loop.add(RunLoopSource {}, forMode: .tracking)
            let ranIn = Mutex<RunLoop.Mode?>(nil)
            let request = loop.perform(after: .milliseconds(5), inModes: [.default]) {
                ranIn.locked { $0 = loop.currentMode }  // "imageView.image = image"
            }
            var outcome = Outcome()
            // Scrolling for 60 ms, twelve times the delay.
            outcome.trackingResult = loop.run(mode: .tracking, for: .milliseconds(60))
            outcome.ranDuringTracking = ranIn.locked { $0 != nil }
            outcome.pastDue = ContinuousClock.now > request.fireDate
            outcome.stillPending = request.isPending
            // Finger up: back in .default, the image is set at once.
            outcome.defaultResult = loop.run(mode: .default, for: .seconds(10))
            outcome.ranIn = ranIn.locked { $0 }
            return outcome
        }
        guard let outcome else { return }
        #expect(outcome.trackingResult == .timedOut)
        #expect(!outcome.ranDuringTracking)
        #expect(outcome.pastDue)
        #expect(outcome.stillPending)
        #expect(outcome.ranIn == .default)
        #expect(outcome.defaultResult == .finished)
    }

    /// A block for several modes runs once, in whichever of them the loop runs first.
    @Test func aBlockForSeveralModesRunsOnceInTheFirstOfThem() async {
        let runs = await TestThreads.run(name: "rlk-modes") { () -> [RunLoop.Mode?] in
            let loop = RunLoop.current
            let runs = Mutex<[RunLoop.Mode?]>([])
            loop.perform(after: .zero, inModes: [.default, .tracking]) {
                runs.locked { $0.append(loop.currentMode) }
            }
            loop.run(mode: .tracking, for: .seconds(10))
            loop.run(mode: .default, for: .milliseconds(20))
            return runs.locked { $0 }
        }
        #expect(runs == [.tracking])
    }

    /// Cancelled before it is due: the block never runs, the request leaves the mode (the run
    /// finishes at once), and cancelling again does nothing.
    @Test func cancelBeforeTheDelayMeansItNeverRuns() async {
        struct Outcome: Sendable {
            var first = false, second = true, cancelled = false, ran = true
            var result = RunLoop.RunResult.timedOut, elapsed = Duration.seconds(100)
        }
        let outcome = await TestThreads.run(name: "rlk-cancel") { () -> Outcome in
            let loop = RunLoop.current
            let ran = Atomic(false)
            let request = loop.perform(after: .milliseconds(20)) { ran.store(true, ordering: .relaxed) }
            var outcome = Outcome()
            outcome.first = request.cancel()
            outcome.second = request.cancel()
            outcome.cancelled = request.isCancelled
            let start = ContinuousClock.now
            outcome.result = loop.run(mode: .default, for: .seconds(10))
            outcome.elapsed = ContinuousClock.now - start
            outcome.ran = ran.load(ordering: .relaxed)
            return outcome
        }
        guard let outcome else { return }
        #expect(outcome.first && !outcome.second && outcome.cancelled)
        #expect(!outcome.ran)
        #expect(outcome.result == .finished)
        // The mode was empty: the run did not wait 10 s.
        #expect(outcome.elapsed < .seconds(5))
    }

    /// Once the block has started, cancel() returns false and changes nothing.
    @Test func cancelAfterTheBlockStartedReturnsFalse() async {
        let outcome = await TestThreads.run(name: "rlk-late") { () -> (Bool, Bool, Bool) in
            let loop = RunLoop.current
            let inside = Mutex<Bool?>(nil)
            let request = Mutex<RunLoop.PerformRequest?>(nil)
            request.locked {
                $0 = loop.perform(after: .zero) {
                    // Cancelling from inside its own block: already started.
                    inside.locked { $0 = request.locked { $0 }?.cancel() }
                }
            }
            loop.run(mode: .default, for: .seconds(10))
            let handle = request.locked { $0! }
            return (inside.locked { $0 } ?? true, handle.cancel(), handle.hasStarted)
        }
        #expect(outcome?.0 == false)
        #expect(outcome?.1 == false)
        #expect(outcome?.2 == true)
    }

    /// Racing cancel() from another thread against the loop firing the requests. The contract,
    /// checked for every request: cancel() returns true exactly when the block never runs (not
    /// before, not after cancel() returned), and false exactly when the block ran (it had started
    /// before cancel() took effect). No outcome in between, and every block runs at most once.
    @Test func racingCancelEitherPreventsTheBlockOrFindsItStarted() async {
        let count = TestThreads.scaled(2_000, minimum: 300)
        struct Outcome: Sendable {
            var cancelReturned: [Bool] = []
            var runs: [Int] = []
            var finished = false
        }
        let outcome = await TestThreads.run(name: "rlk-race-main", timeout: .seconds(60)) { () -> Outcome in
            let requests = TestMonitor<[RunLoop.PerformRequest]?>(nil)
            let runs = Mutex([Int](repeating: 0, count: count))
            let cancelsDone = Atomic(false)
            let finished = Atomic(false)
            let loopThread = TestThread(name: "rlk-race-loop") {
                let loop = RunLoop.current
                var made: [RunLoop.PerformRequest] = []
                for index in 0..<count {
                    // Due over the next 2 ms, so that cancels land before, during and after.
                    let delay = Duration.microseconds((index * 2_000) / count)
                    made.append(loop.perform(after: delay) { runs.locked { $0[index] += 1 } })
                }
                requests.update { $0 = made }
                // Runs until every request has run or been cancelled (bounded).
                let deadline = ContinuousClock.now + .seconds(30)
                while ContinuousClock.now < deadline {
                    loop.run(mode: .default, for: .milliseconds(5))
                    if cancelsDone.load(ordering: .acquiring) && made.allSatisfy({ !$0.isPending }) {
                        finished.store(true, ordering: .releasing)
                        break
                    }
                }
            }
            var cancelReturned: [Bool] = []
            if requests.wait(timeout: .seconds(20), until: { $0 != nil }), let made = requests.read({ $0 }) {
                // Cancel every other request in one pass, the rest in a second pass.
                var returned = [Bool](repeating: false, count: count)
                for index in stride(from: 0, to: count, by: 2) { returned[index] = made[index].cancel() }
                for index in stride(from: 1, to: count, by: 2) { returned[index] = made[index].cancel() }
                cancelReturned = returned
            }
            cancelsDone.store(true, ordering: .releasing)
            _ = loopThread.join(timeout: .seconds(40))
            return Outcome(
                cancelReturned: cancelReturned, runs: runs.locked { $0 }, finished: finished.load(ordering: .acquiring))
        }
        guard let outcome else { return }
        #expect(outcome.finished)
        #expect(outcome.cancelReturned.count == count)
        guard outcome.cancelReturned.count == count else { return }
        var mismatches = 0
        for index in 0..<count where outcome.runs[index] != (outcome.cancelReturned[index] ? 0 : 1) {
            mismatches += 1
        }
        #expect(mismatches == 0, "requests whose run count disagrees with cancel()'s answer")
        #expect(outcome.runs.allSatisfy { $0 <= 1 })
    }

    /// cancelPerformRequests() cancels every pending request of the loop (from another thread),
    /// counts only those, and leaves later requests alone.
    @Test func cancelPerformRequestsCancelsEveryPendingRequest() async {
        struct Outcome: Sendable {
            var cancelled = -1, pendingAfter = -1, ran: [String] = [], result = RunLoop.RunResult.timedOut
            var allCancelled = false, firstStarted = false
        }
        let outcome = await TestThreads.run(name: "rlk-bulk") { () -> Outcome in
            let loop = RunLoop.current
            let ran = Mutex<[String]>([])
            // One that runs before the bulk cancel.
            let first = loop.perform(after: .zero) { ran.locked { $0.append("first") } }
            loop.run(mode: .default, for: .seconds(10))
            var pending: [RunLoop.PerformRequest] = []
            for index in 0..<10 {
                let mode: RunLoop.Mode = index.isMultiple(of: 2) ? .default : .tracking
                pending.append(
                    loop.perform(after: .milliseconds(index), inModes: [mode, .common]) {
                        ran.locked { $0.append("cancelled \(index)") }
                    })
            }
            var outcome = Outcome()
            // From another thread, as a view controller's teardown might.
            let canceller = TestThread(name: "rlk-bulk-cancel") {
                let count = loop.cancelPerformRequests()
                ran.locked { $0.append("bulk cancel: \(count)") }
            }
            _ = canceller.join(timeout: .seconds(10))
            outcome.pendingAfter = loop.pendingPerformRequestCount
            outcome.allCancelled = pending.allSatisfy(\.isCancelled)
            outcome.firstStarted = first.hasStarted
            loop.perform(after: .zero) { ran.locked { $0.append("after") } }
            outcome.result = loop.run(mode: .default, for: .seconds(10))
            outcome.ran = ran.locked { $0 }
            return outcome
        }
        guard let outcome else { return }
        #expect(outcome.ran == ["first", "bulk cancel: 10", "after"])
        #expect(outcome.pendingAfter == 0)
        #expect(outcome.allCancelled && outcome.firstStarted)
        #expect(outcome.result == .finished)
    }

    /// A request releases its block (and what the block captured) once the block has run or the
    /// request was cancelled, even while the handle is kept; the loop's list of requests does not
    /// grow with finished ones.
    @Test func finishedRequestsReleaseTheirBlocks() async {
        final class Payload: Sendable {}
        let outcome = await TestThreads.run(name: "rlk-release") { () -> (Bool, Bool, Int) in
            let loop = RunLoop.current
            weak var ranPayload: Payload?
            weak var cancelledPayload: Payload?
            var handles: [RunLoop.PerformRequest] = []
            do {
                let payload = Payload()
                ranPayload = payload
                handles.append(loop.perform(after: .zero) { _ = payload })
                let other = Payload()
                cancelledPayload = other
                handles.append(loop.perform(after: .seconds(100)) { _ = other })
            }
            handles[1].cancel()
            loop.run(mode: .default, for: .seconds(10))
            // Many short-lived requests: the registry sweeps them out as it goes.
            for _ in 0..<100 {
                for _ in 0..<10 { loop.perform(after: .zero) {} }
                loop.run(mode: .default, for: .seconds(10))
            }
            let listed = loop.performRequests.takeAll().count
            return (ranPayload == nil, cancelledPayload == nil, listed)
        }
        #expect(outcome?.0 == true)
        #expect(outcome?.1 == true)
        // At most twice the pending requests (none) plus the sweep's floor, far fewer than 1,002.
        #expect((outcome?.2 ?? .max) <= 64)
    }
}
