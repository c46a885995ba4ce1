import CRunLoopKit
import RunLoopKit
import SharedTestSupport
import Synchronization
import Testing

// Swift concurrency on a run loop (issue 4, item 4): a loop as an actor's serial executor, and
// `try await loop.submit { value }`.

@Suite struct ConcurrencyTests {
    // MARK: The loop as an actor's executor

    @Test func actorMethodsRunOnTheLoopsThread() async throws {
        let host = try #require(ModalLoop.start(name: "rlk-conc-actor"))
        let actor = LoopActor(loop: host.loop)
        let tid = try #require(host.thread.tid())

        let placement = await actor.placement()
        #expect(placement == Placement(onLoopThread: true, tid: tid, mode: .default))
        #expect(await actor.increment())

        // assumeIsolated outside the actor's jobs, from a block, a timer and an observer on the
        // loop's thread: the runtime asks the executor (isIsolatingCurrentContext/checkIsolated).
        let counts = TestMonitor<[Int]>([])
        host.loop.perform {
            let count = actor.assumeIsolated { actor in
                actor.count += 1
                return actor.count
            }
            counts.update { $0.append(count) }
        }
        let timer = RunLoopTimer(after: .milliseconds(1)) { _ in
            actor.preconditionIsolated()
            let count = actor.assumeIsolated { actor in
                actor.count += 1
                return actor.count
            }
            counts.update { $0.append(count) }
        }
        host.loop.add(timer, forMode: .default)
        #expect(await counts.waitAsync(timeout: concurrencyPatience) { $0.count == 2 })
        #expect(counts.read { $0 }.sorted() == [2, 3])
        #expect(await actor.count == 3)
        #expect(await actor.offThread == 0)

        // Same executor, same isolation.
        #expect(host.loop.isSameExclusiveExecutionContext(other: host.loop))
        #expect(await host.finish())
    }

