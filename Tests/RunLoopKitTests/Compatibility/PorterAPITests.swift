import Foundation
import Glibc
import SharedTestSupport
import Synchronization
import Testing

@testable import RunLoopKit

import class RunLoopKit.RunLoop

// What an NSRunLoop / NSTimer / NSObject porter reaches for (limitDate(forMode:) is compared with
// Foundation's in Differential/LimitDateDiffTests.swift): delayed performs cancelled per target, the waitUntilDone variant with
// a timeout, Foundation-Timer-shaped timers, and what a loop shows and releases.

@Suite struct PorterAPITests {
    // MARK: Delayed performs by target

    final class Target: Sendable {
        let name: String
        init(_ name: String) { self.name = name }
    }

    /// `cancelPreviousPerformRequests(withTarget:)` cancels exactly the pending requests made for
    /// that target (compared by identity), returns how many, and lets the target go; other
    /// targets' requests and untargeted ones run.
    @Test func cancellingByTargetCancelsOnlyThatTargetsRequests() async throws {
        let outcome = try #require(
            await TestThreads.run(name: "perform-target") { () -> (Int, Int, [String], Bool) in
                let loop = RunLoop.current
                let ran = Lines()
                weak var releasedTarget: Target?
                var cancelled = 0
                let other = Target("other")
                do {
                    let target = Target("search box")
                    releasedTarget = target
                    for index in 0..<3 {
                        loop.perform(after: .milliseconds(10), target: target) { box in ran.append("\(box.name) \(index)") }
                    }
                    loop.perform(after: .milliseconds(10), target: other) { box in ran.append(box.name) }
                    loop.perform(after: .milliseconds(10)) { ran.append("untargeted") }
                    cancelled = loop.cancelPreviousPerformRequests(withTarget: target)
                }
                let again = loop.cancelPreviousPerformRequests(withTarget: other) == 1 ? 1 : 0
                loop.perform(after: .milliseconds(10), target: other) { box in ran.append("\(box.name) again") }
                loop.run(mode: .default, for: .milliseconds(300))
                return (cancelled, again, ran.all.sorted(), releasedTarget == nil)
            })
        #expect(outcome.0 == 3, "three requests for the target were pending")
        #expect(outcome.1 == 1)
        #expect(outcome.2 == ["other again", "untargeted"])
        #expect(outcome.3, "the cancelled requests let their target go")
    }

    // MARK: Waiting with a limit

    /// The loop does not run within the limit: the call returns `.cancelled` after about the
    /// limit (at least 100 ms; at most 100 ms plus 2 s of room for a loaded machine), and the
    /// block never runs, also once the loop runs.
    @Test func waitingAtMostReturnsCancelledOnTimeAndTheBlockNeverRuns() async throws {
        let stop = Atomic<Bool>(false)
        let ran = Atomic<Bool>(false)
        let published = OneShot<RunLoop>()
        let go = OneShot<Bool>()
        let thread = TestThread(name: "wait-limit") {
            let loop = RunLoop.current
            let keepAlive = MessagePort<Never> { _ in }
            loop.add(keepAlive, forMode: .default)
            published.set(loop)
            _ = go.wait()
            while !stop.load(ordering: .acquiring) { loop.run(mode: .default, for: .milliseconds(20)) }
            keepAlive.invalidate()
        }
        let loop = published.wait()
        let start = ContinuousClock.now
        let outcome = try loop.perform(waitingAtMost: .milliseconds(100)) { ran.store(true, ordering: .relaxed) }
        let waited = ContinuousClock.now - start
        #expect(outcome == .cancelled)
        #expect(waited >= .milliseconds(100) && waited < .milliseconds(2_100), "waited \(waited)")
        go.set(true)
        // The loop runs now: a block queued after the cancelled one completes, so the cancelled one
        // had its turn (blocks run in order) and did not run.
        #expect(try loop.perform(waitingAtMost: .seconds(20)) {} == .completed)
        // A limit beyond any clock is no limit.
        #expect(try loop.perform(waitingAtMost: .seconds(Int64.max)) {} == .completed)
        let cancelledBlockRan = ran.load(ordering: .relaxed)
        #expect(!cancelledBlockRan, "a cancelled block ran")
        // A block slower than the limit: still running when the call returns, and finishes.
        let slowDone = OneShot<Bool>()
        let letFinish = OneShot<Bool>()
        #expect(
            try loop.perform(waitingAtMost: .milliseconds(50)) {
                _ = letFinish.wait()
                slowDone.set(true)
            } == .stillRunning)
        letFinish.set(true)
        #expect(slowDone.wait(timeout: .seconds(20)) == true)
        // Nonsense limits: negative is zero (cancelled unless it runs at once); an empty modes
        // list throws, as waitUntilDone does.
        #expect(throws: RunLoop.PerformError.noModes) { try loop.perform(inModes: [], waitingAtMost: .seconds(1)) {} }
        stop.store(true, ordering: .releasing)
        #expect(thread.join(timeout: .seconds(20)))
        #expect(throws: RunLoop.PerformError.threadExited) { try loop.perform(waitingAtMost: .seconds(1)) {} }
    }

    /// On the loop's own thread the block runs inline, whatever the limit.
    @Test func waitingAtMostOnTheLoopsThreadRunsInline() async throws {
        let outcome = await TestThreads.run(name: "wait-inline") { () -> RunLoop.WaitOutcome? in
            try? RunLoop.current.perform(waitingAtMost: .zero) {}
        }
        #expect(outcome == .completed)
    }

    // MARK: What a loop shows and releases

    /// `description` lists each mode's descriptor sources and ports, with the descriptor and the
    /// watched events.
    @Test func descriptionListsDescriptorSourcesAndPorts() async throws {
        let text = try #require(
            await TestThreads.run(name: "describe") { () -> (String, Int32) in
                var ends: [Int32] = [0, 0]
                pipe(&ends)
                let source = try! FileDescriptorSource(descriptor: ends[0], watching: .readable, ownsDescriptor: true) {
                    _, _ in
                }
                let port = MessagePort<Int> { _ in }
                let loop = RunLoop.current
                loop.add(source, forMode: .default)
                loop.add(port, forMode: .common)
                let text = loop.description
                source.invalidate()
                port.invalidate()
                close(ends[1])
                return (text, ends[0])
            })
        #expect(text.0.contains("fd \(text.1) watching readable"), "\(text.0)")
        #expect(text.0.contains("sources1 = {"), "\(text.0)")
        #expect(text.0.contains("MessagePort"), "\(text.0)")
    }

    // MARK: Foundation-shaped timers

    /// `RunLoopTimer(fire:interval:repeats:block:)`, `RunLoopTimer(timeInterval:repeats:block:)`
    /// and `RunLoopTimer.scheduledTimer(withTimeInterval:repeats:block:)` behave as Foundation's
    /// (Darwin's first fire date for `timeInterval:`), with nonsense values made harmless.
    @Test func foundationShapedTimers() async throws {
        let fires = try #require(
            await TestThreads.run(name: "ns-timers") { () -> [String: Int] in
                let loop = RunLoop.current
                let counts = Mutex<[String: Int]>([:])
                func count(_ name: String) -> @Sendable (RunLoopTimer) -> Void {
                    { _ in counts.locked { $0[name, default: 0] += 1 } }
                }
                let past = RunLoopTimer(fire: Date(timeIntervalSinceNow: -5), interval: 99, repeats: false, block: count("past"))
                let repeating = RunLoopTimer(fire: Date(), interval: 0.02, repeats: true, block: count("repeating"))
                let never = RunLoopTimer(fire: Date(timeIntervalSinceNow: .infinity), interval: 1, repeats: true, block: count("never"))
                let nan = RunLoopTimer(fire: Date(timeIntervalSinceReferenceDate: .nan), interval: .nan, repeats: false, block: count("nan"))
                let later = RunLoopTimer(timeInterval: 10, repeats: false, block: count("later"))
                for timer in [past, repeating, never, nan, later] { loop.add(timer, forMode: .default) }
                RunLoopTimer.scheduledTimer(withTimeInterval: 0.05, repeats: false, block: count("scheduled"))
                loop.run(mode: .default, for: .milliseconds(250))
                var result = counts.locked { $0 }
                result["pastInterval"] = past.interval == .zero ? 0 : 1
                result["timeInterval"] = Int(repeating.timeInterval * 1000)
                result["neverValid"] = never.isValid ? 1 : 0
                for timer in [repeating, never, later] { timer.invalidate() }
                return result
            })
        #expect(fires["past"] == 1, "a past date fires at the next pass, once")
        #expect(fires["pastInterval"] == 0, "a one-shot timer ignores its interval")
        #expect((fires["repeating"] ?? 0) >= 3, "a 20 ms repeating timer fired \(fires["repeating"] ?? 0) times in 250 ms")
        #expect(fires["timeInterval"] == 20)
        #expect(fires["never"] == nil && fires["neverValid"] == 1, "an infinite date never fires")
        #expect(fires["nan"] == 1, "a NaN date fires at once")
        #expect(fires["later"] == nil, "timeInterval: fires after the interval (Darwin), not at once")
        #expect(fires["scheduled"] == 1, "scheduledTimer adds to the current loop's default mode")
        #expect(RunLoopTimer.repeatInterval(seconds: 0) == .microseconds(100))
        #expect(RunLoopTimer.repeatInterval(seconds: -.infinity) == .microseconds(100))
        #expect(RunLoopTimer.repeatInterval(seconds: .infinity) == .seconds(Int64.max))
    }

    /// The Instant forms of the run entry points: a past deadline makes one pass; `run(until:)`
    /// returns at its deadline; `RunLoop.distantFuture` is after any deadline a loop computes.
    @Test func instantDeadlines() async throws {
        let outcome = try #require(
            await TestThreads.run(name: "instants") { () -> (Bool, Duration, Bool) in
                let loop = RunLoop.current
                let timer = RunLoopTimer(after: .seconds(3600)) { _ in }
                loop.add(timer, forMode: .default)
                let ran = loop.run(mode: .default, before: .now - .seconds(1))
                let start = ContinuousClock.now
                loop.run(until: .now + .milliseconds(50))
                let took = ContinuousClock.now - start
                timer.invalidate()
                return (ran, took, RunLoop.distantFuture > .now + .seconds(86_400 * 365 * 100))
            })
        #expect(outcome.0)
        #expect(outcome.1 >= .milliseconds(50) && outcome.1 < .seconds(5), "run(until:) took \(outcome.1)")
        #expect(outcome.2)
    }
}
