import Glibc
import Synchronization
import Testing

@testable import RunLoopKit

/// `perform(inModes:waitUntilDone:)` is delivered as NSThread delivers
/// `performSelector:onThread:`: by a version-0 source, so a run that returns after a handled
/// source returns after it (seed 004's keep-alive stop depends on that); `perform {}` stays a
/// block (`CFRunLoopPerformBlock`), which is not a source.
extension Robustness.KeepAlive {
    @Suite struct ThreadPerformSourceTests {
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

        /// `run(mode:before:)` returns after the perform, and the perform's source leaves the mode
        /// once nothing waits there: the mode is empty again, as before the perform.
        @Test func runModeBeforeReturnsAfterThePerformAndTheModeIsEmptyAfterwards() throws {
            let results = try #require(
                TestThreads.runBlocking(name: "tp-empty") { () -> [String] in
                    let loop = RunLoop.current
                    var results: [String] = []
                    results.append("empty mode runs: \(loop.run(mode: .default, before: .now + .seconds(10)))")
                    try? loop.perform(inModes: [.default], waitUntilDone: false) {}
                    results.append("with a perform, runs: \(loop.run(mode: .default, before: .now + .seconds(10)))")
                    results.append("afterwards, runs: \(loop.run(mode: .default, before: .now + .seconds(10)))")
                    return results
                })
            #expect(results == ["empty mode runs: false", "with a perform, runs: true", "afterwards, runs: false"])
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
            // A run that returns after a handled source performs one source per pass (CF's
            // __CFRunLoopDoSources0 with stopAfterHandle), in the order they were signalled: the
            // .default lane, then .common's, then .default's again for the perform queued meanwhile.
            // "both" ran in .default, so the other mode's lane finds it gone; then that mode is empty.
            #expect(
                log == [
                    "both", "first", "run default: handledSource",
                    "common", "run default: handledSource",
                    "queued by first", "run default: handledSource",
                    "other", "run other: handledSource",
                    "run other: finished",
                ])
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
}