    @Test func theLoopsTimersFireBetweenActorJobs() async throws {
        let host = try #require(ModalLoop.start(name: "rlk-conc-timer"))
        let loop = host.loop
        let actor = LoopActor(loop: loop)
        let trace = TestMonitor<[String]>([])
        let ticker = RunLoopTimer(after: .milliseconds(1), repeating: .milliseconds(1)) { _ in
            let onLoop = loop.isCurrent
            trace.update { $0.append(onLoop ? "tick" : "tick (off the loop's thread)") }
        }
        loop.add(ticker, forMode: .default)

        let calls = 5
        for index in 0..<calls {
            await actor.record("job \(index)", into: trace)
            // The next job waits until the loop has fired the timer since this one.
            #expect(await trace.waitAsync(timeout: concurrencyPatience) { $0.last == "tick" })
        }
        ticker.invalidate()

        let entries = trace.read { $0 }
        #expect(!entries.contains { $0.hasSuffix("(off the loop's thread)") }, "everything ran on the loop's thread")
        // job 0, tick..., job 1, tick..., ...: the jobs in order, with ticks between each two.
        let jobs = entries.indices.filter { entries[$0].hasPrefix("job") }
        #expect(jobs.map { entries[$0] } == (0..<calls).map { "job \($0)" })
        for (earlier, later) in zip(jobs, jobs.dropFirst()) {
            #expect(
                entries[(earlier + 1)..<later].contains("tick"),
                "a tick between \(entries[earlier]) and \(entries[later])")
        }
        #expect(await host.finish())
    }

    @Test func actorJobsRunInEveryCommonModeAndNotInAPrivateMode() async throws {
        let privateMode: RunLoop.Mode = "RLKConcurrencyPrivate"
        let host = try #require(
            ModalLoop.start(
                name: "rlk-conc-modes", mode: .tracking, commonModes: [.tracking], privateModes: [privateMode]))
        let actor = LoopActor(loop: host.loop)

        // A common mode other than the default one.
        #expect(await host.entered(.tracking))
        #expect(await actor.placement().mode == .tracking)

        // A private mode: the job is queued, and waits through several passes.
        host.switchMode(to: privateMode)
        #expect(await host.entered(privateMode))
        let placements = TestMonitor<[Placement]>([])
        // Task.immediate runs until its first suspension here, so the job is queued on return.
        Task.immediate {
            let placement = await actor.placement()
            placements.update { $0.append(placement) }
        }
        for _ in 0..<3 { #expect(await host.pulse()) }
        #expect(placements.read { $0 }.isEmpty, "no actor job runs while the loop runs in a private mode")

        // Back in a common mode, the waiting job runs there.
        host.switchMode(to: .default)
        #expect(await placements.waitAsync(timeout: concurrencyPatience) { !$0.isEmpty })
        let ran = placements.read { $0 }
        #expect(ran.map(\.mode) == [.default])
        #expect(ran.allSatisfy { $0.onLoopThread })
        #expect(await host.finish())
    }

    // MARK: await loop.submit

    @Test func performReturnsTheBodysValueFromTheLoopsThread() async throws {
        let host = try #require(ModalLoop.start(name: "rlk-conc-perform", commonModes: [.tracking]))
        let loop = host.loop
        let tid = try #require(host.thread.tid())

        #expect(try await loop.submit { 42 } == 42)
        let placement = try await loop.submit { Placement.here(loop) }
        #expect(placement == Placement(onLoopThread: true, tid: tid, mode: .default))
        let strings: [String] = try await loop.submit(inModes: [.common]) { ["a", "b"] }
        #expect(strings == ["a", "b"])

        // The spelling that resolved to the fire-and-forget perform (and returned ()) when the
        // awaiting form was an overload of perform: a one-expression closure with a capture list.
        let items = [1, 2, 3]
        let count = try await loop.submit { [items] in items.count }
        #expect(count == 3)

        // A body that returns nothing is waited for too.
        let ran = Atomic<Bool>(false)
        try await loop.submit { ran.store(loop.isCurrent, ordering: .relaxed) }
        let ranOnLoop = ran.load(ordering: .relaxed)
        #expect(ranOnLoop)

        // A body that awaits resumes on the loop's thread, in the same modes.
        let actor = LoopActor(loop: loop)
        let afterAwait = try await loop.submit {
            await actor.increment()
            return Placement.here(loop)
        }
        #expect(afterAwait == Placement(onLoopThread: true, tid: tid, mode: .default))

        // Given modes: the body waits for one of them.
        host.switchMode(to: .tracking)
        #expect(await host.entered(.tracking))
        #expect(try await loop.submit(inModes: [.tracking]) { loop.currentMode } == .tracking)
        #expect(try await loop.submit(inModes: [.common]) { loop.currentMode } == .tracking)
        #expect(await host.finish())
    }

    @Test func performRethrowsTheBodysError() async throws {
        let host = try #require(ModalLoop.start(name: "rlk-conc-throw"))
        let loop = host.loop
        await #expect(throws: Boom(code: 7)) {
            try await loop.submit { () throws -> Int in throw Boom(code: 7) }
        }
        await #expect(throws: RunLoop.PerformError.noModes) {
            try await loop.submit(inModes: []) { 1 }
        }
        // The loop goes on.
        #expect(try await loop.submit { 1 } == 1)
        #expect(await host.finish())
    }

    /// A caller isolated to an actor pinned to the loop awaits a body on that loop: the job
    /// suspends (the loop is not blocked) and the loop runs the body in a later pass.
    @Test func anActorOnTheLoopAwaitsPerformOnTheSameLoopWithoutDeadlock() async throws {
        let host = try #require(ModalLoop.start(name: "rlk-conc-nested", commonModes: [.tracking]))
        let actor = LoopActor(loop: host.loop)
        let tid = try #require(host.thread.tid())

        let result = try #require(await completes(within: concurrencyPatience) { try await actor.performOnOwnLoop() })
        let (value, inBody, afterwards) = try result.get()
        #expect(value == 7)
        #expect(inBody == Placement(onLoopThread: true, tid: tid, mode: .default))
        #expect(afterwards == Placement(onLoopThread: true, tid: tid, mode: .default))

        // The actor's job runs in .tracking (a common mode); the body wants .default, so it waits
        // until the loop runs in .default.
        host.switchMode(to: .tracking)
        #expect(await host.entered(.tracking))
        let waiting = Task { try await actor.performOnOwnLoop(inModes: [.default]) }
        let started = try #require(await completes { await actor.placement() }.map { try $0.get() })
        #expect(started.mode == .tracking)
        host.switchMode(to: .default)
        let late = try #require(await completes { try await waiting.value })
        let (lateValue, lateBody, _) = try late.get()
        #expect(lateValue == 7)
        #expect(lateBody.mode == .default)
        #expect(await host.finish())
    }

    // MARK: A loop whose thread has exited

    @Test func performOnALoopWhoseThreadExitedThrows() async throws {
        _ = TestLog.recorder
        // The thread exits at once: its loop is torn down, and drops every block performed on it.
        let loop = try #require(await TestThreads.run(name: "rlk-conc-gone") { RunLoop.current })
        let outcome = try #require(await completes(within: concurrencyPatience) { try await loop.submit { 1 } })
        #expect(throws: RunLoop.PerformError.threadExited) { try outcome.get() }
        let modes = try #require(await completes { try await loop.submit(inModes: [.tracking]) { 1 } })
        #expect(throws: RunLoop.PerformError.threadExited) { try modes.get() }
    }

    @Test func performQueuedWhenTheLoopsThreadExitsThrows() async throws {
        let exit = TestEvent()
        // The thread never runs its loop: the block stays queued until the thread's exit drops it.
        let thread = try #require(
            TestThread.hostingLoop(name: "rlk-conc-exit") { _ in _ = exit.wait(timeout: .seconds(60)) })
        let loop = thread.loop
        let outcome = TestMonitor<Result<Int, any Error>?>(nil)
        // Runs until its first suspension here: the block is queued on return.
        Task.immediate {
            let result: Result<Int, any Error>
            do { result = .success(try await loop.submit { 1 }) } catch { result = .failure(error) }
            outcome.update { $0 = result }
        }
        #expect(outcome.read { $0 } == nil)
        exit.fire()
        #expect(await thread.joinAsync(timeout: concurrencyPatience))
        #expect(await outcome.waitAsync(timeout: concurrencyPatience) { $0 != nil }, "the waiting call ended")
        let result = try #require(outcome.read { $0 })
        #expect(throws: RunLoop.PerformError.threadExited) { try result.get() }
    }

    // MARK: Isolation checks

    @Test func checkIsolatedOffTheLoopsThreadStopsTheProcessNamingTheThreads() async {
        let result = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
            let loop = TestThreads.runBlocking(name: "rlk-conc-owner") { RunLoop.current }
            loop?.checkIsolated()
        }
        guard let result else { return }
        let message = String(decoding: result.standardErrorContent, as: UTF8.self)
        #expect(message.contains("must run on the loop's thread 'rlk-conc-owner'"), "\(message)")
    }

    @Test func isIsolatingCurrentContextIsTrueOnlyOnTheLoopsThread() async throws {
        let host = try #require(ModalLoop.start(name: "rlk-conc-isolating"))
        let loop = host.loop
        #expect(loop.isIsolatingCurrentContext() == false)
        #expect(try await loop.submit { loop.isIsolatingCurrentContext() } == true)
        #expect(await host.finish())
    }

    // MARK: Stress

    /// Four tasks call an actor pinned to the loop many times (and await `perform` now and then)
    /// while the loop's timer fires: every call counted once, every one on the loop's thread.
    @Test func manyTasksCallALoopPinnedActor() async throws {
        let host = try #require(ModalLoop.start(name: "rlk-conc-stress"))
        let loop = host.loop
        let actor = LoopActor(loop: loop)
        let ticks = Atomic<Int>(0)
        let ticker = RunLoopTimer(after: .milliseconds(1), repeating: .milliseconds(1)) { _ in
            ticks.add(1, ordering: .relaxed)
        }
        loop.add(ticker, forMode: .default)
        let tasks = 4
        // Not scaled down under the sanitizers: 40,000 hops take well under a second even there.
        let callsPerTask = max(10_000, TestThreads.scaled(10_000))

        // Each task returns how many of its calls ran on the loop's thread, and how many of its
        // performed bodies did not.
        let finished = await completes(within: .seconds(300)) {
            try await withThrowingTaskGroup(of: (onLoop: Int, performsOffLoop: Int).self) { group in
                for _ in 0..<tasks {
                    group.addTask {
                        var onLoop = 0
                        var performsOffLoop = 0
                        for call in 0..<callsPerTask {
                            if await actor.increment() { onLoop += 1 }
                            if call % 500 == 0, try await !loop.submit({ loop.isCurrent }) { performsOffLoop += 1 }
                        }
                        return (onLoop, performsOffLoop)
                    }
                }
                var total = (onLoop: 0, performsOffLoop: 0)
                for try await counts in group {
                    total.onLoop += counts.onLoop
                    total.performsOffLoop += counts.performsOffLoop
                }
                return total
            }
        }
        ticker.invalidate()
        let totals = try #require(finished).get()
        #expect(totals.onLoop == tasks * callsPerTask)
        #expect(totals.performsOffLoop == 0)
        #expect(await actor.count == tasks * callsPerTask)
        #expect(await actor.offThread == 0)
        #expect(ticks.load(ordering: .relaxed) > 0, "the timer fired meanwhile")
        #expect(await host.finish())
    }
}
