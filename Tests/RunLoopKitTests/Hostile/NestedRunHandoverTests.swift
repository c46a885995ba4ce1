import Glibc
import SharedTestSupport
import Synchronization
import Testing

@testable import RunLoopKit

/// Work that reaches a loop while a run is nested in one of its callouts, in another mode or in
/// the same one, is not lost when the nested run returns (found by a review of the hardening
/// change): a port's message, a block performed from another thread, and the due timers an outer
/// pass collected. Also a repeating timer that moves itself to another loop, and items only in the
/// common lists when the loop's thread exits.
///
/// Real-time bounds: each scenario's own events come within milliseconds; a broken loop sleeps
/// until its 2 s timeout, so "within 1 s" tells them apart with room for a loaded machine.
@Suite struct NestedRunHandoverTests {
    /// While a Source0's callout runs the loop nested in a private mode (which does not hold the
    /// port), another thread sends a message to a port in `.default`. Once the nested run returns,
    /// the outer run delivers it at once instead of sleeping until its timeout.
    @Test func aPortMessageSentDuringANestedRunInAnotherModeIsDelivered() async {
        let outcome = await TestThreads.run(name: "nest-port") { () -> (delivered: Bool, ms: Double, result: String) in
            let loop = RunLoop.current
            let delivered = Atomic<Bool>(false)
            let port = MessagePort<Int> { _ in
                delivered.store(true, ordering: .relaxed)
                RunLoop.current.stop()
            }
            loop.add(port, forMode: .default)
            let privateMode: RunLoop.Mode = "NestPrivate"
            loop.add(RunLoopSource {}, forMode: privateMode)
            let sender = TestThread(name: "nest-port-send") {
                // Sent while the nested run sleeps (it runs from about 5 to 105 ms).
                usleep(40_000)
                try? port.send(1)
            }
            let source = RunLoopSource {
                RunLoop.current.run(mode: privateMode, for: .milliseconds(100))
            }
            loop.add(source, forMode: .default)
            // Signalled by a timer, so the nested run comes in a later pass than the run's first
            // (which looks at every port for queued messages anyway).
            loop.add(RunLoopTimer(after: .milliseconds(5)) { _ in source.signal() }, forMode: .default)
            let start = ContinuousClock.now
            // One run, which the message's handler stops (a new run would look at every port).
            let result = loop.run(mode: .default, for: .seconds(2))
            _ = sender.join(timeout: .seconds(5))
            return (delivered.load(ordering: .relaxed), millisecondsSince(start), "\(result)")
        }
        guard let outcome else { return }
        #expect(outcome.delivered, "the message was not delivered (run: \(outcome.result))")
        #expect(outcome.ms < 1000, "delivered after \(outcome.ms) ms: the outer run slept through it")
    }

    /// A block performed for `.default` by another thread while a block's nested run in a private
    /// mode runs: the nested run takes it from the inbox but cannot run it; once it returns, the
    /// outer run runs it at once.
    @Test func aBlockPerformedDuringANestedRunInAnotherModeRuns() async {
        let outcome = await TestThreads.run(name: "nest-block") { () -> (ran: Bool, ms: Double) in
            let loop = RunLoop.current
            let ran = Atomic<Bool>(false)
            let privateMode: RunLoop.Mode = "NestPrivate"
            loop.add(RunLoopSource {}, forMode: privateMode)
            loop.add(RunLoopSource {}, forMode: .default)
            let performer = TestThread(name: "nest-block-perform") {
                usleep(20_000)
                loop.perform {
                    ran.store(true, ordering: .relaxed)
                    RunLoop.current.stop()
                }
            }
            loop.perform {
                RunLoop.current.run(mode: privateMode, for: .milliseconds(100))
            }
            let start = ContinuousClock.now
            while !ran.load(ordering: .relaxed) && millisecondsSince(start) < 2000 {
                loop.run(mode: .default, for: .seconds(2), returnAfterSourceHandled: true)
            }
            _ = performer.join(timeout: .seconds(5))
            return (ran.load(ordering: .relaxed), millisecondsSince(start))
        }
        guard let outcome else { return }
        #expect(outcome.ran && outcome.ms < 1000, "the block ran: \(outcome.ran), after \(outcome.ms) ms")
    }

