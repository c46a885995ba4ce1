import Glibc
import RunLoopKit
import RunLoopScheduling
import SharedTestSupport
import Synchronization
import Testing

/// Pending idle tasks, commits and pool work keep their modes from counting as empty, as
/// CoreFoundation's pending blocks do: a run in a mode that holds nothing else runs the work
/// instead of returning `.finished` at once and stranding it. Once nothing is pending they keep
/// nothing alive, and the run ends `.finished` without sleeping to its timeout.
///
/// Time bounds: each run below is given 20 s; one that ends by its emptiness rule takes
/// microseconds, so "well under 10 s" tells an emptiness ending from a timeout with room for a
/// loaded machine.
@Suite struct PendingWorkKeepsTheModeTests {
    static let runFor = Duration.seconds(20)
    static let promptly = Duration.seconds(10)

    /// Runs `loop` once in `mode` for ``runFor``; returns the result and how long it took.
    static func timedRun(_ loop: RunLoop, mode: RunLoop.Mode = .default) -> (RunLoop.RunResult, Duration) {
        let start = ContinuousClock.now
        let result = loop.run(mode: mode, for: runFor)
        return (result, ContinuousClock.now - start)
    }

    @Test func aPendingIdleTaskKeepsItsModeAliveUntilItRan() {
        onNewThread { loop in
            let queue = IdleTaskQueue(loop: loop)
            defer { queue.invalidate() }
            let ran = Count()
            queue.enqueue { _ in ran.add(); return .done }
            let (result, took) = Self.timedRun(loop)
            #expect(ran.value == 1, "the task was stranded: the run ended .\(result) without it")
            #expect(result == .finished)
            #expect(took < Self.promptly, "the run slept to its timeout after the last task")
            // Nothing pending: the queue keeps nothing alive.
            #expect(queue.count == 0)
            #expect(!loop.run(mode: .default, before: .now + .seconds(20)))
        }
    }

    /// A task that asks for more several times: the run goes on through every idle period.
    @Test func anIdleTaskThatAsksForMoreKeepsTheRunGoingUntilDone() {
        onNewThread { loop in
            let queue = IdleTaskQueue(loop: loop)
            defer { queue.invalidate() }
            let ran = Count()
            queue.enqueue { _ in
                ran.add()
                return ran.value < 5 ? .more : .done
            }
            let (result, took) = Self.timedRun(loop)
            #expect(ran.value == 5)
            #expect(result == .finished)
            #expect(took < Self.promptly)
        }
    }

    @Test func anEmptyOrCancelledIdleQueueDoesNotKeepTheRunAlive() {
        onNewThread { loop in
            let queue = IdleTaskQueue(loop: loop)
            defer { queue.invalidate() }
            #expect(loop.run(mode: .default, for: Self.runFor) == .finished)
            queue.enqueue(key: "k") { _ in .done }
            queue.cancel(key: "k")
            let (result, took) = Self.timedRun(loop)
            #expect(result == .finished)
            #expect(took < Self.promptly)
            let other = IdleTaskQueue(loop: loop)
            other.enqueue { _ in .done }
            other.invalidate()
            #expect(loop.run(mode: .default, for: Self.runFor) == .finished)
        }
    }

    @Test func aPendingCommitKeepsItsModesAliveUntilCommitted() {
        onNewThread { loop in
            loop.addCommonMode("other")
            let coalescer = CommitCoalescer(loop: loop)  // the common modes
            defer { coalescer.invalidate() }
            let log = Log()
            coalescer.setNeedsCommit(key: 1) { log.append("default") }
            let (result, took) = Self.timedRun(loop)
            #expect(log.all == ["default"], "the commit was stranded: the run ended .\(result) without it")
            #expect(result == .finished)
            #expect(took < Self.promptly)
            // Another common mode: the same.
            coalescer.setNeedsCommit(key: 1) { log.append("other") }
            let (otherResult, otherTook) = Self.timedRun(loop, mode: "other")
            #expect(log.all == ["default", "other"])
            #expect(otherResult == .finished)
            #expect(otherTook < Self.promptly)
            // Nothing pending: nothing kept alive.
            #expect(loop.run(mode: .default, for: Self.runFor) == .finished)
            #expect(coalescer.commitCount == 2)
        }
    }

    @Test func pendingPoolWorkKeepsItsModesAliveUntilDrained() {
        onNewThread { loop in
            let pool = IterationPool(loop: loop)
            defer { pool.invalidate() }
            let ran = Count()
            let object = Tracked()
            let watch = WeakRef(object)
            pool.release(object)
            _ = consume object
            pool.defer { ran.add() }
            let (result, took) = Self.timedRun(loop)
            #expect(ran.value == 1, "the deferred closure was stranded: the run ended .\(result) without it")
            #expect(watch.isReleased)
            #expect(result == .finished)
            #expect(took < Self.promptly)
            #expect(pool.pendingCount == 0)
            #expect(loop.run(mode: .default, for: Self.runFor) == .finished)
        }
    }

    /// What the outer level of a pool holds is let go by the outer run's drain, not by a nested
    /// run: it does not keep a nested run (which could not drain it) going.
    @Test func poolWorkOfAnOuterLevelDoesNotKeepANestedRunAlive() {
        onNewThread { loop in
            let pool = IterationPool(loop: loop)
            defer { pool.invalidate() }
            let nested = Mutex<(RunLoop.RunResult, Duration)?>(nil)
            let ran = Count()
            loop.perform {
                pool.defer { ran.add() }
                nested.locked { $0 = Self.timedRun(loop) }
            }
            let (result, _) = Self.timedRun(loop)
            let (nestedResult, nestedTook) = try! #require(nested.locked { $0 })
            #expect(nestedResult == .finished)
            #expect(nestedTook < Self.promptly)
            #expect(ran.value == 1)
            #expect(result == .finished)
        }
    }

    /// Work set by a commit, an idle task or a drain that then runs the loop nested cannot be
    /// served by that nested run (the object's observer is firing): it does not keep the nested
    /// run going; the outer run serves it at its next pass.
    @Test func workSetInsideTheObjectsOwnCalloutDoesNotKeepANestedRunAlive() {
        onNewThread { loop in
            let coalescer = CommitCoalescer(loop: loop)
            let queue = IdleTaskQueue(loop: loop)
            let pool = IterationPool(loop: loop)
            defer {
                coalescer.invalidate()
                queue.invalidate()
                pool.invalidate()
            }
            let nestedTook = Mutex<[String: Duration]>([:])
            let log = Log()
            @Sendable func nestedRun(_ name: String) {
                let start = ContinuousClock.now
                loop.run(mode: .default, for: Self.runFor)
                nestedTook.locked { $0[name] = ContinuousClock.now - start }
            }
            coalescer.setNeedsCommit(key: 1) {
                coalescer.setNeedsCommit(key: 2) { log.append("commit 2") }
                nestedRun("commit")
            }
            queue.enqueue { _ in
                queue.enqueue { _ in log.append("task 2"); return .done }
                nestedRun("task")
                return .done
            }
            pool.defer {
                pool.defer { log.append("closure 2") }
                nestedRun("closure")
            }
            let (result, took) = Self.timedRun(loop)
            #expect(Set(log.all) == ["commit 2", "task 2", "closure 2"])
            #expect(result == .finished)
            #expect(took < Self.promptly)
            for (name, duration) in nestedTook.locked({ $0 }) {
                #expect(duration < Self.promptly, "the run nested in the \(name) waited for its timeout")
            }
        }
    }
}
