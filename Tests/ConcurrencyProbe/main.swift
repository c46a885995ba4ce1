@_spi(ExperimentalCustomExecutors) import _Concurrency
import CoreFoundation
import Foundation
import Glibc
import RunLoopConcurrency
import RunLoopKit
import RunLoopTesting
import Synchronization

import class RunLoopKit.RunLoop

// Test support for Tests/RunLoopConcurrencyTests: `RunLoop.main` as the main actor's executor
// needs a synchronous main on the real main thread, so each scenario is a run of this program.
// It prints `key=value` lines the tests read, and ends itself with alarm() if it hangs.

/// Prints a result line at once (the test reads stdout after the process ends, even a crash).
func report(_ key: String, _ value: Any) {
    var line = "\(key)=\(value)\n"
    line.withUTF8 { _ = write(1, $0.baseAddress, $0.count) }
}

/// A thread's body that calls the opt-in (not isolated to the main actor, as `main`'s closures are).
nonisolated func installOffMain(_: UnsafeMutableRawPointer?) -> UnsafeMutableRawPointer? {
    RunLoopConcurrency.installMainExecutor()
    return nil
}

@main struct ConcurrencyProbe {
    static func main() {
        alarm(30)
        let scenario = CommandLine.arguments.dropFirst().first ?? ""
        switch scenario {
        case "main-actor": mainActor()
        case "exit-status": exitStatus()
        case "nested-main-actor": nestedMainActor()
        case "virtual-sleep": virtualSleep()
        case "hook-chain": hookChain()
        case "stop-before-run":
            RunLoopConcurrency.installMainExecutor()
            RunLoopConcurrency.stopMain(status: 5)
            let status = RunLoopConcurrency.runMain()
            report("runMainReturned", status)
            exit(status)
        case "twice":
            RunLoopConcurrency.installMainExecutor()
            RunLoopConcurrency.installMainExecutor()
        case "off-main":
            var thread = pthread_t()
            pthread_create(&thread, nil, installOffMain, nil)
            pthread_join(thread, nil)
        case "pump": pump()
        case "in-task":
            Task { @MainActor in RunLoopConcurrency.installMainExecutor() }
            RunLoop.main.run()
        default:
            report("error", "unknown scenario '\(scenario)'")
            exit(2)
        }
    }

    /// Main-actor jobs on RunLoop.main; sleeps that end inside a nested `.tracking` run; where
    /// each kind of sleep is served; a nested run from a main-actor task.
    static func mainActor() {
        RunLoopConcurrency.installMainExecutor()
        // As UIKit does for UITrackingRunLoopMode.
        RunLoop.main.addCommonMode(.tracking)
        report("installed", RunLoopConcurrency.isMainExecutorInstalled)
        Task { @MainActor in
            report("mainExecutor", String(describing: type(of: MainActor.executor)))
            report("onMainLoopThread", RunLoop.main.isCurrent)
            // Three sleepers, then a nested tracking run that outlasts them all.
            Task { @MainActor in
                try? await Task.sleep(for: .milliseconds(40))
                report("taskSleepWokeIn", RunLoop.main.currentMode?.rawValue ?? "none")
            }
            Task { @MainActor in
                try? await Task.sleep(for: .milliseconds(50), clock: RunLoop.main.clock)
                report("loopClockSleepWokeIn", RunLoop.main.currentMode?.rawValue ?? "none")
            }
            Task(executorPreference: RunLoop.main) {
                try? await Task.sleep(for: .milliseconds(60))
                report("preferringTaskSleepWokeIn", RunLoop.main.currentMode?.rawValue ?? "none")
            }
            // Let the three start and register their sleeps.
            for _ in 0..<5 { await Task.yield() }
            try? await Task.sleep(for: .milliseconds(5), clock: RunLoop.main.clock)
            // The loop's description counts its common-mode timers: the loop clock's sleep and the
            // sleep of the task that prefers the loop; the main actor's plain Task.sleep is the
            // platform's (the runtime schedules it from a global-pool thread).
            let description = String(describing: RunLoop.main)
            let items = description.components(separatedBy: "common mode items = { ").last ?? ""
            let timers = items.split(separator: ",").dropFirst().first?.split(separator: " ").first ?? "?"
            report("commonModeTimersWhileSleeping", timers)
            // Tracking is entered from the loop (a timer's callout, as UIKit's event source
            // enters it), not from this main-actor job: a run nested in a main-actor job runs no
            // other main-actor job (the executor never re-enters).
            let track = RunLoopTimer(after: .zero) { _ in
                let result = RunLoop.main.run(mode: .tracking, for: .milliseconds(300))
                report("trackingRun", result)
                RunLoopConcurrency.stopMain(status: 0)
            }
            RunLoop.main.add(track, forMode: .default)
        }
        exit(RunLoopConcurrency.runMain())
    }

    /// A main-actor job holds an `inout` access to main-actor state across a nested run of the
    /// main loop while another main-actor job is sent (1,000 rounds): the sent job runs after the
    /// first returns. Also: a main-queue block's nested run runs no main-actor job, and a
    /// main-actor job's nested run runs no main-queue block (one isolation, as on Darwin).
    static func nestedMainActor() {
        RunLoopConcurrency.installMainExecutor()
        Task { @MainActor in
            var violations = 0
            for round in 0..<1_000 {
                let sent = MainState.appendAcrossNestedRun(2 * round, sending: 2 * round + 1)
                await sent.value
            }
            for (index, value) in MainState.items.enumerated() where index != value { violations += 1 }
            report("rounds", MainState.items.count / 2)
            report("outOfOrder", violations)
            // A main-queue block sent while a main-actor job runs the loop nested waits for it.
            var order: [String] = []
            DispatchQueue.main.async { MainActor.assumeIsolated { order.append("main-queue block") } }
            _ = RunLoop.main.run(mode: .default, for: .milliseconds(20))
            order.append("main-actor job returns")
            // A main-actor job sent while a main-queue block runs the loop nested waits for it.
            await withCheckedContinuation { (done: CheckedContinuation<Void, Never>) in
                DispatchQueue.main.async {
                    MainActor.assumeIsolated {
                        Task { @MainActor in order.append("main-actor job") }
                        _ = RunLoop.main.run(mode: .default, for: .milliseconds(20))
                        order.append("main-queue block returns")
                        done.resume()
                    }
                }
            }
            while order.count < 4 { await Task.yield() }
            report("order", order.joined(separator: ","))
            RunLoopConcurrency.stopMain(status: 0)
        }
        exit(RunLoopConcurrency.runMain())
    }

