import Glibc
import RunLoopKit
import RunLoopScheduling
import RunLoopTesting
import SharedTestSupport
import Synchronization
import Testing

import class RunLoopKit.RunLoop

// Every test here runs on virtual time: the assertions are exact, and none depends on the
// machine's speed or load (nothing sleeps; real time passing changes nothing).

@Suite struct VirtualTimeLoopTests {
    /// A repeating timer fires at each multiple of its interval, one full pass each, and the
    /// loop's observers see one sleep per fire, as in production.
    @Test func aRepeatingTimerFiresAtEachIntervalWithAFullPassEach() throws {
        try withVirtualTime { time in
            let start = time.start
            let fires = LoopBound<[Duration]>([])
            let activities = LoopBound<[String]>([])
            let timer = RunLoopTimer(after: .milliseconds(100), repeating: .milliseconds(100)) { _ in
                fires.value.append(RunLoop.now - start)
            }
            let observer = RunLoopObserver(activities: [.beforeWaiting, .afterWaiting]) { _, activity in
                activities.value.append("\(activity)")
            }
            RunLoop.current.add(timer, forMode: .default)
            RunLoop.current.add(observer, forMode: .default)
            try time.advance(by: .seconds(1))
            #expect(fires.value == (1...10).map { .milliseconds(100 * $0) })
            #expect(time.elapsed == .seconds(1))
            // Ten sleeps that a timer ended, and the last pass's announcement of the next sleep.
            #expect(activities.value.count(where: { $0 == "afterWaiting" }) == 11)
            #expect(activities.value.count(where: { $0 == "beforeWaiting" }) == 11)
        }
    }

    /// Blocks, sources and what they trigger all run at the current instant; the clock stays.
    @Test func runUntilIdleRunsEverythingDueNowWithoutMovingTheClock() throws {
        try withVirtualTime { time in
            let log = LoopBound<[String]>([])
            let loop = RunLoop.current
            let source = RunLoopSource {
                log.value.append("source")
                loop.perform { log.value.append("block queued by the source") }
            }
            loop.add(source, forMode: .default)
            loop.perform {
                log.value.append("block")
                source.signal()
            }
            let before = time.now
            try time.runUntilIdle()
            #expect(log.value == ["block", "source", "block queued by the source"])
            #expect(time.now == before)
        }
    }

    /// An ordered performer added from another thread is due at the loop's virtual now: its timer
    /// is not dated on the adding thread's real clock, which is ahead of a virtual clock that has
    /// not been advanced past it (by the real time since `withVirtualTime` began), where
    /// `runUntilIdle()` would never reach it. It runs, and the clock stays.
    @Test func anOrderedPerformerAddedFromAnotherThreadRunsInRunUntilIdle() throws {
        try withVirtualTime { time in
            let loop = time.runLoop
            let ran = TestEvent()
            let adder = TestThread(name: "vt-perform-order") {
                loop.perform(order: 0) { ran.fire() }
            }
            #expect(adder.join(timeout: .seconds(10)))
            let before = time.now
            try time.runUntilIdle()
            #expect(ran.read { $0 }, "the performer ran")
            #expect(time.now == before)
        }
    }

