import CRunLoopKit
import SharedTestSupport
import Synchronization
import Testing

import class RunLoopKit.RunLoop

@testable import RunLoopKit

// RunLoop.schedule(...), RunLoopTimer.fire(), and timers with a weak target.
//
// Tolerance coalescing (100 timers due within 10 ms with 10 ms of tolerance fire in at most three
// wakeups) is TimerBehaviourTests.toleranceCoalescesWakeups (Tests/RunLoopKitTests/Core/Items).

@Suite struct TimersConvenienceTests {
    // MARK: schedule

    /// schedule(...) creates the timer with the given schedule and adds it to this loop in the
    /// given mode, and only there.
    @Test func scheduleAddsTheTimerToThisLoopInTheGivenMode() async {
        struct Outcome: Sendable {
            var inTracking = false, inDefault = true, inCommon = false, commonInDefault = false
            var interval = Duration.zero, tolerance = Duration.zero, fireDateOK = false
            var fired = false, result = RunLoop.RunResult.timedOut
        }
        let outcome = await TestThreads.run(name: "rlk-schedule") { () -> Outcome in
            let loop = RunLoop.current
            var outcome = Outcome()
            let before = ContinuousClock.now
            let tracking = loop.schedule(
                after: .seconds(100), repeating: .seconds(2), tolerance: .milliseconds(5), mode: .tracking
            ) { _ in }
            outcome.inTracking = loop.contains(tracking, inMode: .tracking)
            outcome.inDefault = loop.contains(tracking, inMode: .default)
            outcome.interval = tracking.interval
            outcome.tolerance = tracking.tolerance
            outcome.fireDateOK =
                tracking.fireDate >= before + .seconds(100) && tracking.fireDate <= .now + .seconds(100)
            let common = loop.schedule(after: .seconds(100), mode: .common) { _ in }
            outcome.inCommon = loop.contains(common, inMode: .common)
            outcome.commonInDefault = loop.contains(common, inMode: .default)
            tracking.invalidate()
            common.invalidate()
            // The default mode by default; the one-shot fires, and the run finishes.
            let fired = Atomic(false)
            loop.schedule(after: .milliseconds(1)) { _ in fired.store(true, ordering: .relaxed) }
            outcome.result = loop.run(mode: .default, for: .seconds(10))
            outcome.fired = fired.load(ordering: .relaxed)
            return outcome
        }
        guard let outcome else { return }
        #expect(outcome.inTracking && !outcome.inDefault)
        #expect(outcome.interval == .seconds(2) && outcome.tolerance == .milliseconds(5))
        #expect(outcome.fireDateOK)
        #expect(outcome.inCommon && outcome.commonInDefault)
        #expect(outcome.fired && outcome.result == .finished)
    }

    // MARK: fire()

    /// fire() on the loop's thread calls the handler at once; a repeating timer keeps its fire
    /// date, interval and modes.
    @Test func fireOnTheLoopThreadCallsTheHandlerNowAndKeepsARepeatingSchedule() async {
        let outcome = await TestThreads.run(name: "rlk-fire") { () -> (Int, Bool, Bool, Bool) in
            let loop = RunLoop.current
            let calls = Mutex(0)
            let timer = loop.schedule(after: .seconds(100), repeating: .seconds(100)) { _ in calls.locked { $0 += 1 } }
            let fireDate = timer.fireDate
            timer.fire()
            let afterFirst = calls.locked { $0 }
            timer.fire()
            let unchanged = timer.fireDate == fireDate && timer.interval == .seconds(100)
            let stillScheduled = timer.isValid && loop.contains(timer, inMode: .default)
            timer.invalidate()
            return (afterFirst, calls.locked { $0 } == 2, unchanged, stillScheduled)
        }
        #expect(outcome?.0 == 1)
        #expect(outcome?.1 == true)
        #expect(outcome?.2 == true)
        #expect(outcome?.3 == true)
    }

