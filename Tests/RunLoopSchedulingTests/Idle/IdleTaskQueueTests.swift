import Glibc
import RunLoopKit
import RunLoopScheduling
import SharedTestSupport
import Synchronization
import Testing

@Suite struct IdleTaskQueueTests {
    /// Tasks run inside beforeWaiting, after the observers ordered before the queue's, never in
    /// another mode.
    @Test func tasksRunAtBeforeWaitingInTheirModesOnly() {
        onNewThread { loop in
            let log = Log()
            let source = keepAlive(loop)
            let other = keepAlive(loop, "other")
            defer { source.invalidate(); other.invalidate() }
            let observer = RunLoopObserver(activities: [.beforeWaiting, .afterWaiting]) { _, activity in
                log.append(activity == .beforeWaiting ? "beforeWaiting" : "afterWaiting")
            }
            loop.add(observer, forMode: .default)
            let queue = IdleTaskQueue(loop: loop)
            defer { queue.invalidate() }
            queue.enqueue { _ in log.append("task"); return .done }
            loop.run(mode: "other", for: .milliseconds(50))
            #expect(log.all.isEmpty)  // another mode: nothing ran
            run(loop, until: { log.count("task") == 1 })
            let all = log.all
            let task = all.firstIndex(of: "task")!
            #expect(task > 0 && all[task - 1] == "beforeWaiting")
        }
    }

    /// At least one task per idle period, more while the budget lasts; the loop stays awake
    /// (without a timer or anyone's wakeup) until the queue is empty, then sleeps.
    @Test func aPeriodRunsTasksWhileTheBudgetLastsAndTheLoopStaysAwakeUntilEmpty() {
        onNewThread { loop in
            let source = keepAlive(loop)
            defer { source.invalidate() }
            let counter = ActivityCounter(loop)
            let periods = Log()
            let queue = IdleTaskQueue(loop: loop, budget: .milliseconds(10))
            defer { queue.invalidate() }
            for _ in 0..<20 {
                queue.enqueue { _ in
                    periods.append("\(loop.phaseSnapshot.generation)")
                    spin(for: .milliseconds(3))
                    return .done
                }
            }
            let done = run(loop, until: { queue.count == 0 })
            #expect(done)
            // 20 tasks of 3 ms with a 10 ms budget: 3 or 4 per period (the first always runs),
            // so at least 5 periods, at most 20 (a loaded machine stretches a task past the budget).
            let perPeriod = Dictionary(grouping: periods.all, by: { $0 }).values.map(\.count)
            #expect(perPeriod.allSatisfy { $0 >= 1 && $0 <= 4 }, "\(perPeriod)")
            #expect(perPeriod.count >= 5)
            // Now empty: the loop sleeps through a 200 ms run; its one wakeup is the run's own
            // deadline (afterWaiting fires for it, as in CF).
            let before = counter.wakeups.value
            loop.run(mode: .default, for: .milliseconds(200))
            #expect(counter.wakeups.value <= before + 1)
        }
    }

    /// A key replaces the queued task with that key; past capacity the oldest is dropped and
    /// counted; cancel removes by key.
    @Test func keysReplaceCapacityDropsTheOldestCancelRemoves() {
        onNewThread { loop in
            let source = keepAlive(loop)
            defer { source.invalidate() }
            let log = Log()
            let queue = IdleTaskQueue(loop: loop, capacity: 3)
            defer { queue.invalidate() }
            queue.enqueue(key: "a") { _ in log.append("a1"); return .done }
            queue.enqueue(key: "a") { _ in log.append("a2"); return .done }
            #expect(queue.count == 1)
            queue.enqueue { _ in log.append("b"); return .done }
            queue.enqueue { _ in log.append("c"); return .done }
            queue.enqueue { _ in log.append("d"); return .done }  // drops a2, the oldest
            #expect(queue.count == 3)
            #expect(queue.droppedCount == 1)
            queue.cancel(key: "nothing")
            queue.enqueue(key: "e") { _ in log.append("e"); return .done }  // drops b
            queue.cancel(key: "e")
            #expect(queue.count == 2)
            run(loop, until: { queue.count == 0 })
            #expect(log.all == ["c", "d"])
        }
    }

    /// shouldYield turns true as soon as the loop has input (here: another thread's wakeUp()),
    /// long before a 10 s budget is spent.
    @Test func shouldYieldTurnsTrueOnNewInput() {
        onNewThread { loop in
            let source = keepAlive(loop)
            defer { source.invalidate() }
            let queue = IdleTaskQueue(loop: loop, budget: .seconds(10))
            defer { queue.invalidate() }
            let started = Flag()
            let yielded = Flag()
            queue.enqueue { deadline in
                started.set()
                #expect(!deadline.didTimeout)
                while !deadline.shouldYield {}
                yielded.set()
                return .done
            }
            let waker = TestThread(name: "waker") {
                _ = waitUntil { started.isSet }
                loop.wakeUp()
            }
            let start = ContinuousClock.now
            run(loop, until: { yielded.isSet })
            #expect(waker.join(timeout: .seconds(10)))
            #expect(yielded.isSet)
            // Bound: the wakeup comes within milliseconds; 5 s of room for a loaded machine, far
            // below the 10 s budget.
            #expect(ContinuousClock.now - start < .seconds(5))
        }
    }

