import SharedTestSupport
import Testing

// RunLoop.main as the main actor's executor, in a child process each: the opt-in needs a
// synchronous main on the process's real main thread (Tests/ConcurrencyProbe).

@Suite(.serialized) struct MainExecutorTests {
    private func probe(_ scenario: String) throws -> (status: Int32, values: [String: String], stderr: String) {
        let run = try runProbe("ConcurrencyProbe", [scenario], timeout: .seconds(60))
        var values: [String: String] = [:]
        for line in run.stdout.split(separator: "\n") {
            guard let equals = line.firstIndex(of: "=") else { continue }
            values[String(line[..<equals])] = String(line[line.index(after: equals)...])
        }
        return (run.status, values, run.stderr)
    }

    /// Main-actor jobs run on the main loop's thread, through the main loop; sleeps end inside a
    /// nested `.tracking` run (the loop's common modes); the loop clock's sleep and the sleep of a
    /// task that prefers the loop are the loop's own timers (2 common-mode timers while they
    /// sleep), while a plain `Task.sleep` on the main actor is the platform's: Swift 6.3.1's
    /// runtime schedules it from a global-pool thread, after hopping off the main actor.
    @Test func mainActorJobsAndSleepsRunOnTheMainLoop() throws {
        let run = try probe("main-actor")
        #expect(run.status == 0, "\(run.stderr)")
        #expect(run.values["installed"] == "true")
        #expect(run.values["mainExecutor"] == "MainLoopExecutor")
        #expect(run.values["onMainLoopThread"] == "true")
        #expect(run.values["commonModeTimersWhileSleeping"] == "2")
        #expect(run.values["taskSleepWokeIn"] == "UITrackingRunLoopMode")
        #expect(run.values["loopClockSleepWokeIn"] == "UITrackingRunLoopMode")
        #expect(run.values["preferringTaskSleepWokeIn"] == "UITrackingRunLoopMode")
        #expect(run.values["trackingRun"] == "timedOut")
    }

    /// The main actor's executor never re-enters: a main-actor job that runs the main loop nested
    /// with an `inout` access to main-actor state open never sees another main-actor job inside
    /// (1,000 rounds; before, "Fatal access conflict detected"), and the main queue and the main
    /// actor never run inside each other.
    @Test func theMainActorNeverRunsInsideItsOwnNestedRun() throws {
        let run = try probe("nested-main-actor")
        #expect(run.status == 0, "\(run.stderr)")
        #expect(run.values["rounds"] == "1000")
        #expect(run.values["outOfOrder"] == "0")
        #expect(
            run.values["order"] == "main-actor job returns,main-queue block,main-queue block returns,main-actor job",
            "\(run.values)")
    }

    /// An async main linked with RunLoopAsyncMain runs on RunLoop.main: its body on the main
    /// loop's thread, its main-actor steps during a tracking run entered from the loop (a 200 ms
    /// run, 10 ms steps: at least 5 of about 20, room for a loaded machine), and its return ends
    /// the program with 0; stopMain(status:) with that status.
    @Test func anAsyncMainRunsOnTheMainLoop() throws {
        let run = try runProbe("AsyncMainProbe", [], timeout: .seconds(60))
        let values = Self.values(run.stdout)
        #expect(run.status == 0, "\(run.stdout) \(run.stderr)")
        #expect(values["installed"] == "true")
        #expect(values["bodyOnMainLoopThread"] == "true")
        #expect(values["stillOnMainLoopThread"] == "true")
        #expect(values["trackingRun"] == "timedOut")
        #expect(Int(values["stepsDuringTracking"] ?? "") ?? 0 >= 5, "\(values)")
        let stopped = try runProbe("AsyncMainProbe", ["stop"], timeout: .seconds(60))
        #expect(stopped.status == 4, "\(stopped.stdout) \(stopped.stderr)")
    }

    private static func values(_ stdout: String) -> [String: String] {
        var values: [String: String] = [:]
        for line in stdout.split(separator: "\n") {
            guard let equals = line.firstIndex(of: "=") else { continue }
            values[String(line[..<equals])] = String(line[line.index(after: equals)...])
        }
        return values
    }

    /// A global-enqueue hook another library set first is chained: the virtual-time scope takes
    /// its own tasks, the other hook still sees the rest.
    @Test func anotherLibrarysEnqueueHookIsChained() throws {
        let run = try probe("hook-chain")
        #expect(run.status == 0, "\(run.stderr)")
        #expect(run.values["scopeTaskOnVirtualLoop"] == "true", "\(run.values)")
        #expect(run.values["otherHookSawPoolJobs"] == "true", "\(run.values)")
    }

    /// A `stopMain(status:)` before `runMain()` is kept: `runMain()` returns its status at once
    /// (before, the stop was lost and `runMain()` never returned).
    @Test func aStopBeforeRunMainIsKept() throws {
        let run = try probe("stop-before-run")
        #expect(run.values["runMainReturned"] == "5", "\(run.stderr)")
        #expect(run.status == 5)
    }

    /// With the main executor installed, `Task.sleep` on a virtual-time loop's thread is due on
    /// virtual time (before: a real deadline on the virtual loop, which never resumed 3 runs of 4).
    @Test func taskSleepOnAVirtualTimeLoopResumesInAdvance() throws {
        let run = try probe("virtual-sleep")
        #expect(run.status == 0, "\(run.stderr)")
        #expect(run.values["early"] == nil)
        #expect(run.values["resumed"] == "4", "\(run.values)")
    }

    /// `stopMain(status:)` ends `runMain()` with that status: the program's exit status.
    @Test func stoppingTheMainLoopEndsTheProgramWithItsStatus() throws {
        let run = try probe("exit-status")
        #expect(run.values["runMainReturned"] == "3")
        #expect(run.status == 3)
    }

    /// RunLoopTesting's withMainLoopRunning in a process whose main thread drains the main queue
    /// (CFRunLoopRun, as XCTest's runner): RunLoop.main runs while the body awaits.
    @Test func theMainLoopHelperRunsTheMainLoopWhereTheMainThreadIsFree() throws {
        let run = try probe("pump")
        #expect(run.status == 0, "\(run.values) \(run.stderr)")
        #expect(run.values["timerFiredOnMainThread"] == "true")
        #expect(run.values["mainActorRuns"] == "true")
    }

    @Test(arguments: [
        ("twice", "called twice; the main actor's executor is chosen once"),
        ("off-main", "called off the main thread; call it first thing in a synchronous main"),
        ("in-task", "called from a task; call it first thing in a synchronous main, before any task exists"),
    ])
    func misuseStopsWithAClearMessage(scenario: String, message: String) throws {
        let run = try probe(scenario)
        #expect(run.status != 0)
        #expect(run.stderr.contains("RunLoopConcurrency.installMainExecutor(): " + message), "\(run.stderr)")
    }
}