    /// Work that never settles is a livelock, reported with the items that ran last.
    @Test func runUntilIdleReportsALivelockWithTheActivityTrail() {
        withVirtualTime { time in
            let loop = RunLoop.current
            let again = LoopBound<RunLoopSource?>(nil)
            let source = RunLoopSource { again.value?.signal() }
            source.label = "re-signalling source"
            again.value = source
            loop.add(source, forMode: .default)
            source.signal()
            #expect {
                try time.runUntilIdle(maxPasses: 500)
            } throws: { error in
                guard case VirtualTimeError.livelock(let at, let passes, let trail) = error else { return false }
                return at == .zero && passes == 500 && !trail.isEmpty
                    && trail.allSatisfy { $0.contains("re-signalling source") || $0.contains("observers") == false }
                    && trail.last!.contains("sources0 re-signalling source")
            }
            source.invalidate()
            again.value = nil
        }
    }

    /// advance(by:) stops on a livelock too, where the time was when it began.
    @Test func advanceReportsALivelockAtTheInstantItHappened() {
        withVirtualTime { time in
            let loop = RunLoop.current
            let timer = RunLoopTimer(after: .milliseconds(300)) { _ in
                // From here on the loop never settles: each block performs the next.
                @Sendable func again() { RunLoop.current.perform { again() } }
                again()
            }
            timer.label = "the timer that starts it"
            loop.add(timer, forMode: .default)
            var caught: VirtualTimeError?
            do throws(VirtualTimeError) { try time.advance(by: .seconds(1)) } catch { caught = error }
            guard case .livelock(let at, _, let trail) = caught else {
                Issue.record("expected a livelock, got \(String(describing: caught))")
                return
            }
            #expect(at == .milliseconds(300))
            #expect(trail.contains { $0.contains("blocks") })
            #expect(String(describing: caught!).contains("livelock"))
        }
    }

    /// A descriptor source works: the sleep becomes a poll, and the handler gets the bytes.
    @Test func aDescriptorSourceIsPolled() throws {
        var fds: [Int32] = [0, 0]
        #expect(pipe(&fds) == 0)
        defer { close(fds[1]) }
        try withVirtualTime { time in
            let received = LoopBound<[UInt8]>([])
            let source = try FileDescriptorSource(descriptor: fds[0], ownsDescriptor: true) { source, _ in
                var byte: UInt8 = 0
                if read(source.descriptor, &byte, 1) == 1 { received.value.append(byte) }
            }
            RunLoop.current.add(source, forMode: .default)
            var bytes: [UInt8] = [7, 8, 9]
            #expect(write(fds[1], &bytes, 3) == 3)
            try time.runUntilIdle()
            #expect(received.value == [7, 8, 9])
            source.invalidate()
        }
    }

    /// Idle tasks and commits, which RunLoopScheduling places at beforeWaiting, run as in
    /// production: the commit once per pass with work, the idle task in the idle period.
    @Test func idleTasksAndCommitsRunInTheirPhase() throws {
        try withVirtualTime { time in
            let loop = RunLoop.current
            let log = LoopBound<[String]>([])
            let commits = CommitCoalescer(loop: loop, modes: [.default])
            let idle = IdleTaskQueue(loop: loop)
            // An application's loop always has a source; without one the mode would be empty once
            // the timer fired, and the run would end (the commit would then run at exit).
            loop.add(RunLoopSource {}, forMode: .default)
            let timer = RunLoopTimer(after: .milliseconds(50)) { _ in
                commits.setNeedsCommit(key: "layout") { log.value.append("commit at \(time.elapsed)") }
                commits.setNeedsCommit(key: "layout") { log.value.append("commit (coalesced) at \(time.elapsed)") }
                idle.enqueue { _ in
                    log.value.append("idle task at \(time.elapsed)")
                    return .done
                }
            }
            loop.add(timer, forMode: .default)
            try time.advance(by: .milliseconds(100))
            #expect(log.value == ["commit (coalesced) at 0.05 seconds", "idle task at 0.05 seconds"])
            #expect(commits.commitCount == 1)
            commits.invalidate()
            idle.invalidate()
        }
    }

    /// An idle task that spins on `shouldYield` (the documented pattern) would never end on
    /// virtual time, where its work takes no time: after a million polls at one instant the
    /// deadline says it is spent, the task returns, and `advance` reports it, clock where it was.
    @Test func anIdleTaskSpinningOnShouldYieldIsReportedNotAHang() {
        withVirtualTime { time in
            let loop = RunLoop.current
            let idle = IdleTaskQueue(loop: loop)
            loop.add(RunLoopSource {}, forMode: .default)
            let units = LoopBound(0)
            let timer = RunLoopTimer(after: .milliseconds(50)) { _ in
                idle.enqueue { deadline in
                    while !deadline.shouldYield { units.value += 1 }
                    return .done
                }
            }
            loop.add(timer, forMode: .default)
            #expect {
                try time.advance(by: .milliseconds(100))
            } throws: { error in
                guard case VirtualTimeError.clockStalled(let at, let polls, _) = error else { return false }
                return at == .milliseconds(50) && polls == 1_000_000
            }
            #expect(units.value == 1_000_000)
            #expect("\(VirtualTimeError.clockStalled(at: .zero, polls: 1, trail: []))".contains("elapse"))
            idle.invalidate()
        }
    }

    /// The same task, saying how long each unit takes with `elapse`, yields when its budget is
    /// spent, as in production; `timeRemaining` agrees.
    @Test func anIdleTaskThatElapsesItsWorkYieldsAtItsBudget() throws {
        try withVirtualTime { time in
            let loop = RunLoop.current
            let idle = IdleTaskQueue(loop: loop)
            loop.add(RunLoopSource {}, forMode: .default)
            let units = LoopBound(0)
            let remainingAtEnd = LoopBound(Duration.seconds(1))
            let timer = RunLoopTimer(after: .milliseconds(50)) { _ in
                idle.enqueue { deadline in
                    while !deadline.shouldYield {
                        time.elapse(.milliseconds(1))
                        units.value += 1
                    }
                    remainingAtEnd.value = deadline.timeRemaining
                    return .done
                }
            }
            loop.add(timer, forMode: .default)
            try time.advance(by: .milliseconds(100))
            #expect(units.value > 0 && units.value < 50)
            #expect(remainingAtEnd.value == .zero)
            idle.invalidate()
        }
    }

    /// Advancing by the longest duration there is, with a repeating timer: the pass limit, not a
    /// claim that a run would sleep for ever.
    @Test func advancingByTheLongestDurationHitsThePassLimit() {
        withVirtualTime { time in
            let fires = LoopBound(0)
            let timer = RunLoopTimer(after: .milliseconds(100), repeating: .milliseconds(100)) { _ in fires.value += 1 }
            RunLoop.current.add(timer, forMode: .default)
            #expect {
                try time.advance(by: .seconds(Int64.max), maxPasses: 1_000)
            } throws: { error in
                print("advance(by: .seconds(Int64.max)): \(error)")
                guard case VirtualTimeError.passLimit = error else { return false }
                return true
            }
            #expect(fires.value >= 999)
        }
    }

    /// A run a callout nests sleeps to its deadline: the clock moves as in production.
    @Test func aNestedRunMovesTheClock() throws {
        try withVirtualTime { time in
            let loop = RunLoop.current
            let after = LoopBound<Duration?>(nil)
            loop.add(RunLoopSource {}, forMode: "Nested")
            let timer = RunLoopTimer(after: .milliseconds(10)) { _ in
                RunLoop.current.run(mode: "Nested", for: .milliseconds(40))
                after.value = time.elapsed
            }
            loop.add(timer, forMode: .default)
            try time.advance(by: .milliseconds(100))
            #expect(after.value == .milliseconds(50))
            #expect(time.elapsed == .milliseconds(100))
        }
    }

    /// A nested run nothing but another thread could end is reported, not waited for forever.
    @Test func aNestedRunWithNoDeadlineIsReported() {
        withVirtualTime { time in
            let loop = RunLoop.current
            loop.add(RunLoopSource {}, forMode: "Forever")
            let timer = RunLoopTimer(after: .milliseconds(10)) { _ in
                RunLoop.current.run(mode: "Forever", before: RunLoop.distantFuture)
            }
            timer.label = "waits for another thread"
            loop.add(timer, forMode: .default)
            var caught: VirtualTimeError?
            do throws(VirtualTimeError) { try time.advance(by: .seconds(1)) } catch { caught = error }
            guard case .sleepsForever(let at, let trail) = caught else {
                Issue.record("expected sleepsForever, got \(String(describing: caught))")
                return
            }
            #expect(at == .milliseconds(10))
            #expect(trail.contains { $0.contains("waits for another thread") })
        }
    }

    /// Bad input gets a clear error; a drive from a callout is refused.
    @Test func badInputAndReentrantDrivesAreErrors() throws {
        try withVirtualTime { time in
            #expect(throws: VirtualTimeError.negativeDuration(.seconds(-1))) { try time.advance(by: .seconds(-1)) }
            #expect(throws: VirtualTimeError.invalidLimit(0)) { try time.runUntilIdle(maxPasses: 0) }
            let caught = LoopBound<VirtualTimeError?>(nil)
            RunLoop.current.perform {
                do throws(VirtualTimeError) { try time.advance(by: .seconds(1)) } catch { caught.value = error }
            }
            try time.runUntilIdle()
            #expect(caught.value == .calledFromCallout("advance(to:)"))
            // A target in the past runs what is due now and leaves the clock alone.
            let now = time.now
            try time.advance(to: now - .seconds(5))
            #expect(time.now == now)
            // Far-future targets saturate instead of overflowing; an empty mode lets the time pass.
            try time.advance(by: .seconds(86_400 * 365 * 100), in: "Empty")
            #expect(time.elapsed >= .seconds(86_400 * 365 * 100))
        }
    }

    /// A target no deadline reaches, in a mode with a source and no timer: nothing would ever
    /// wake the loop, which is reported instead of waited for; the clock stays.
    @Test func advancingToTheDistantFutureWithNothingDueIsReported() {
        withVirtualTime { time in
            RunLoop.current.add(RunLoopSource {}, forMode: .default)
            let before = time.now
            #expect {
                try time.advance(to: RunLoop.distantFuture)
            } throws: { error in
                guard case VirtualTimeError.sleepsForever(let at, _) = error else { return false }
                return at == .zero
            }
            #expect(time.now == before)
        }
    }

    /// Leaving the scope gives the thread its own loop and the real clock back, and tears the
    /// virtual loop down (its sources' cancel callbacks run, blocks performed later are dropped).
    @Test func leavingRestoresTheThreadsLoopAndClock() throws {
        let own = RunLoop.current
        final class Counter: Sendable { let value = Atomic(0) }
        let cancelled = Counter()
        var virtualLoop: RunLoop?
        try withVirtualTime { time in
            virtualLoop = RunLoop.current
            #expect(RunLoop.current !== own)
            let source = RunLoopSource(onCancel: { _, _ in cancelled.value.add(1, ordering: .relaxed) }) {}
            RunLoop.current.add(source, forMode: .default)
            try time.advance(by: .seconds(3600))
        }
        #expect(RunLoop.current === own)
        #expect(cancelled.value.load(ordering: .relaxed) == 1)
        #expect(virtualLoop?.hasThreadExited == true)
        let drift = RunLoop.now - ContinuousClock.now
        #expect(drift < .seconds(1) && drift > .seconds(-1))
    }

    /// An entry observer that stops every run: no pass is ever made, and the time never comes;
    /// that is reported as a livelock, not a hang.
    @Test func runsStoppedBeforeTheirFirstPassAreALivelock() {
        withVirtualTime { time in
            let loop = RunLoop.current
            loop.add(RunLoopSource {}, forMode: .default)
            loop.add(RunLoopObserver(activities: .entry) { _, _ in RunLoop.current.stop() }, forMode: .default)
            #expect(throws: VirtualTimeError.self) { try time.advance(by: .seconds(1)) }
        }
    }

    /// A livelock under a run(until:) nested in a callout: the nested run is unwound (it gets
    /// to its date at once) and the drive reports the livelock at the instant it happened.
    @Test func aLivelockUnderANestedRunUntilIsUnwound() {
        withVirtualTime { time in
            let loop = RunLoop.current
            let again = LoopBound<RunLoopSource?>(nil)
            let spinner = RunLoopSource { again.value?.signal() }
            again.value = spinner
            loop.add(spinner, forMode: .default)
            let timer = RunLoopTimer(after: .milliseconds(10)) { _ in
                spinner.signal()
                RunLoop.current.run(until: RunLoop.now + .seconds(1))
            }
            loop.add(timer, forMode: .default)
            var caught: VirtualTimeError?
            do throws(VirtualTimeError) { try time.advance(by: .seconds(5)) } catch { caught = error }
            guard case .livelock(let at, _, _) = caught else {
                Issue.record("expected a livelock, got \(String(describing: caught))")
                return
            }
            #expect(at == .milliseconds(10))
            spinner.invalidate()
            again.value = nil
        }
    }

    /// Between drives the body's own runs behave as in production: a 1 s run moves the clock 1 s
    /// (a finished drive leaves no idle stop or limit behind).
    @Test func theBodysOwnRunsMoveTheClockAfterADrive() throws {
        try withVirtualTime { time in
            RunLoop.current.add(RunLoopSource {}, forMode: .default)
            try time.runUntilIdle()
            let before = time.elapsed
            let result = RunLoop.current.run(mode: .default, for: .seconds(1))
            #expect(result == .timedOut)
            #expect(time.elapsed - before == .seconds(1))
        }
    }

    /// Work that moves the clock itself never repeats an instant; runUntilIdle still ends, with
    /// a pass limit.
    @Test func runUntilIdleHasATotalPassLimit() {
        withVirtualTime { time in
            @Sendable func again() {
                time.elapse(.milliseconds(1))
                RunLoop.current.perform { again() }
            }
            RunLoop.current.perform { again() }
            #expect {
                try time.runUntilIdle(maxPasses: 50)
            } throws: { error in
                guard case VirtualTimeError.passLimit(_, let passes, _) = error else { return false }
                return passes == 5_000
            }
        }
    }

    /// The teardown's callbacks run on virtual time and may ask the loop for the time.
    @Test func cancelCallbacksAtTheScopesEndMayReadTheClock() throws {
        final class Seen: Sendable { let value = Mutex<Duration?>(nil) }
        let seen = Seen()
        try withVirtualTime { time in
            let source = RunLoopSource(onCancel: { _, _ in seen.value.locked { $0 = time.elapsed } }) {}
            RunLoop.current.add(source, forMode: .default)
            try time.advance(by: .seconds(2))
        }
        #expect(seen.value.locked { $0 } == .seconds(2))
    }

    /// Scopes nest: the inner one has its own clock and loop; the outer ones come back.
    @Test func scopesNest() throws {
        try withVirtualTime { outer in
            let outerLoop = RunLoop.current
            try outer.advance(by: .seconds(10))
            try withVirtualTime { inner in
                #expect(RunLoop.current !== outerLoop)
                try inner.advance(by: .seconds(1))
                #expect(inner.elapsed == .seconds(1))
            }
            #expect(RunLoop.current === outerLoop)
            #expect(outer.elapsed == .seconds(10))
        }
    }
}

