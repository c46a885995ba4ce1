import Glibc
import SharedTestSupport
import Synchronization
import Testing

@testable import RunLoopKit

/// `perform(inModes:waitUntilDone:)` is delivered as NSThread delivers
/// `performSelector:onThread:`: by a version-0 source, so a run that returns after a handled
/// source returns after it (seed 004's keep-alive stop depends on that); `perform {}` stays a
/// block (`CFRunLoopPerformBlock`), which is not a source.
@Suite(.serialized, .exclusive(.robustness)) struct ThreadPerformSourceTests {
    /// Seed 004's `customStart` / `customStop`, line by line: a thread keeps its loop alive with
    /// a port and runs `while (shouldKeepRunning) [runLoop runMode:NSDefaultRunLoopMode
    /// beforeDate:[NSDate distantFuture]]`; the stop clears the flag and performs an empty
    /// method on the thread (`waitUntilDone:NO`), with no `CFRunLoopStop`. The seed says the
    /// loop then exits at once ("调用后立即退出RunLoop"). Before the perform was a source, the
    /// thread slept until distantFuture.
    @Test func seed004CustomStopEndsTheKeepAliveLoopWithoutAStop() throws {
        let shouldKeepRunning = Atomic<Bool>(true)
        let exited = TestEvent()
        let performed = TestEvent()
        guard
            let thread = TestThread.hostingLoop(
                name: "seed004",
                setup: { loop in
                    // [runLoop addPort:[NSMachPort port] forMode:NSDefaultRunLoopMode]
                    loop.add(MessagePort<Never> { _ in }, forMode: .default)
                },
                run: { loop in
                    while shouldKeepRunning.load(ordering: .acquiring) {
                        loop.run(mode: .default, before: RunLoop.distantFuture)
                    }
                    exited.fire()
                })
        else { return }
        let loop = thread.loop
        #expect(waitUntil { loop.isWaiting })
        // customStop:
        let start = ContinuousClock.now
        shouldKeepRunning.store(false, ordering: .releasing)
        try loop.perform(inModes: [.default], waitUntilDone: false) { performed.fire() }
        // The bound is the 100 ms (the thread wakes, runs the perform, checks the flag:
        // tens of microseconds here); a sanitizer slows each step about tenfold, so it gets a
        // second. Without the fix the thread sleeps until distantFuture and this fails.
        let bound: Duration = TestThreads.sanitized ? .seconds(1) : .milliseconds(100)
        #expect(exited.wait(timeout: bound), "the keep-alive loop did not end after the perform")
        #expect(ContinuousClock.now - start < bound + .milliseconds(50))
        #expect(performed.wait(timeout: .zero))
        #expect(thread.join(timeout: .seconds(10)))
    }

    /// The perform counts as a handled source, a block does not: with `returnAfterSourceHandled`,
    /// a run returns `.handledSource` after a perform, and runs to its timeout after a block.
    @Test func aPerformIsAHandledSourceABlockIsNot() throws {
        let results = try #require(
            TestThreads.runBlocking(name: "tp-handled") { () -> [String] in
                let loop = RunLoop.current
                let keepAlive = RunLoopSource {}
                loop.add(keepAlive, forMode: .default)
                defer { keepAlive.invalidate() }
                var results: [String] = []
                let ran = Mutex<[String]>([])
                try? loop.perform(inModes: [.default], waitUntilDone: false) { ran.locked { $0.append("perform") } }
                results.append("perform: \(loop.run(mode: .default, for: .seconds(10), returnAfterSourceHandled: true))")
                loop.perform { ran.locked { $0.append("block") } }
                results.append("block: \(loop.run(mode: .default, for: .milliseconds(30), returnAfterSourceHandled: true))")
                results.append("ran: \(ran.locked { $0 })")
                return results
            })
        #expect(results == ["perform: handledSource", "block: timedOut", "ran: [\"perform\", \"block\"]"])
    }

    /// `run(mode:before:)` returns after the perform; the perform's source then stays in the
    /// mode, as NSThread's does on Darwin (made the first time a perform names the mode), so
    /// the mode is no longer empty: a later run waits for its deadline.
    @Test func runModeBeforeReturnsAfterThePerformAndTheSourceStays() throws {
        let results = try #require(
            TestThreads.runBlocking(name: "tp-stays") { () -> [String] in
                let loop = RunLoop.current
                var results: [String] = []
                results.append("empty mode runs: \(loop.run(mode: .default, before: .now + .seconds(10)))")
                try? loop.perform(inModes: [.default], waitUntilDone: false) {}
                results.append("with a perform, runs: \(loop.run(mode: .default, before: .now + .seconds(10)))")
                results.append("afterwards: \(loop.run(mode: .default, for: .milliseconds(20)))")
                return results
            })
        #expect(results == ["empty mode runs: false", "with a perform, runs: true", "afterwards: timedOut"])
    }

    /// Performs for one mode run first in, first out; one queued for several modes runs once;
    /// one queued by a perform runs in a later pass; one for another mode waits for it.
    @Test func orderModesAndPerformsQueuedByPerforms() throws {
        let log = try #require(
            TestThreads.runBlocking(name: "tp-order") { () -> [String] in
                let loop = RunLoop.current
                let log = Mutex<[String]>([])
                @Sendable func note(_ line: String) { log.locked { $0.append(line) } }
                let other: RunLoop.Mode = "tp-other"
                try? loop.perform(inModes: [other], waitUntilDone: false) { note("other") }
                try? loop.perform(inModes: [.default, other], waitUntilDone: false) { note("both") }
                try? loop.perform(inModes: [.default], waitUntilDone: false) {
                    note("first")
                    try? loop.perform(inModes: [.default], waitUntilDone: false) { note("queued by first") }
                }
                try? loop.perform(inModes: [.common], waitUntilDone: false) { note("common") }
                for _ in 0..<3 {
                    note("run default: \(loop.run(mode: .default, for: .seconds(10), returnAfterSourceHandled: true))")
                }
                note("run other: \(loop.run(mode: other, for: .seconds(10), returnAfterSourceHandled: true))")
                note("run other: \(loop.run(mode: other, for: .milliseconds(1)))")
                return log.locked { $0 }
            })
        // One queue, first in, first out across modes; a run that returns after a handled
        // source performs one source per pass (CF's __CFRunLoopDoSources0 with
        // stopAfterHandle), the earliest signalled first. The .default source runs what may
        // run in .default as it was when it began ("both", "first", "common": .default is
        // common); "queued by first" waits for a later callout, here the .common source's;
        // then the .default source finds nothing. The other mode finds "both" gone; its source
        // stays, so its mode is not empty.
        #expect(
            log == [
                "both", "first", "common", "run default: handledSource",
                "queued by first", "run default: handledSource",
                "run default: handledSource",
                "other", "run other: handledSource",
                "run other: timedOut",
            ])
    }

    /// A perform that runs the loop nested until a later perform has run: the nested run
    /// sees the performs still queued, in order, so the later one runs inside it (a perform
    /// that took the whole queue first would wait forever).
    @Test func aRunNestedInAPerformRunsTheOnesQueuedAfterIt() throws {
        let log = try #require(
            TestThreads.runBlocking(name: "tp-nested") { () -> [String] in
                let loop = RunLoop.current
                let log = Mutex<[String]>([])
                let done = Atomic<Bool>(false)
                try? loop.perform(inModes: [.default], waitUntilDone: false) {
                    log.locked { $0.append("A starts a nested run") }
                    let deadline = ContinuousClock.now + .seconds(10)
                    while !done.load(ordering: .acquiring) && ContinuousClock.now < deadline {
                        loop.run(mode: .default, before: deadline)
                    }
                    log.locked { $0.append("A returns, B ran: \(done.load(ordering: .acquiring))") }
                }
                try? loop.perform(inModes: [.default], waitUntilDone: false) {
                    log.locked { $0.append("B") }
                    done.store(true, ordering: .releasing)
                }
                try? loop.perform(inModes: [.default], waitUntilDone: false) { log.locked { $0.append("C") } }
                loop.run(mode: .default, for: .seconds(10), returnAfterSourceHandled: true)
                return log.locked { $0 }
            })
        // The nested run's callout runs what waits, in order: B, then C.
        #expect(log == ["A starts a nested run", "B", "C", "A returns, B ran: true"])
    }

    /// A caller waiting for a perform on a thread that exits without running it is released
    /// with `threadExited`; a perform after the exit throws at once.
    @Test func aThreadThatExitsDropsItsPerformsAndReleasesWaiters() throws {
        let release = TestEvent()
        guard let thread = TestThread.hostingLoop(name: "tp-exit", run: { _ in _ = release.wait(timeout: .seconds(30)) })
        else { return }
        let loop = thread.loop
        let outcome = TestMonitor<String?>(nil)
        let caller = TestThread(name: "tp-caller") {
            do {
                try loop.perform(inModes: [.default], waitUntilDone: true) {}
                outcome.update { $0 = "ran" }
            } catch {
                outcome.update { $0 = "\(error)" }
            }
        }
        #expect(waitUntil { loop.allModes.contains(.default) && loop.contains(anyPerformSourceIn: .default) })
        release.fire()
        #expect(outcome.wait(timeout: .seconds(10)) { $0 != nil })
        #expect(outcome.read { $0 } == "\(RunLoop.PerformError.threadExited)")
        #expect(caller.join(timeout: .seconds(10)))
        #expect(thread.join(timeout: .seconds(10)))
        #expect(throws: RunLoop.PerformError.threadExited) {
            try loop.perform(inModes: [.default], waitUntilDone: false) {}
        }
    }

    /// Many threads performing on one loop while its keep-alive run loop turns: every perform
    /// runs exactly once (the source's add/remove races settle).
    @Test func concurrentPerformsAllRunOnce() throws {
        let perThread = TestThreads.scaled(2_000, minimum: 200)
        let senders = 4
        let count = Atomic<Int>(0)
        let shouldKeepRunning = Atomic<Bool>(true)
        guard
            let thread = TestThread.hostingLoop(
                name: "tp-stress", setup: { loop in loop.add(MessagePort<Never> { _ in }, forMode: .default) },
                run: { loop in
                    while shouldKeepRunning.load(ordering: .acquiring) {
                        loop.run(mode: .default, before: .now + .milliseconds(50))
                    }
                })
        else { return }
        let loop = thread.loop
        let threads = (0..<senders).map { index in
            TestThread(name: "tp-send\(index)") {
                for _ in 0..<perThread {
                    try? loop.perform(inModes: [.default], waitUntilDone: false) {
                        count.add(1, ordering: .relaxed)
                    }
                }
            }
        }
        for sender in threads { #expect(sender.join(timeout: .seconds(60))) }
        #expect(waitUntil(timeout: .seconds(30)) { count.load(ordering: .relaxed) == senders * perThread })
        shouldKeepRunning.store(false, ordering: .releasing)
        try loop.perform(inModes: [.default], waitUntilDone: false) {}
        #expect(thread.join(timeout: .seconds(10)))
        #expect(count.load(ordering: .relaxed) == senders * perThread)
    }
}
