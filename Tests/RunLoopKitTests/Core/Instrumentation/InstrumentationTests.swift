import CAllocationCounter
import SharedTestSupport
import Synchronization
import Testing

@testable import RunLoopKit

/// The instrumentation seam (Core/Instrumentation/Instrumentation.swift): a loop's phase and generation, readable from any thread;
/// phase start times while watched; per-pass reports while a reporter is installed.
@Suite struct InstrumentationTests {
    /// Another thread sees the loop stuck in a timer handler (phase `timers`, a generation that
    /// does not move), asleep (`waiting`), and not running; with a phase watch, the phase's start.
    @Test func anotherThreadSeesThePhaseAndGeneration() async throws {
        let inHandler = OneShot<RunLoop>()
        let letGo = OneShot<Bool>()
        let done = Atomic<Bool>(false)
        let thread = TestThread(name: "seam-phase") {
            let loop = RunLoop.current
            let timer = RunLoopTimer(after: .zero) { _ in
                inHandler.set(loop)
                _ = letGo.wait()
            }
            loop.add(timer, forMode: .default)
            let keepAlive = MessagePort<Never> { _ in }
            loop.add(keepAlive, forMode: .default)
            while !done.load(ordering: .acquiring) { loop.run(mode: .default, for: .milliseconds(50)) }
            keepAlive.invalidate()
        }
        let loop = inHandler.wait()
        let watch = loop.watchPhases()
        let stuck = loop.phaseSnapshot
        #expect(stuck.phase == .timers)
        // The handler is still running: the same pass, the same phase.
        #expect(loop.phaseSnapshot.generation == stuck.generation)
        #expect(loop.phaseSnapshot.phase == .timers)
        letGo.set(true)
        #expect(waitUntil(timeout: .seconds(10)) { loop.phaseSnapshot.phase == .waiting })
        let sleeping = loop.phaseSnapshot
        #expect(sleeping.generation > stuck.generation)
        let since = try #require(sleeping.since, "a watched phase has a start time")
        #expect(since <= .now)
        watch.cancel()
        #expect(loop.phaseSnapshot.since == nil, "without a watch, no start time")
        done.store(true, ordering: .releasing)
        #expect(thread.join(timeout: .seconds(20)))
        #expect(loop.phaseSnapshot.phase == .notRunning)
    }

