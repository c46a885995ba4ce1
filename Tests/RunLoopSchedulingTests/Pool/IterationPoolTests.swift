import Glibc
import RunLoopKit
import RunLoopScheduling
import SharedTestSupport
import Synchronization
import Testing

@Suite struct IterationPoolTests {
    /// Objects are let go at the end of the iteration (beforeWaiting), deferred closures run then,
    /// last in first out.
    @Test func releasedAtTheEndOfTheIterationLastInFirstOut() {
        onNewThread { loop in
            let source = keepAlive(loop)
            defer { source.invalidate() }
            let pool = IterationPool(loop: loop)
            defer { pool.invalidate() }
            let log = Log()
            let watch = Mutex<WeakRef?>(nil)
            let checkedInIteration = Flag()
            loop.perform {
                let object = Tracked()
                watch.locked { $0 = WeakRef(object) }
                pool.release(object)
                pool.defer { log.append("first") }
                pool.defer { log.append("second") }
                if watch.locked({ $0 })?.isReleased == false { checkedInIteration.set() }
            }
            run(loop, until: { log.all.count == 2 })
            #expect(checkedInIteration.isSet)
            #expect(log.all == ["second", "first"])
            #expect(watch.locked { $0 }?.isReleased == true)
        }
    }

    /// A nested run lets go of what was handed over inside it at its exit, not what the outer
    /// level holds.
    @Test func eachRunLevelDrainsItsOwn() {
        onNewThread { loop in
            let source = keepAlive(loop)
            defer { source.invalidate() }
            let pool = IterationPool(loop: loop)
            defer { pool.invalidate() }
            let log = Log()
            loop.perform {
                pool.defer { log.append("outer") }
                loop.perform { pool.defer { log.append("inner") } }
                loop.run(mode: .default, for: .zero)  // nested: runs the inner block, exits
                log.append("nested run returned")
            }
            run(loop, until: { log.all.count == 3 })
            #expect(log.all == ["inner", "nested run returned", "outer"])
        }
    }

    /// A closure that defers itself forever runs once per iteration: timers keep firing.
    @Test func aClosureThatDefersItselfForeverCannotStarveTimers() {
        onNewThread { loop in
            let pool = IterationPool(loop: loop)
            defer { pool.invalidate() }
            let runs = Count()
            @Sendable func again() { runs.add(); pool.defer(again) }
            pool.defer(again)
            let fired = Count()
            let timer = RunLoopTimer(after: .milliseconds(5), repeating: .milliseconds(5)) { _ in fired.add() }
            loop.add(timer, forMode: .default)
            defer { timer.invalidate() }
            run(loop, until: { fired.value >= 20 })
            #expect(fired.value >= 20)
            #expect(runs.value > 20)
        }
    }

    /// The thread exits with objects pending: they are released.
    @Test func pendingObjectsAreReleasedWhenTheThreadExits() {
        let object = Tracked()
        let watch = WeakRef(object)
        onNewThread { [object] loop in
            let pool = IterationPool(loop: loop)
            pool.release(object)
        }
        _ = consume object
        #expect(watch.isReleased)
    }
}

/// Deferred closures and deinits that run the loop nested during a drain (a connection flushing in
/// its `deinit`): the nested runs push levels their exits cannot pop (the drain's observer is
/// firing), and may take the wakeup meant for the next drain. Nothing may be stranded or leaked.
@Suite struct IterationPoolNestedRunTests {
    /// Counts its deinits.
    final class Counted: Sendable {
        let deinits: Count
        init(_ deinits: Count) { self.deinits = deinits }
        deinit { deinits.add() }
    }

    /// Counts its deinit, in which it runs the loop nested.
    final class RunsTheLoopInDeinit: Sendable {
        let deinits: Count
        init(_ deinits: Count) { self.deinits = deinits }
        deinit {
            deinits.add()
            RunLoop.current.run(mode: .default, for: .milliseconds(1))
        }
    }

    /// 5,000 objects over 5 runs, handed over between runs and inside them; the first one's
    /// deinit runs the loop nested. Every one is let go by the run after it was handed over.
    @Test func anObjectWhoseDeinitRunsTheLoopStrandsNothing() {
        onNewThread { loop in
            let source = keepAlive(loop)
            defer { source.invalidate() }
            let pool = IterationPool(loop: loop)
            let deinits = Count()
            for run in 0..<5 {
                for index in 0..<500 {
                    if run == 0 && index == 0 {
                        pool.release(RunsTheLoopInDeinit(deinits))
                    } else {
                        pool.release(Counted(deinits))
                    }
                }
                loop.perform {
                    for _ in 0..<500 { pool.release(Counted(deinits)) }
                }
                // A pass (its beforeWaiting drain), then a sleep to the 20 ms deadline, the exit drain.
                loop.run(mode: .default, for: .milliseconds(20))
                #expect(deinits.value == (run + 1) * 1_000, "after run \(run + 1): \(deinits.value) of \((run + 1) * 1_000) let go")
            }
            #expect(pool.pendingCount == 0)
            pool.invalidate()
            #expect(deinits.value == 5_000)
        }
    }

    /// A closure deferred by a closure that then runs the loop nested runs at the next drain of
    /// the same run, not when something unrelated wakes the loop (here: never; the run's 10 s
    /// timeout).
    @Test func aClosureDeferredBeforeANestedRunRunsAtTheNextDrain() {
        onNewThread { loop in
            let source = keepAlive(loop)
            defer { source.invalidate() }
            let pool = IterationPool(loop: loop)
            defer { pool.invalidate() }
            let ran = Flag()
            pool.defer {
                pool.defer {
                    ran.set()
                    loop.stop()
                }
                RunLoop.current.run(mode: .default, for: .milliseconds(1))
            }
            let start = ContinuousClock.now
            let result = loop.run(mode: .default, for: .seconds(10))
            let took = ContinuousClock.now - start
            #expect(ran.isSet)
            #expect(result == .stopped)
            // The next drain is microseconds away; 5 s of room for a loaded machine, half the
            // timeout the stranded closure waited for.
            #expect(took < .seconds(5), "the deferred closure waited \(took) for an unrelated wakeup")
        }
    }

    /// The same with a deinit that runs the loop nested and hands an object over first.
    @Test func anObjectHandedOverByADeinitThatRunsTheLoopIsLetGoAtTheNextDrain() {
        onNewThread { loop in
            let source = keepAlive(loop)
            defer { source.invalidate() }
            let pool = IterationPool(loop: loop)
            defer { pool.invalidate() }
            final class HandsOverThenRuns: Sendable {
                let pool: IterationPool
                let handed: Tracked
                init(_ pool: IterationPool, _ handed: Tracked) {
                    self.pool = pool
                    self.handed = handed
                }
                deinit {
                    pool.release(handed)
                    pool.defer { RunLoop.current.stop() }
                    RunLoop.current.run(mode: .default, for: .milliseconds(1))
                }
            }
            var handed: Tracked? = Tracked()
            let watch = WeakRef(handed!)
            pool.release(HandsOverThenRuns(pool, handed!))
            handed = nil
            let start = ContinuousClock.now
            let result = loop.run(mode: .default, for: .seconds(10))
            // Bound as above.
            #expect(ContinuousClock.now - start < .seconds(5))
            #expect(result == .stopped)
            #expect(watch.isReleased)
            #expect(pool.pendingCount == 0)
        }
    }
}