    /// fire() on a one-shot timer calls the handler once and invalidates the timer, which leaves
    /// its modes (the run finishes at once) and never fires again.
    @Test func fireOnAOneShotTimerInvalidatesIt() async {
        let outcome = await TestThreads.run(name: "rlk-fire-once") {
            () -> (calls: Int, valid: Bool, contained: Bool, result: RunLoop.RunResult) in
            let loop = RunLoop.current
            let calls = Mutex(0)
            let timer = loop.schedule(after: .milliseconds(1)) { _ in calls.locked { $0 += 1 } }
            timer.fire()
            let valid = timer.isValid
            let contained = loop.contains(timer, inMode: .default)
            let result = loop.run(mode: .default, for: .seconds(10))
            timer.fire()  // invalid: nothing
            return (calls.locked { $0 }, valid, contained, result)
        }
        #expect(outcome?.calls == 1)
        #expect(outcome?.valid == false)
        #expect(outcome?.contained == false)
        #expect(outcome?.result == .finished)
    }

    /// fire() from another thread runs the handler on the loop's thread, in the timer's modes, and
    /// keeps a repeating schedule; fire() itself returns without waiting.
    @Test func fireFromAnotherThreadRunsTheHandlerOnTheLoopThreadInTheTimersModes() async {
        struct Outcome: Sendable {
            var handlerTID: Int32 = 0, loopTID: Int32 = -1, mode: RunLoop.Mode?
            var ranDuringOtherMode = true, fireDateKept = false, valid = false
        }
        let outcome = await TestThreads.run(name: "rlk-fire-main") { () -> Outcome in
            let published = TestMonitor<(RunLoop, RunLoopTimer)?>(nil)
            let fired = TestEvent()
            let result = Mutex(Outcome())
            let loopThread = TestThread(name: "rlk-fire-loop") {
                let loop = RunLoop.current
                loop.add(RunLoopSource {}, forMode: "Other")
                let timer = loop.schedule(after: .seconds(100), repeating: .seconds(100), mode: .tracking) { _ in
                    result.locked {
                        $0.handlerTID = crlk_gettid()
                        $0.mode = loop.currentMode
                    }
                    fired.fire()
                    loop.stop()
                }
                let fireDate = timer.fireDate
                result.locked { $0.loopTID = crlk_gettid() }
                published.update { $0 = (loop, timer) }
                // Not in the timer's mode: the queued fire waits.
                let otherDeadline = ContinuousClock.now + .seconds(10)
                while !firedRequested.load(ordering: .acquiring) && ContinuousClock.now < otherDeadline {
                    loop.run(mode: "Other", for: .milliseconds(5))
                }
                // fire() has returned (the call is queued): one more pass in the other mode.
                loop.run(mode: "Other", for: .milliseconds(20))
                result.locked { $0.ranDuringOtherMode = fired.read { $0 } }
                loop.run(mode: .tracking, for: .seconds(10))
                result.locked {
                    $0.fireDateKept = timer.fireDate == fireDate
                    $0.valid = timer.isValid
                }
                timer.invalidate()
            }
            if published.wait(timeout: .seconds(10), until: { $0 != nil }), let (_, timer) = published.read({ $0 }) {
                timer.fire()
                firedRequested.store(true, ordering: .releasing)
            }
            _ = fired.wait(timeout: .seconds(20))
            _ = loopThread.join(timeout: .seconds(20))
            return result.locked { $0 }
        }
        guard let outcome else { return }
        #expect(outcome.handlerTID == outcome.loopTID)
        #expect(outcome.mode == .tracking)
        #expect(!outcome.ranDuringOtherMode)
        #expect(outcome.fireDateKept && outcome.valid)
    }

    /// fire() on a timer on no loop calls the handler on the caller's thread; on an invalidated
    /// timer it does nothing.
    @Test func fireOnAnUnscheduledTimerRunsOnTheCallersThread() async {
        let outcome = await TestThreads.run(name: "rlk-fire-free") { () -> (Int, Bool, Int) in
            let calls = Mutex(0)
            let repeating = RunLoopTimer(after: .seconds(1), repeating: .seconds(1)) { _ in calls.locked { $0 += 1 } }
            repeating.fire()
            let valid = repeating.isValid
            repeating.invalidate()
            repeating.fire()
            return (calls.locked { $0 }, valid, 0)
        }
        #expect(outcome?.0 == 1)
        #expect(outcome?.1 == true)
    }

    // MARK: weak target

