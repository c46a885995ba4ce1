import CRunLoopKit
import Glibc
import SharedTestSupport
import Synchronization
import Testing

@testable import RunLoopKit

@Suite(.serialized, .exclusive(.robustness)) struct PermanentThreadTests {
    @Test func hundredThousandTasksRunOnOneThreadInSubmissionOrder() throws {
        let worker = PermanentThread(name: "pt-order")
        defer { worker.stop() }
        let count = 100_000
        let seen = Recorded<Int>()
        let threads = Mutex<Set<Int32>>([])
        for index in 0..<count {
            try worker.execute {
                seen.append(index)
                let tid = crlk_gettid()
                threads.locked { _ = $0.insert(tid) }
            }
        }
        // Queued behind all of them: when it returns, they have run.
        let ranOnWorker = try worker.executeAndWait { crlk_gettid() }
        #expect(ranOnWorker == worker.threadID)
        let order = seen.all
        #expect(order.count == count)
        #expect(order == Array(0..<count), "tasks ran out of submission order")
        #expect(threads.locked { $0 } == [worker.threadID])
    }

    @Test func stopWithTasksPendingRunsThemAllThenEndsTheThread() throws {
        let before = ThreadTable.all()
        let worker = PermanentThread(name: "pt-pending")
        let tid = worker.threadID
        #expect(ThreadTable.exists(tid))
        let gate = TestEvent()
        let ran = Recorded<Int>()
        try worker.execute { _ = gate.wait(timeout: .seconds(30)) }
        for index in 0..<1_000 { try worker.execute { ran.append(index) } }
        // stop() blocks until the thread has ended, so another thread calls it.
        let stopper = TestThread(name: "pt-stopper") { worker.stop() }
        // A bounded wait for the stop to be requested (tasks are rejected from then on).
        #expect(waitUntil { worker.isStopped })
        #expect(throws: PermanentThread.Error.stopped) { try worker.execute { ran.append(-1) } }
        #expect(!stopper.hasExited, "stop() returned while tasks were pending")
        gate.fire()
        #expect(stopper.join(timeout: .seconds(30)), "stop() did not return")
        // Every task accepted before stop() ran, in order; the late one did not.
        #expect(ran.all == Array(0..<1_000))
        // stop() joined the thread: its loop was torn down by then, and the kernel reaps the
        // task right after (pthread_join returns when the kernel clears the thread's tid, a
        // moment before /proc/self/task/<tid> goes away: hence a bounded wait).
        #expect(worker.loop.isTornDown)
        #expect(waitUntil { !ThreadTable.exists(tid) }, "thread \(tid) still exists after stop()")
        #expect(waitUntil { ThreadTable.named("pt-pending").isEmpty })
        // The process's thread count returns to its start. The test runner's threads (the
        // concurrency pool, other suites' helpers) may come and go meanwhile, so the count is
        // given a bounded time to settle; threads that appeared for good must not be ours.
        var after = ThreadTable.all()
        _ = waitUntil(timeout: .seconds(2)) {
            after = ThreadTable.all()
            return after.count <= before.count
        }
        let newcomers = after.filter { before[$0.key] == nil }
        #expect(
            after.count <= before.count || !newcomers.contains { $0.value.hasPrefix("pt-") },
            "threads before \(before.count), after \(after.count); new: \(newcomers)")
    }

    @Test func aThousandThreadsCreatedAndDroppedLeaveNoThreadAndNoDescriptor() throws {
        // Warm-up: process-wide state made lazily (the thread-local key, the clock anchor).
        do {
            let warm = PermanentThread(name: "pt-warm")
            _ = try warm.executeAndWait { 0 }
        }
        let descriptorsBefore = TestThreads.openFileDescriptors()
        let kindsBefore = loopDescriptorKinds()
        let start = ContinuousClock.now
        var tids: [Int32] = []
        var loops: [RunLoop] = []
        for index in 0..<1_000 {
            let worker = PermanentThread(name: "pt-churn")
            tids.append(worker.threadID)
            loops.append(worker.loop)
            // Half of them get work (and one runs it before being dropped).
            if index % 2 == 0 { try worker.execute {} }
        }
        let elapsed = ContinuousClock.now - start
        // Each thread was joined by its deinit, after its loop was torn down: its kernel
        // descriptors (epoll, eventfd, timerfd) are closed.
        let openLoops = loops.filter { !$0.isTornDown }.count
        #expect(openLoops == 0, "\(openLoops) loops of dropped threads still hold their descriptors")
        // Joined threads; the kernel reaps each a moment after its join returns.
        #expect(waitUntil { ThreadTable.named("pt-churn").isEmpty })
        #expect(tids.allSatisfy { !ThreadTable.exists($0) })
        // The process's descriptors: other suites run in parallel and open and close loops and
        // sockets meanwhile, so the count is given up to 5 s to settle back to its start. If
        // it does not (a parallel suite holds some open), a per-thread leak still shows: one
        // descriptor per thread would leave 1,000 more, and a loop's three 3,000.
        var after = TestThreads.openFileDescriptors()
        var kindsAfter = loopDescriptorKinds()
        let settled = waitUntil(timeout: .seconds(5)) {
            after = TestThreads.openFileDescriptors()
            kindsAfter = loopDescriptorKinds()
            return after == descriptorsBefore && kindsAfter == kindsBefore
        }
        if !settled {
            let grown = after - descriptorsBefore
            #expect(
                grown < 100,
                "open descriptors before \(descriptorsBefore), after \(after): \(describeOpenDescriptors())")
            for (kind, count) in kindsAfter {
                #expect(count - kindsBefore[kind, default: 0] < 100, "\(kind): \(kindsBefore) -> \(kindsAfter)")
            }
        }
        #expect(elapsed < .seconds(TestThreads.sanitized ? 30 : 5), "1,000 threads took \(elapsed)")
    }

    @Test func executeAndWaitFromItsOwnThreadRunsInline() async throws {
        let result = await TestThreads.run(name: "pt-inline-t", timeout: .seconds(30)) { () -> String? in
            let worker = PermanentThread(name: "pt-inline")
            defer { worker.stop() }
            do {
                let steps = Recorded<String>()
                let inner = try worker.executeAndWait { () throws -> Int32 in
                    steps.append("outer begins")
                    let value = try worker.executeAndWait { () -> Int32 in
                        steps.append("inner")
                        return crlk_gettid()
                    }
                    steps.append("outer ends")
                    return value
                }
                guard inner == worker.threadID else { return "inner task ran on tid \(inner)" }
                guard steps.all == ["outer begins", "inner", "outer ends"] else { return "steps \(steps.all)" }
                return nil
            } catch {
                return "\(error)"
            }
        }
        #expect(result == .some(nil), "\(String(describing: result))")
    }

    @Test func aThrowingTaskDeliversItsErrorToTheCaller() throws {
        let worker = PermanentThread(name: "pt-throw")
        defer { worker.stop() }
        #expect(throws: TaskFailure(code: 7)) {
            _ = try worker.executeAndWait { () throws -> Int in throw TaskFailure(code: 7) }
        }
        // The thread goes on serving.
        #expect(try worker.executeAndWait { 42 } == 42)
    }

    @Test func tasksAfterStopAreRejectedAndStopIsIdempotent() throws {
        let worker = PermanentThread(name: "pt-reject")
        let tid = worker.threadID
        try worker.execute {}
        worker.stop()
        #expect(worker.isStopped)
        #expect(worker.loop.isTornDown)
        #expect(waitUntil { !ThreadTable.exists(tid) })
        #expect(throws: PermanentThread.Error.stopped) { try worker.execute {} }
        #expect(throws: PermanentThread.Error.stopped) { _ = try worker.executeAndWait { 1 } }
        worker.stop()
        worker.stop()
    }

    @Test func concurrentStopsAllReturnAfterTheThreadHasEnded() throws {
        let worker = PermanentThread(name: "pt-stops")
        let tid = worker.threadID
        let gate = TestEvent()
        try worker.execute { _ = gate.wait(timeout: .seconds(30)) }
        let exitedWhenReturned = Recorded<Bool>()
        let stoppers = (0..<8).map { _ in
            TestThread(name: "pt-stopper") {
                worker.stop()
                // The loop's teardown (run by the thread's exit) is over when stop() returns.
                exitedWhenReturned.append(worker.loop.isTornDown)
            }
        }
        #expect(waitUntil { worker.isStopped })
        gate.fire()
        for stopper in stoppers { #expect(stopper.join(timeout: .seconds(30))) }
        #expect(exitedWhenReturned.all == Array(repeating: true, count: 8))
        #expect(waitUntil { !ThreadTable.exists(tid) })
    }

    @Test func stopFromItsOwnThreadRequestsTheStopAndReturns() throws {
        let worker = PermanentThread(name: "pt-selfstop")
        let tid = worker.threadID
        let ran = Recorded<String>()
        let gate = TestEvent()
        let stopRequested = TestEvent()
        try worker.execute {
            _ = gate.wait(timeout: .seconds(30))
            worker.stop()  // does not wait for itself
            ran.append("stop returned")
            // Rejected: the stop was requested.
            ran.append((try? worker.execute {}) == nil ? "rejected" : "accepted")
            stopRequested.fire()
        }
        try worker.execute { ran.append("queued before the stop") }
        gate.fire()
        #expect(stopRequested.wait(timeout: .seconds(30)))
        // From here, a stop() waits for the end of the thread.
        worker.stop()
        #expect(ran.all == ["stop returned", "rejected", "queued before the stop"])
        #expect(waitUntil { !ThreadTable.exists(tid) })
    }

    @Test func droppingTheLastReferenceOnTheThreadItselfEndsIt() throws {
        let gate = TestEvent()
        let ran = Recorded<String>()
        var tid: Int32 = 0
        do {
            let worker = PermanentThread(name: "pt-selfdrop")
            tid = worker.threadID
            try worker.execute { [worker] in
                _ = gate.wait(timeout: .seconds(30))
                ran.append("task with the last reference \(worker.threadID)")
            }
            try worker.execute { ran.append("next task") }
        }
        // The task now holds the only reference; it is released on the thread, after the task.
        gate.fire()
        // Detached by its own deinit, the thread ends by itself: a bounded wait for it.
        #expect(waitUntil { !ThreadTable.exists(tid) }, "thread \(tid) did not end")
        #expect(ran.all == ["task with the last reference \(tid)", "next task"])
    }

    @Test func theThreadCarriesItsNameForTheOS() throws {
        let worker = PermanentThread(name: "pt-named-thread-long-name")
        defer { worker.stop() }
        // The kernel keeps 15 bytes.
        #expect(ThreadTable.name(of: worker.threadID) == "pt-named-thread")
        #expect(try worker.executeAndWait { ThreadLoops.currentName() } == "pt-named-thread")
    }

    @Test func aTaskRunningTheLoopNestedIsEndedByStop() throws {
        let worker = PermanentThread(name: "pt-nested")
        let tid = worker.threadID
        let nestedRunning = TestEvent()
        let nestedReturned = TestEvent()
        try worker.execute {
            // A nested run in the default mode: the stop's final block, queued while it runs,
            // runs inside it and must end it and then the outer run.
            RunLoop.current.perform { nestedRunning.fire() }
            RunLoop.current.run(mode: .default, for: .seconds(30))
            nestedReturned.fire()
        }
        #expect(nestedRunning.wait(timeout: .seconds(30)))
        let start = ContinuousClock.now
        worker.stop()
        #expect(ContinuousClock.now - start < .seconds(10), "stop() waited for the nested run's timeout")
        #expect(nestedReturned.wait(timeout: .zero))
        #expect(waitUntil { !ThreadTable.exists(tid) })
    }

    @Test func timersOnTheThreadsLoopAreServedBetweenTasks() throws {
        let worker = PermanentThread(name: "pt-timer")
        defer { worker.stop() }
        let fired = TestEvent()
        let timer = RunLoopTimer(after: .milliseconds(1)) { _ in fired.fire() }
        worker.loop.add(timer, forMode: .default)
        #expect(fired.wait(timeout: .seconds(30)))
    }
}