    /// A reporter hears one report per pass: the mode, what woke the pass (a timer, another
    /// thread's block, the deadline), how long it slept, and where the time went; cancelled, it
    /// hears nothing more.
    @Test func iterationReportsSayWhatWokeEachPass() async throws {
        let fireDate = ContinuousClock.now + .milliseconds(30)
        let firstWake = Mutex<ContinuousClock.Instant?>(nil)
        let reports = try #require(
            await TestThreads.run(name: "seam-report") { () -> [RunLoop.IterationReport] in
                let loop = RunLoop.current
                let collected = Mutex<[RunLoop.IterationReport]>([])
                let token = loop.addIterationReporter { report in collected.locked { $0.append(report) } }
                // The timer ends a long run, so however late a loaded machine wakes the loop, the
                // wake comes before the run's deadline: it is the timer's. The run's deadline
                // then ends a short run with nothing due.
                let timer = RunLoopTimer(fireAt: fireDate) { _ in RunLoop.current.stop() }
                loop.add(timer, forMode: .default)
                let keepAlive = RunLoopTimer(after: .seconds(3600)) { _ in }
                loop.add(keepAlive, forMode: .default)
                // When the first sleep of the first run ended: nothing but the timer can end it.
                let woke = RunLoopObserver(activities: .afterWaiting) { _, _ in
                    firstWake.locked { $0 = $0 ?? .now }
                }
                loop.add(woke, forMode: .default)
                loop.run(mode: .default, for: .seconds(5), returnAfterSourceHandled: false)
                woke.invalidate()
                loop.run(mode: .default, for: .milliseconds(5), returnAfterSourceHandled: false)
                // Another thread's block wakes the next run.
                let other = TestThread(name: "seam-waker") { loop.perform { RunLoop.current.stop() } }
                loop.run(mode: .default, for: .seconds(5))
                _ = other.join(timeout: .seconds(10))
                token.cancel()
                let before = collected.locked { $0.count }
                loop.run(mode: .default, for: .milliseconds(5))
                keepAlive.invalidate()
                let after = collected.locked { $0.count }
                return after == before ? collected.locked { $0 } : []  // empty: a report after cancel
            })
        let reasons = reports.map(\.wakeReason)
        #expect(reasons.contains(.timer), "\(reasons)")
        #expect(reasons.contains(.timeout), "\(reasons)")
        #expect(reasons.contains(.wakeUp), "\(reasons)")
        #expect(reports.allSatisfy { $0.mode == .default })
        let timerPass = try #require(reports.first { $0.wakeReason == .timer })
        // It slept until the timer: the kernel wakes it no earlier than the timerfd. How long
        // depends on when the sleep began, which a loaded machine (a sanitizer build beside other
        // suites: 18 ms of the 30 seen) delays; so the bound is on when it woke.
        #expect(timerPass.slept > .zero && timerPass.slept < .seconds(5), "\(timerPass.slept)")
        let wokeAt = try #require(firstWake.locked { $0 }, "the first run slept and woke")
        #expect(wokeAt >= fireDate, "woke \(fireDate - wokeAt) before the timer's fire date")
        #expect(timerPass.phaseTimes.total >= timerPass.slept)
        #expect(timerPass.phaseTimes[.waiting] == timerPass.slept)
        let generations = reports.map(\.generation)
        #expect(generations == generations.sorted() && Set(generations).count == generations.count)
    }

    /// Hostile reporters: one that runs the loop from inside its report is not re-entered by the
    /// nested run's passes (no recursion), and one that cancels its own token hears nothing after.
    @Test func aReporterThatRunsTheLoopOrCancelsItselfIsSafe() async throws {
        let outcome = try #require(
            await TestThreads.run(name: "seam-hostile") { () -> (Int, Int, Int) in
                let loop = RunLoop.current
                let keepAlive = RunLoopTimer(after: .seconds(3600)) { _ in }
                loop.add(keepAlive, forMode: .default)
                let nestedCalls = Atomic<Int>(0)
                let depth = Atomic<Int>(0)
                let maxDepth = Atomic<Int>(0)
                let nester = loop.addIterationReporter { _ in
                    let now = depth.add(1, ordering: .relaxed).newValue
                    if now > maxDepth.load(ordering: .relaxed) { maxDepth.store(now, ordering: .relaxed) }
                    if nestedCalls.add(1, ordering: .relaxed).newValue <= 3 {
                        RunLoop.current.run(mode: .default, for: .zero)
                    }
                    depth.subtract(1, ordering: .relaxed)
                }
                let selfCancelled = Atomic<Int>(0)
                let box = Mutex<RunLoop.InstrumentationToken?>(nil)
                let quitter = loop.addIterationReporter { _ in
                    selfCancelled.add(1, ordering: .relaxed)
                    box.locked { $0 }?.cancel()
                }
                box.locked { $0 = quitter }
                for _ in 0..<5 { loop.run(mode: .default, for: .zero) }
                nester.cancel()
                keepAlive.invalidate()
                return (maxDepth.load(ordering: .relaxed), selfCancelled.load(ordering: .relaxed), nestedCalls.load(ordering: .relaxed))
            })
        #expect(outcome.0 == 1, "a reporter was re-entered (depth \(outcome.0))")
        #expect(outcome.1 == 1, "a reporter that cancelled itself was called \(outcome.1) times")
        #expect(outcome.2 == 5, "one report per outer pass: \(outcome.2)")
    }

    /// With a reporter installed, a steady-state pass still allocates nothing (the report is a
    /// value with no dictionary; the reporters' list is shared, not copied).
    @Test(.enabled(if: alloc_counter_available())) func reportingPassesAllocateNothing() {
        let allocations = TestThreads.runBlocking(timeout: .seconds(10), stackSize: 1 << 20) { () -> Int in
            let loop = RunLoop.current
            let passes = Atomic<Int>(0)
            let counted = Mutex(-1)
            let token = loop.addIterationReporter { _ in
                let pass = passes.add(1, ordering: .relaxed).newValue
                if pass == 1_000 { alloc_counter_start() }
                if pass == 11_000 {
                    let allocations = alloc_counter_stop()
                    counted.locked { $0 = allocations }
                    RunLoop.current.stop()
                }
            }
            let source = RunLoopSource {}
            let reSignal = RunLoopObserver(activities: .beforeTimers) { _, _ in source.signal() }
            loop.add(source, forMode: .default)
            loop.add(reSignal, forMode: .default)
            loop.run(mode: .default, for: .seconds(30))
            token.cancel()
            source.invalidate()
            reSignal.invalidate()
            return counted.locked { $0 }
        }
        #expect(allocations == 0)
    }

    /// A callout describer (`describeCallouts(labelled:_:)`) answers for callouts of its label
    /// only, while the loop is still in the callout that was snapshotted, and not after its token
    /// is cancelled; the loop never calls it.
    @Test func calloutDescribersAnswerForTheirLabelWhileInTheCallout() async throws {
        let inHandler = OneShot<RunLoop>()
        let letGo = OneShot<Bool>()
        let described = Atomic<Int>(0)
        let thread = TestThread(name: "seam-describe") {
            let loop = RunLoop.current
            let token = loop.describeCallouts(labelled: "foreign dispatch") {
                described.add(1, ordering: .relaxed)
                return "foreign item 7"
            }
            let timer = RunLoopTimer(after: .zero) { _ in
                inHandler.set(loop)
                _ = letGo.wait()
            }
            timer.label = "foreign dispatch"
            loop.add(timer, forMode: .default)
            loop.run(mode: .default, for: .milliseconds(200))
            withExtendedLifetime(token) {}
        }
        let loop = inHandler.wait()
        let inCallout = loop.calloutSnapshot
        #expect(inCallout.label == "foreign dispatch")
        #expect(loop.calloutDetail(of: inCallout) == "foreign item 7")
        letGo.set(true)
        #expect(thread.join(timeout: .seconds(10)))
        // The loop has left that callout: the snapshot's detail is not given any more.
        #expect(loop.calloutDetail(of: inCallout) == nil)
        #expect(described.load(ordering: .relaxed) >= 1)
    }

    /// Without a describer for its label, a callout has no detail, and a cancelled describer is
    /// not asked.
    @Test func calloutDetailWithoutADescriber() async throws {
        let result = await TestThreads.run(name: "seam-nodetail") { () -> (String?, String?, Int) in
            let loop = RunLoop.current
            let asked = Atomic<Int>(0)
            let token = loop.describeCallouts(labelled: "labelled") {
                asked.add(1, ordering: .relaxed)
                return "detail"
            }
            let seen = Mutex<(String?, String?)>((nil, nil))
            let unlabelled = RunLoopTimer(after: .zero) { _ in
                seen.locked { $0.0 = loop.calloutDetail(of: loop.calloutSnapshot) }
            }
            loop.add(unlabelled, forMode: .default)
            loop.run(mode: .default, for: .milliseconds(20))
            token.cancel()
            let labelled = RunLoopTimer(after: .zero) { _ in
                seen.locked { $0.1 = loop.calloutDetail(of: loop.calloutSnapshot) }
            }
            labelled.label = "labelled"
            loop.add(labelled, forMode: .default)
            loop.run(mode: .default, for: .milliseconds(20))
            let (first, second) = seen.locked { $0 }
            return (first, second, asked.load(ordering: .relaxed))
        }
        let (unlabelled, cancelled, asked) = try #require(result)
        #expect(unlabelled == nil)
        #expect(cancelled == nil)
        #expect(asked == 0)
    }
}