    /// A loop that is never idle (a source that signals itself every pass: no beforeWaiting)
    /// still runs a task with a timeout, as an ordinary block, once the timeout passes.
    @Test func aTaskWithATimeoutRunsOnANeverIdleLoop() {
        onNewThread { loop in
            let busy = Count()
            let box = SourceBox()
            let source = RunLoopSource { busy.add(); box.source?.signal() }
            box.source = source
            loop.add(source, forMode: .default)
            source.signal()
            defer { source.invalidate() }
            let queue = IdleTaskQueue(loop: loop)
            defer { queue.invalidate() }
            let timedOut = Count()
            queue.enqueue(timeout: .milliseconds(50)) { deadline in
                if deadline.didTimeout { timedOut.add() }
                return .done
            }
            run(loop, until: { timedOut.value == 1 })
            #expect(timedOut.value == 1)
            #expect(queue.timedOutCount == 1)
            #expect(busy.value > 10)
        }
    }

    /// A task that asks for more forever cannot starve a timer: it runs once per period, and the
    /// 5 ms timer keeps firing.
    @Test func aTaskThatNeverFinishesCannotStarveTimers() {
        onNewThread { loop in
            let queue = IdleTaskQueue(loop: loop, budget: .milliseconds(2))
            defer { queue.invalidate() }
            let runs = Count()
            queue.enqueue { _ in runs.add(); return .more }
            let fired = Count()
            let timer = RunLoopTimer(after: .milliseconds(5), repeating: .milliseconds(5)) { _ in fired.add() }
            loop.add(timer, forMode: .default)
            defer { timer.invalidate() }
            run(loop, until: { fired.value >= 20 })
            #expect(fired.value >= 20)
            #expect(runs.value > 20)
        }
    }

    /// invalidate() from inside a task: the period stops, the other tasks are dropped and
    /// released.
    @Test func invalidatingFromInsideATaskIsSafe() {
        onNewThread { loop in
            let source = keepAlive(loop)
            defer { source.invalidate() }
            let queue = IdleTaskQueue(loop: loop, budget: .seconds(1))
            let later = Tracked()
            let watch = WeakRef(later)
            let ran = Count()
            queue.enqueue { _ in ran.add(); queue.invalidate(); return .more }
            queue.enqueue { [later] _ in _ = later; ran.add(); return .done }
            _ = consume later
            run(loop, until: { !queue.isValid })
            loop.run(mode: .default, for: .milliseconds(20))
            #expect(ran.value == 1)
            #expect(queue.count == 0)
            #expect(watch.isReleased)
            #expect(!queue.enqueue { _ in .done })
        }
    }

    /// A budget or timeout of `.seconds(Int64.max)` is "no limit", not an overflow trap.
    @Test func hugeBudgetAndTimeoutAreClamped() {
        onNewThread { loop in
            let source = keepAlive(loop)
            defer { source.invalidate() }
            let queue = IdleTaskQueue(loop: loop, budget: .seconds(Int64.max))
            defer { queue.invalidate() }
            let ran = Count()
            queue.enqueue(timeout: .seconds(Int64.max)) { deadline in
                ran.add()
                #expect(deadline.timeRemaining > .seconds(86_400))
                return .done
            }
            run(loop, until: { ran.value == 1 })
            #expect(ran.value == 1)
        }
    }

    /// The loop's thread exits with tasks queued: they are released, and later enqueues fail.
    @Test func tasksAreReleasedWhenTheLoopsThreadExits() {
        let holder = Mutex<IdleTaskQueue?>(nil)
        let object = Tracked()
        let watch = WeakRef(object)
        onNewThread { [object] loop in
            let queue = IdleTaskQueue(loop: loop)
            queue.enqueue { [object] _ in _ = object; return .done }
            holder.locked { $0 = queue }
        }
        _ = consume object
        let queue = holder.locked { $0 }!
        #expect(watch.isReleased)
        #expect(!queue.isValid)
        #expect(!queue.enqueue { _ in .done })
    }
}

/// Lets a source's handler reach the source.
final class SourceBox: @unchecked Sendable {
    // @unchecked: written once before the source is added to its loop, read only by its handler
    // on the loop's thread afterwards. Weak: the source's handler holds the box (no cycle).
    weak var source: RunLoopSource?
}
