import Glibc
import RunLoopKit
import RunLoopScheduling
import SharedTestSupport
import Synchronization
import Testing

@Suite struct CommitCoalescerTests {
    /// 1,000 setNeedsCommit calls over 10 keys in one iteration: one commit, each key's latest
    /// work once, in the order the keys were first set.
    @Test func manyCallsInOneIterationCommitEachKeysLatestWorkOnce() {
        onNewThread { loop in
            let source = keepAlive(loop)
            defer { source.invalidate() }
            let log = Log()
            let coalescer = CommitCoalescer(loop: loop)
            defer { coalescer.invalidate() }
            let done = Flag()
            loop.perform {
                for i in 0..<1_000 {
                    let key = i % 10
                    coalescer.setNeedsCommit(key: key) { log.append("\(key):\(i)") }
                }
                done.set()
            }
            run(loop, until: { coalescer.commitCount == 1 && coalescer.pendingCount == 0 })
            #expect(done.isSet)
            #expect(coalescer.commitCount == 1)
            #expect(log.all == (0..<10).map { "\($0):\(990 + $0)" })
        }
    }

    /// Work set during a commit runs in the next iteration, and the loop is woken for it (no
    /// timer or other thread helps).
    @Test func workSetDuringACommitRunsNextIterationWithoutHelp() {
        onNewThread { loop in
            let source = keepAlive(loop)
            defer { source.invalidate() }
            let generations = Log()
            let coalescer = CommitCoalescer(loop: loop)
            defer { coalescer.invalidate() }
            loop.perform {
                coalescer.setNeedsCommit(key: "first") {
                    generations.append("first \(loop.phaseSnapshot.generation)")
                    coalescer.setNeedsCommit(key: "second") { generations.append("second \(loop.phaseSnapshot.generation)") }
                }
            }
            let start = ContinuousClock.now
            run(loop, until: { generations.all.count == 2 })
            #expect(generations.all.count == 2)
            #expect(coalescer.commitCount == 2)
            // Bound: two passes take microseconds; 5 s of room, far from "never".
            #expect(ContinuousClock.now - start < .seconds(5))
            let numbers = generations.all.map { UInt64($0.split(separator: " ")[1])! }
            #expect(numbers[1] > numbers[0])
        }
    }

    /// The exit of a nested run commits what was set inside it.
    @Test func theExitOfANestedRunCommits() {
        onNewThread { loop in
            let source = keepAlive(loop)
            defer { source.invalidate() }
            let log = Log()
            let coalescer = CommitCoalescer(loop: loop)
            defer { coalescer.invalidate() }
            loop.perform {
                coalescer.setNeedsCommit(key: "k") { log.append("commit") }
                loop.run(mode: .default, for: .zero)
                log.append("after nested run")
            }
            run(loop, until: { log.all.count == 2 })
            #expect(log.all == ["commit", "after nested run"])
        }
    }

    /// Layout at 1,999,000 sets display work on a coalescer at 2,000,000: both commit in the same
    /// iteration, layout first (the iOS main loop's observers).
    @Test func coalescersAtDifferentOrdersComposeInOneIteration() {
        onNewThread { loop in
            let source = keepAlive(loop)
            defer { source.invalidate() }
            let log = Log()
            let display = CommitCoalescer(loop: loop, order: 2_000_000)
            let layout = CommitCoalescer(loop: loop, order: 1_999_000)
            defer { display.invalidate(); layout.invalidate() }
            loop.perform {
                layout.setNeedsCommit(key: "view") {
                    log.append("layout \(loop.phaseSnapshot.generation)")
                    display.setNeedsCommit(key: "view") { log.append("display \(loop.phaseSnapshot.generation)") }
                }
            }
            run(loop, until: { log.all.count == 2 })
            let entries = log.all
            #expect(entries.count == 2)
            #expect(entries.first?.hasPrefix("layout") == true)
            #expect(entries.map { $0.split(separator: " ")[1] }.allSatisfy { $0 == entries[0].split(separator: " ")[1] })
        }
    }

    /// Invalidating from inside a commit is safe; the loop's thread exiting drops pending work.
    @Test func invalidateInsideACommitAndThreadExitReleaseTheWork() {
        let holder = Mutex<CommitCoalescer?>(nil)
        let object = Tracked()
        let watch = WeakRef(object)
        onNewThread { [object] loop in
            let source = keepAlive(loop)
            defer { source.invalidate() }
            let coalescer = CommitCoalescer(loop: loop)
            let ran = Count()
            loop.perform {
                coalescer.setNeedsCommit(key: 1) { ran.add(); coalescer.invalidate() }
                coalescer.setNeedsCommit(key: 2) { ran.add() }
            }
            run(loop, until: { !coalescer.isValid })
            #expect(ran.value == 2)  // the commit in progress finishes
            let exiting = CommitCoalescer(loop: loop)
            exiting.setNeedsCommit(key: "pending") { [object] in _ = object }
            holder.locked { $0 = exiting }
        }
        _ = consume object
        #expect(watch.isReleased)
        #expect(holder.locked { $0 }?.isValid == false)
    }
}