/// The example of RunLoopTesting's documentation (RunLoopTesting.docc) and of the README, as written there.
@Test func heartbeatKeepsItsRhythm() throws {
    try withVirtualTime { time in
        let start = time.start
        let beats = LoopBound<[Duration]>([])  // the callbacks run on this thread
        let heartbeat = RunLoopTimer(after: .seconds(1), repeating: .seconds(1)) { _ in
            beats.value.append(RunLoop.now - start)
            if beats.value.count == 1 { time.elapse(.milliseconds(2_500)) }  // a slow first beat
        }
        RunLoop.current.add(heartbeat, forMode: .default)
        try time.advance(by: .seconds(6))
        // The slow beat ran until 3.5 s: the beats at 2 s and 3 s are skipped, the phase is kept.
        #expect(beats.value == [.seconds(1), .seconds(4), .seconds(5), .seconds(6)])
    }
}

/// Waiting helpers and ordered performers on a loop on virtual time follow virtual time.
@Suite struct VirtualTimeWaitTests {
    /// `run(timeout:until:)` on a virtual-time loop: the timeout is virtual. Before, a 500 ms
    /// timeout was real time while the runs moved virtual time (2,568 s passed: 256 fires of a
    /// 10 s timer).
    @Test func runUntilTakesItsTimeoutOnVirtualTime() throws {
        withVirtualTime { time in
            let fires = LoopBound(0)
            let timer = RunLoopTimer(after: .seconds(10), repeating: .seconds(10)) { _ in fires.value += 1 }
            time.runLoop.add(timer, forMode: .default)
            let held = time.runLoop.run(timeout: .milliseconds(500)) { false }
            #expect(!held)
            #expect(time.elapsed == .milliseconds(500))
            #expect(fires.value == 0)
            // And a condition a timer makes true ends the run at the timer's instant.
            let done = time.runLoop.run(timeout: .seconds(60)) { fires.value == 2 }
            #expect(done)
            #expect(time.elapsed == .seconds(20))
            timer.invalidate()
        }
    }
}
