import RunLoopKit
import SharedTestSupport
import Synchronization
import Testing

// A serial executor never re-enters: a job of an actor pinned to a loop that runs the loop nested
// (a modal wait, a test's `run(timeout:until:)`) never sees another job of the same actor run
// inside it; such jobs run, in order, after it returns. Task-executor jobs (no isolation) still
// run in nested runs.

/// An actor pinned to a loop whose method holds an `inout` access to its own state across a
/// nested run of the loop, while another of its jobs is sent.
actor NestingActor {
    let loop: RunLoop
    var items: [Int] = []
    /// The order things happened in, on the loop's thread.
    var trace: [String] = []

    init(loop: RunLoop) { self.loop = loop }

    nonisolated var unownedExecutor: UnownedSerialExecutor { loop.asUnownedSerialExecutor() }

    func append(_ value: Int) {
        items.append(value)
        trace.append("append \(value)")
    }

    /// Opens an `inout` access to `items`, sends a job of this actor (a `Task` isolated to it is
    /// enqueued on its executor at once), runs the loop nested, and returns. Before the executor
    /// kept its rule, the sent job ran inside the nested run and its `items.append` met the open
    /// access: "Simultaneous accesses … Fatal access conflict detected".
    func appendAcrossNestedRun(_ value: Int, sending sent: Int) -> Task<Void, Never> {
        var task: Task<Void, Never>?
        Self.mutate(&items) { items in
            task = Task { self.append(sent) }
            loop.run(mode: .default, for: .milliseconds(1))
            items.append(value)
        }
        trace.append("outer \(value) returns")
        return task!
    }

    /// A call that holds `value` for its whole body: Swift's dynamic exclusivity check covers it.
    private static func mutate(_ value: inout [Int], _ body: (inout [Int]) -> Void) { body(&value) }
}

@Suite struct SerialExecutorReentrancyTests {
    /// 1,000 rounds: each job that runs the loop nested finishes before the job it sent starts.
    @Test func aLoopPinnedActorsJobNeverRunsInsideAnotherOfItsJobs() async throws {
        let host = try #require(ModalLoop.start(name: "rlk-conc-nest"))
        let actor = NestingActor(loop: host.loop)
        for round in 0..<1_000 {
            let sent = await actor.appendAcrossNestedRun(2 * round, sending: 2 * round + 1)
            await sent.value
        }
        let items = await actor.items
        #expect(items == Array(0..<2_000))
        let trace = await actor.trace
        #expect(trace.count == 2_000)
        for round in 0..<1_000 {
            #expect(trace[2 * round] == "outer \(2 * round) returns")
            #expect(trace[2 * round + 1] == "append \(2 * round + 1)")
        }
        #expect(await host.finish())
    }

    /// A job sent from another thread while the actor's job runs the loop nested waits too, and
    /// jobs that wait keep their order.
    @Test func jobsFromOtherThreadsWaitInOrderForTheNestingJob() async throws {
        let host = try #require(ModalLoop.start(name: "rlk-conc-nest2"))
        let loop = host.loop
        let actor = NestingActor(loop: loop)
        let started = TestEvent()
        let sendersDone = TestEvent()
        // The nested run goes on 50 ms after the sender starts: its first hop is sent meanwhile
        // (where it ran inside the nested run before the executor kept its rule), and it must wait.
        await actor.runNested(until: started, thenFor: .milliseconds(50)) {
            Task.detached {
                started.fire()
                for value in 0..<20 { await actor.append(value) }
                sendersDone.fire()
            }
        }
        #expect(await sendersDone.waitAsync(timeout: concurrencyPatience) { $0 })
        // The sender's first hop waited for the nesting job, then the rest followed in order.
        let trace = await actor.trace
        #expect(trace.first == "nested run ends")
        #expect(await actor.items == Array(0..<20))
        #expect(await host.finish())
    }

    /// Jobs of a task that prefers the loop (no isolation) still run inside an actor's nested run.
    @Test func taskExecutorJobsStillRunInANestedRun() async throws {
        let host = try #require(ModalLoop.start(name: "rlk-conc-nest3"))
        let loop = host.loop
        let actor = NestingActor(loop: loop)
        let ran = TestEvent()
        await actor.runNested(until: ran) {
            Task(executorPreference: loop) { ran.fire() }
        }
        #expect(ran.read { $0 })
        #expect(await host.finish())
    }
}

extension NestingActor {
    /// Starts `send`, then runs the loop nested until `done` fires (at most 30 s), inside this
    /// actor's job.
    func runNested(until done: TestEvent, thenFor grace: Duration = .zero, _ send: () -> Void) {
        send()
        var deadline = ContinuousClock.now + .seconds(30)
        // Keeps the nested runs alive and polls the event; the loop sleeps between its fires.
        let poll = RunLoopTimer(after: .milliseconds(1), repeating: .milliseconds(1)) { _ in }
        loop.add(poll, forMode: .default)
        while !done.read({ $0 }) && ContinuousClock.now < deadline {
            loop.run(mode: .default, for: .milliseconds(5))
        }
        deadline = ContinuousClock.now + grace
        while ContinuousClock.now < deadline { loop.run(mode: .default, for: .milliseconds(5)) }
        poll.invalidate()
        trace.append("nested run ends")
    }
}

/// Tasks bound to a loop whose thread exits: they go on (the loop's sleeps end with
/// `threadExited`, as RunLoopClock's docs say), instead of never resuming.
@Suite struct DeadLoopTaskTests {
    @Test func aTaskThatPrefersALoopGoesOnWhenItsThreadExits() async throws {
        let host = try #require(ModalLoop.start(name: "rlk-conc-dead"))
        let loop = host.loop
        let sleeping = TestEvent()
        let sleeper = Task(executorPreference: loop) {
            sleeping.fire()
            do {
                try await loop.clock.sleep(for: .seconds(600))
                return "woke"
            } catch {
                return "\(error)"
            }
        }
        #expect(await sleeping.waitAsync(timeout: concurrencyPatience) { $0 })
        #expect(await host.finish())
        let outcome = await completes { await sleeper.value }
        #expect(try outcome?.get() == "\(RunLoop.PerformError.threadExited)")
        // A task that prefers the loop, started after its thread exited, runs too.
        let late = await completes { await Task(executorPreference: loop) { 7 }.value }
        #expect(try late?.get() == 7)
    }
}
