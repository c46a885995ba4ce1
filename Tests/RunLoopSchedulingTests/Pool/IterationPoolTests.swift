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
