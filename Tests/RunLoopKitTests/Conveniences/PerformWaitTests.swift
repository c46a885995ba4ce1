import CRunLoopKit
import Glibc
import SharedTestSupport
import Synchronization
import Testing

@testable import RunLoopKit

@Suite(.serialized, .exclusive(.robustness)) struct PerformWaitTests {
    @Test func waitsUntilTheBlockHasRunOnTheLoopsThread() async throws {
        let worker = PermanentThread(name: "pw-wait")
        defer { worker.stop() }
        let loop = worker.loop
        let result = await TestThreads.run(name: "pw-caller") { () -> String? in
            let gate = TestEvent()
            let ranOn = Mutex<Int32?>(nil)
            // The loop is busy in a task: the block waits behind it, and so does the caller.
            try? worker.execute { _ = gate.wait(timeout: .seconds(30)) }
            let opener = TestThread(name: "pw-opener") { gate.fire() }
            do {
                try loop.perform(inModes: [.default], waitUntilDone: true) {
                    let tid = crlk_gettid()
                    ranOn.locked { $0 = tid }
                }
            } catch {
                return "\(error)"
            }
            _ = opener.join(timeout: .seconds(30))
            // perform returned only after the block ran, on the loop's thread.
            let tid = ranOn.locked { $0 }
            return tid == worker.threadID ? nil : "block ran on \(String(describing: tid))"
        }
        #expect(result == .some(nil), "\(String(describing: result))")
    }

    @Test func onItsOwnThreadItRunsInlineWhateverTheMode() throws {
        let worker = PermanentThread(name: "pw-inline")
        defer { worker.stop() }
        let steps = try worker.executeAndWait { () throws -> [String] in
            var steps: [String] = []
            let ran = Mutex(false)
            // A mode the loop never runs in: queued, it would never run; inline, it runs now.
            try RunLoop.current.perform(inModes: ["pw-never"], waitUntilDone: true) { ran.locked { $0 = true } }
            steps.append(ran.locked { $0 } ? "ran before perform returned" : "not run")
            return steps
        }
        #expect(steps == ["ran before perform returned"])
    }

    @Test func aBlockForAnotherModeWaitsAndItsCallerIsReleasedWhenItRuns() throws {
        let worker = PermanentThread(name: "pw-modes")
        defer { worker.stop() }
        let loop = worker.loop
        let privateMode: RunLoop.Mode = "pw-private"
        let ran = TestEvent()
        let callerDone = TestMonitor<String?>(nil)
        let caller = TestThread(name: "pw-caller") {
            do {
                try loop.perform(inModes: [privateMode], waitUntilDone: true) { ran.fire() }
                callerDone.update {
                    $0 = ran.wait(timeout: .zero) ? "released after the block ran" : "released early"
                }
            } catch {
                callerDone.update { $0 = "\(error)" }
            }
        }
        // The caller's block is in the loop's queue once perform has made its mode; a bounded
        // wait for that (perform makes the mode just before queueing).
        #expect(waitUntil { loop.allModes.contains(privateMode) })
        // Tasks (common modes) queued after it run while the loop runs in .default; the block
        // for the private mode does not, and its caller goes on waiting.
        for _ in 0..<3 {
            _ = try worker.executeAndWait { RunLoop.current.run(mode: .default, for: .milliseconds(1)) }
        }
        #expect(!ran.wait(timeout: .zero), "a block for a private mode ran in .default")
        #expect(!caller.hasExited)
        #expect(callerDone.read { $0 } == nil)
        // Running the loop in the private mode runs it (and then the mode is empty: the run
        // ends), which releases the caller. The nested run is made from a timer, not from a
        // task: while a block runs, the blocks of its batch that wait for other modes are held
        // by the outer run, out of a nested run's sight (as in CoreFoundation's
        // __CFRunLoopDoBlocks, which detaches the list while it runs blocks).
        // The perform runs in the run's first pass, as a source; its source stays in the mode
        // (as NSThread's does), so the run then sleeps until its timeout, hence a short one.
        let nested = TestMonitor<RunLoop.RunResult?>(nil)
        let timer = RunLoopTimer(after: .zero) { _ in
            let result = RunLoop.current.run(mode: privateMode, for: .milliseconds(20))
            nested.update { $0 = result }
        }
        loop.add(timer, forMode: .default)
        #expect(nested.wait(timeout: .seconds(30)) { $0 != nil })
        #expect(nested.read { $0 } == .timedOut)
        // Only a run in the private mode can run the block.
        #expect(ran.wait(timeout: .seconds(30)))
        #expect(caller.join(timeout: .seconds(30)))
        #expect(callerDone.read { $0 } == "released after the block ran")
    }

    @Test func aCallerWaitingForALoopWhoseThreadExitsIsReleased() throws {
        // The loop thread never runs its loop: it publishes it, waits for the block to be in
        // the loop's perform source, and exits, which drops the block.
        let mayExit = TestEvent()
        let loopThread = try #require(
            TestThread.hostingLoop(name: "pw-exiting") { _ in _ = mayExit.wait(timeout: .seconds(30)) })
        let loop = loopThread.loop
        let outcome = TestMonitor<String?>(nil)
        let caller = TestThread(name: "pw-caller") {
            do {
                try loop.perform(inModes: [.default], waitUntilDone: true) {}
                outcome.update { $0 = "returned as if the block had run" }
            } catch {
                outcome.update { $0 = "\(error)" }
            }
        }
        // A bounded wait until the block is queued, then the loop's thread exits.
        #expect(waitUntil { loop.contains(anyPerformSourceIn: .default) })
        mayExit.fire()
        #expect(loopThread.join(timeout: .seconds(30)))
        #expect(caller.join(timeout: .seconds(30)), "the caller still waits for a dropped block")
        #expect(outcome.read { $0 } == "\(RunLoop.PerformError.threadExited)")
        // After the exit, both forms throw at once.
        #expect(throws: RunLoop.PerformError.threadExited) { try loop.perform(waitUntilDone: true) {} }
        #expect(throws: RunLoop.PerformError.threadExited) { try loop.perform(waitUntilDone: false) {} }
    }

    @Test func aCallerRacingTheThreadsExitIsAlwaysReleased() async {
        // The exit and the perform race; whichever wins, the caller returns (the block runs
        // before the exit, or it is dropped and the call throws).
        let rounds = TestThreads.scaled(200, minimum: 20)
        let failures = await TestThreads.run(name: "pw-race") { () -> [String] in
            var failures: [String] = []
            for _ in 0..<rounds {
                let keepAlive = RunLoopSource {}
                guard
                    let loopThread = TestThread.hostingLoop(
                        name: "pw-racer", setup: { $0.add(keepAlive, forMode: .default) },
                        run: { loop in
                            // One short run: the block may or may not run in it.
                            loop.run(mode: .default, for: .microseconds(50))
                            keepAlive.invalidate()
                        })
                else { return ["no loop"] }
                let loop = loopThread.loop
                let caller = TestThread(name: "pw-caller") {
                    _ = try? loop.perform(inModes: [.default], waitUntilDone: true) {}
                }
                if !caller.join(timeout: .seconds(30)) { failures.append("caller hung") }
                _ = loopThread.join(timeout: .seconds(30))
            }
            return failures
        }
        #expect(failures == [])
    }

    @Test func withoutWaitingItQueuesAndReturns() throws {
        let worker = PermanentThread(name: "pw-nowait")
        defer { worker.stop() }
        let ran = TestEvent()
        let gate = TestEvent()
        try worker.execute { _ = gate.wait(timeout: .seconds(30)) }
        try worker.loop.perform(inModes: [.common], waitUntilDone: false) { ran.fire() }
        #expect(!ran.wait(timeout: .zero), "the block ran before the busy loop could take it")
        gate.fire()
        #expect(ran.wait(timeout: .seconds(30)))
        #expect(throws: RunLoop.PerformError.noModes) {
            try worker.loop.perform(inModes: [], waitUntilDone: true) {}
        }
    }
}