    /// Two timers due at once; the first one's handler runs the loop nested in the same mode for
    /// up to 2 s. The second timer fires inside that nested run at once (as in CoreFoundation,
    /// where the collected timers stay in the mode) and stops it.
    @Test func aNestedRunFiresTheDueTimersItsOuterPassCollected() async {
        let outcome = await TestThreads.run(name: "nest-timer") { () -> (firedInside: Bool, ms: Double) in
            let loop = RunLoop.current
            let inside = Atomic<Bool>(false)
            let nested = Atomic<Bool>(false)
            let elapsed = Mutex<Double>(-1)
            let first = RunLoopTimer(fireAt: .now) { _ in
                let start = ContinuousClock.now
                nested.store(true, ordering: .relaxed)
                RunLoop.current.run(mode: .default, for: .seconds(2))
                nested.store(false, ordering: .relaxed)
                elapsed.locked { $0 = millisecondsSince(start) }
            }
            let second = RunLoopTimer(fireAt: .now) { _ in
                inside.store(nested.load(ordering: .relaxed), ordering: .relaxed)
                RunLoop.current.stop()
            }
            loop.add(first, forMode: .default)
            loop.add(second, forMode: .default)
            loop.run(mode: .default, for: .zero)
            return (inside.load(ordering: .relaxed), elapsed.locked { $0 })
        }
        guard let outcome else { return }
        #expect(outcome.firedInside, "the second timer did not fire inside the nested run")
        #expect(outcome.ms >= 0 && outcome.ms < 1000, "the nested run lasted \(outcome.ms) ms")
    }

    /// A repeating 10 ms timer whose handler, on its first fire, moves it from its loop to another
    /// loop: it keeps firing there, on its schedule (it used to stall: the other loop kept it as
    /// "firing elsewhere" and never woke for it).
    @Test func aRepeatingTimerMovedToAnotherLoopByItsHandlerKeepsFiringThere() async {
        let stop = Atomic<Bool>(false)
        let firesThere = Atomic<Int>(0)
        guard
            let otherThread = TestThread.hostingLoop(
                name: "move-other", setup: { $0.add(RunLoopSource {}, forMode: .default) },
                run: { loop in
                    // Long runs: the loop sleeps until something wakes it (a timer it must fire
                    // included).
                    while !stop.load(ordering: .relaxed) { loop.run(mode: .default, for: .seconds(10)) }
                })
        else { return }
        let otherLoop = otherThread.loop
        let moved = await TestThreads.run(name: "move-here") { () -> Bool in
            let loop = RunLoop.current
            let timer = RunLoopTimer(after: .milliseconds(1), repeating: .milliseconds(10)) { timer in
                if RunLoop.current === otherLoop {
                    firesThere.add(1, ordering: .relaxed)
                } else {
                    RunLoop.current.remove(timer, forMode: .default)
                    otherLoop.add(timer, forMode: .default)
                    // Still in this handler when the other loop finds the timer due: it must
                    // leave it to this one, which then reschedules it there.
                    usleep(30_000)
                }
            }
            loop.add(timer, forMode: .default)
            loop.run(mode: .default, for: .milliseconds(30))
            return otherLoop.contains(timer, inMode: .default)
        }
        // 5 fires of a 10 ms timer: well within 2 s unless it stalled.
        _ = waitUntil(timeout: .seconds(2)) { firesThere.load(ordering: .relaxed) >= 5 }
        stop.store(true, ordering: .relaxed)
        otherLoop.perform { RunLoop.current.stop() }
        _ = otherThread.join(timeout: .seconds(5))
        #expect(moved == true, "the timer is not on the other loop")
        #expect(firesThere.load(ordering: .relaxed) >= 5, "it fired \(firesThere.load(ordering: .relaxed)) times there")
    }
}

/// Items added for `.common` and then removed from every mode are only in the loop's common
/// lists. When the loop's thread exits, the teardown unties them too: using them afterwards
/// (invalidating, setting a fire date) must not touch the freed loop (AddressSanitizer reports
/// a use after free otherwise), and they can join another loop.
@Suite(.serialized, .exclusive(.robustness)) struct TeardownOfCommonItemsTests {
    @Test func itemsOnlyInTheCommonListsAreUntiedWhenTheThreadExits() async {
        let items = await TestThreads.run(name: "common-only") {
            () -> (RunLoopTimer, RunLoopSource, RunLoopObserver) in
            let loop = RunLoop.current
            let timer = RunLoopTimer(after: .seconds(3600)) { _ in }
            let source = RunLoopSource {}
            let observer = RunLoopObserver(activities: .allActivities) { _, _ in }
            loop.add(timer, forMode: .common)
            loop.add(source, forMode: .common)
            loop.add(observer, forMode: .common)
            loop.remove(timer, forMode: .default)
            loop.remove(source, forMode: .default)
            loop.remove(observer, forMode: .default)
            return (timer, source, observer)
        }
        guard let (timer, source, observer) = items else { return }
        // The loop is gone: these must not reach it.
        timer.fireDate = .now + .seconds(7200)
        #expect(timer.isValid)
        let reused = await TestThreads.run(name: "common-reuse") { () -> Bool in
            let loop = RunLoop.current
            loop.add(timer, forMode: .default)
            return loop.contains(timer, inMode: .default)
        }
        #expect(reused == true, "the timer could not join another loop")
        timer.invalidate()
        source.invalidate()
        observer.invalidate()
        #expect(!timer.isValid && !source.isValid && !observer.isValid)
    }
}
