import Glibc
import SharedTestSupport
import Testing

@testable import RunLoopKit

/// Finding 11: invalidating a timer releases its handler, and so everything the handler captured,
/// at once (as `CFRunLoopTimerInvalidate` releases its context), whether or not the loop runs;
/// and a timer that leaves its last mode is not kept alive by the loop (a stale heap entry must
/// not hold it until it would have fired: a 1-hour timer would pin its captures for an hour).
@Suite struct HostileInvalidateReleaseTests {
    /// A 1-hour timer capturing an object, and a weak reference to that object.
    static func capturingTimer(_ tally: LiveTally) -> (RunLoopTimer, WeakBox<Captured>) {
        let captured = Captured(tally)
        let timer = RunLoopTimer(after: .seconds(3600)) { _ in _ = captured }
        return (timer, WeakBox(captured))
    }

    /// The loop is not running: `invalidate()` alone frees the captured object, while the test
    /// still holds the timer.
    @Test func invalidatingATimerReleasesWhatItsHandlerCapturedAtOnce() async {
        let outcome = await TestThreads.run(name: "hl-release-idle") { () -> (Bool, Bool) in
            let loop = RunLoop.current
            let tally = LiveTally()
            let (timer, captured) = Self.capturingTimer(tally)
            loop.add(timer, forMode: .default)
            let aliveWhileScheduled = captured.object != nil
            timer.invalidate()
            let freed = captured.object == nil
            withExtendedLifetime(timer) {}
            return (aliveWhileScheduled, freed)
        }
        guard let (aliveWhileScheduled, freed) = outcome else { return }
        #expect(aliveWhileScheduled)
        #expect(freed, "the invalidated timer's handler still holds what it captured")
    }

    /// The same while the loop runs (asleep, on another thread): `invalidate()` from the test's
    /// thread frees the captured object before it returns.
    @Test func invalidatingATimerOfARunningLoopReleasesWhatItsHandlerCapturedAtOnce() async {
        guard
            let host = TestThread.hostingLoop(
                name: "hl-release-run",
                setup: { loop in loop.add(RunLoopSource {}, forMode: .default) },
                run: { loop in loop.run(mode: .default, for: .seconds(20)) })
        else { return }
        defer {
            host.loop.stop()
            _ = host.join(timeout: .seconds(10))
        }
        let tally = LiveTally()
        let (timer, captured) = Self.capturingTimer(tally)
        host.loop.add(timer, forMode: .default)
        #expect(waitUntil { host.loop.isWaiting }, "the loop did not go to sleep")
        #expect(captured.object != nil)
        timer.invalidate()
        #expect(captured.object == nil, "the invalidated timer's handler still holds what it captured")
        withExtendedLifetime(timer) {}
    }

    /// 100,000 timers, each capturing an object, added to a mode then invalidated (and dropped by
    /// the test): every captured object is freed, without running the loop.
    @Test func aHundredThousandInvalidatedTimersReleaseEverythingTheyCaptured() async {
        let live = await TestThreads.run(name: "hl-release-100k", timeout: .seconds(120)) { () -> Int in
            let loop = RunLoop.current
            let tally = LiveTally()
            var timers: [RunLoopTimer] = []
            timers.reserveCapacity(100_000)
            for _ in 0..<100_000 {
                let (timer, _) = Self.capturingTimer(tally)
                loop.add(timer, forMode: .default)
                timers.append(timer)
            }
            for timer in timers { timer.invalidate() }
            timers.removeAll()
            return tally.count
        }
        guard let live else { return }
        #expect(live == 0, "\(live) of 100,000 captured objects are still alive")
    }

    /// A timer removed from its only mode (of a few timers) and then dropped by the test is freed,
    /// with what its handler captured: the loop holds no reference to a timer that is in none of
    /// its modes.
    @Test func aTimerRemovedFromItsOnlyModeIsFreedOnceTheTestDropsIt() async {
        let outcome = await TestThreads.run(name: "hl-release-remove") { () -> (Bool, Bool) in
            let loop = RunLoop.current
            let tally = LiveTally()
            // A few other timers in the mode.
            let others = (0..<3).map { _ in RunLoopTimer(after: .seconds(3600)) { _ in } }
            for other in others { loop.add(other, forMode: .default) }
            func addAndRemove() -> (WeakBox<RunLoopTimer>, WeakBox<Captured>) {
                let (timer, captured) = Self.capturingTimer(tally)
                loop.add(timer, forMode: .default)
                loop.remove(timer, forMode: .default)
                return (WeakBox(timer), captured)
            }
            let (timer, captured) = addAndRemove()
            let outcome = (timer.object == nil, captured.object == nil)
            for other in others { other.invalidate() }
            return outcome
        }
        guard let (timerFreed, capturedFreed) = outcome else { return }
        #expect(timerFreed, "the removed timer is still alive")
        #expect(capturedFreed, "what the removed timer's handler captured is still alive")
    }
}