    /// The seeds' retain cycle (a view controller owns a repeating timer whose target is the
    /// controller) with the built-in NSProxy fix: the timer holds its target weakly. The owner is
    /// released while the timer is scheduled; its deinit runs; at the timer's next fire the timer
    /// invalidates itself without calling the handler; the loop lets it go; nothing leaks.
    @Test func weakTargetTimerInvalidatesItselfWhenItsTargetIsGone() async {
        final class Owner: Sendable {
            let timer = Mutex<RunLoopTimer?>(nil)
            let ticks = Mutex(0)
            let deinitRan: DeinitFlag
            init(deinitRan: DeinitFlag) { self.deinitRan = deinitRan }
            deinit { deinitRan.ran.store(true, ordering: .relaxed) }
        }
        struct Outcome: Sendable {
            var ticksBeforeRelease = 0, handlerCallsAfterRelease = -1, deinitRanAtRelease = false
            var timerValidAfterRelease = false, timerValidAtEnd = true, result = RunLoop.RunResult.timedOut
            var ownerGone = false, timerGone = false
        }
        let outcome = await TestThreads.run(name: "rlk-weak") { () -> Outcome in
            let loop = RunLoop.current
            var outcome = Outcome()
            let deinitRan = DeinitFlag()
            let handlerCalls = Mutex(0)
            weak var weakOwner: Owner?
            weak var weakTimer: RunLoopTimer?
            do {
                let owner = Owner(deinitRan: deinitRan)
                weakOwner = owner
                let timer = loop.schedule(after: .milliseconds(2), repeating: .milliseconds(2), target: owner) {
                    owner, timer in
                    handlerCalls.locked { $0 += 1 }
                    owner.ticks.locked { $0 += 1 }
                    if owner.ticks.locked({ $0 }) == 3 { loop.stop() }
                }
                owner.timer.locked { $0 = timer }  // the cycle NSTimer would make
                weakTimer = timer
                // Three ticks with the owner alive.
                loop.run(mode: .default, for: .seconds(10))
                outcome.ticksBeforeRelease = owner.ticks.locked { $0 }
            }
            // The last strong reference to the owner is gone: no cycle kept it.
            outcome.deinitRanAtRelease = deinitRan.ran.load(ordering: .relaxed)
            let callsAtRelease = handlerCalls.locked { $0 }
            outcome.timerValidAfterRelease = weakTimer?.isValid ?? false
            // The timer is still scheduled (the loop holds it); at its next fire it finds the
            // owner gone and invalidates itself; the mode is then empty and the run finishes.
            outcome.result = loop.run(mode: .default, for: .seconds(10))
            outcome.handlerCallsAfterRelease = handlerCalls.locked { $0 } - callsAtRelease
            outcome.timerValidAtEnd = weakTimer?.isValid ?? false
            outcome.ownerGone = weakOwner == nil
            outcome.timerGone = weakTimer == nil
            return outcome
        }
        guard let outcome else { return }
        #expect(outcome.ticksBeforeRelease == 3)
        #expect(outcome.deinitRanAtRelease)
        #expect(outcome.timerValidAfterRelease, "scheduled and valid until its next fire")
        #expect(outcome.result == .finished)
        #expect(outcome.handlerCallsAfterRelease == 0)
        #expect(!outcome.timerValidAtEnd)
        #expect(outcome.ownerGone)
        #expect(outcome.timerGone, "the loop released the invalidated timer")
    }

    /// fire() on a weak-target timer whose target is gone does not call the handler and
    /// invalidates the timer; the unscheduled initializer holds its target weakly too.
    @Test func weakTargetTimerInitializerAndFireAfterTheTargetIsGone() async {
        final class Target: Sendable {}
        let outcome = await TestThreads.run(name: "rlk-weak-fire") { () -> (Int, Bool, Bool, Bool) in
            let calls = Mutex(0)
            weak var weakTarget: Target?
            let timer: RunLoopTimer
            do {
                let target = Target()
                weakTarget = target
                timer = RunLoopTimer(after: .seconds(100), repeating: .seconds(1), target: target) { _, _ in
                    calls.locked { $0 += 1 }
                }
                timer.fire()
            }
            let validBefore = timer.isValid
            RunLoop.current.add(timer, forMode: .default)
            timer.fire()
            return (calls.locked { $0 }, weakTarget == nil, validBefore, timer.isValid)
        }
        #expect(outcome?.0 == 1)
        #expect(outcome?.1 == true)
        #expect(outcome?.2 == true)
        #expect(outcome?.3 == false)
    }
}

/// Set by a deinit, read by the test.
final class DeinitFlag: Sendable {
    let ran = Atomic(false)
}

/// Set once the cross-thread fire() of fireFromAnotherThread... has been called.
private let firedRequested = Atomic(false)