    /// RunLoopTesting's withMainLoopRunning where the main thread drains the main queue (here with
    /// CFRunLoop's main loop, as XCTest's runner does): a RunLoop.main timer fires on the main
    /// thread while the body awaits, and main-actor work still runs.
    static func pump() {
        Task {
            do {
                let fired = Atomic<Bool>(false)
                let firedOnMain = Atomic<Bool>(false)
                try await withMainLoopRunning {
                    let timer = RunLoopTimer(after: .milliseconds(20)) { _ in
                        firedOnMain.store(RunLoop.main.isCurrent, ordering: .relaxed)
                        fired.store(true, ordering: .releasing)
                    }
                    RunLoop.main.add(timer, forMode: .default)
                    while !fired.load(ordering: .acquiring) { try await Task.sleep(for: .milliseconds(1)) }
                    report("mainActorRuns", await MainActor.run { RunLoop.main.isCurrent })
                }
                report("timerFiredOnMainThread", firedOnMain.load(ordering: .relaxed))
                exit(0)
            } catch {
                report("error", error)
                exit(1)
            }
        }
        CFRunLoopRun()
    }

    /// With the main executor installed, `Task.sleep` by a task on a virtual-time loop is a timer
    /// of that loop, due on virtual time: a task that prefers the loop, and a plain `Task {}` the
    /// scope routes to its loop, each sleep 5 s and resume inside `advance(by: 5 s)`, 4 rounds.
    static func virtualSleep() {
        RunLoopConcurrency.installMainExecutor()
        var resumed = 0
        for _ in 0..<4 {
            do {
                try withVirtualTime { time in
                    let preferring = Task(executorPreference: time.runLoop) {
                        try await Task.sleep(for: .seconds(5))
                        return time.runLoop.isCurrent
                    }
                    let plain = Task {
                        try await Task.sleep(for: .seconds(5))
                        return time.runLoop.isCurrent
                    }
                    try time.advance(by: .milliseconds(4_999))
                    let early = LoopBound(false)
                    let check = Task(executorPreference: time.runLoop) { _ = await (preferring.result, plain.result); early.value = true }
                    try time.runUntilIdle()
                    if early.value { report("early", true) }
                    try time.advance(by: .milliseconds(1))
                    if early.value { resumed += 1 }
                    _ = check
                }
            } catch {
                report("error", error)
            }
        }
        report("resumed", resumed)
        exit(0)
    }

    /// Another library's global-enqueue hook, set first (as swift-concurrency-extras'
    /// `withMainSerialExecutor` does): a virtual-time scope still routes its own tasks, and every
    /// other job still goes through the other hook to the pool.
    static func hookChain() {
        typealias Original = @convention(thin) (UnownedJob) -> Void
        typealias Hook = @convention(thin) (UnownedJob, Original) -> Void
        let variable = dlsym(dlopen(nil, RTLD_NOW), "swift_task_enqueueGlobal_hook")!.assumingMemoryBound(to: Hook?.self)
        variable.pointee = { job, original in
            OtherHook.calls.add(1, ordering: .relaxed)
            original(job)
        }
        do {
            try withVirtualTime { time in
                let onLoop = LoopBound<Bool?>(nil)
                _ = Task { onLoop.value = time.runLoop.isCurrent }
                try time.runUntilIdle()
                report("scopeTaskOnVirtualLoop", onLoop.value.map { "\($0)" } ?? "never ran")
            }
        } catch {
            report("error", error)
        }
        let before = OtherHook.calls.load(ordering: .relaxed)
        let done = DispatchSemaphore(value: 0)
        Task.detached { done.signal() }
        done.wait()
        report("otherHookSawPoolJobs", OtherHook.calls.load(ordering: .relaxed) > before)
        exit(0)
    }

    static func exitStatus() {
        RunLoopConcurrency.installMainExecutor()
        Task { @MainActor in
            try? await Task.sleep(for: .milliseconds(10))
            RunLoopConcurrency.stopMain(status: 3)
        }
        let status = RunLoopConcurrency.runMain()
        report("runMainReturned", status)
        exit(status)
    }
}


/// Main-actor state for ``ConcurrencyProbe/nestedMainActor()``.
@MainActor enum MainState {
    static var items: [Int] = []

    static func appendAcrossNestedRun(_ value: Int, sending sent: Int) -> Task<Void, Never> {
        var task: Task<Void, Never>?
        mutate(&items) { items in
            task = Task { @MainActor in MainState.items.append(sent) }
            _ = RunLoop.main.run(mode: .default, for: .milliseconds(1))
            items.append(value)
        }
        return task!
    }

    private static func mutate(_ value: inout [Int], _ body: (inout [Int]) -> Void) { body(&value) }
}

/// Counts the jobs the other library's hook saw.
enum OtherHook {
    static let calls = Atomic<Int>(0)
}
