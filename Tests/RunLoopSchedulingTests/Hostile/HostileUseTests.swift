import Foundation
import Glibc
import Metrics
import MetricsTestKit
import RunLoopKit
import RunLoopScheduling
import SharedTestSupport
import Synchronization
import Testing


/// Runs SchedulingProbe with `scenario` (see SharedTestSupport's `runProbe`).
func runSchedulingProbe(_ scenario: String) throws -> (status: Int32, stdout: String, stderr: String) {
    try runProbe("SchedulingProbe", [scenario])
}

@Suite struct HostileUseTests {
    /// Non-positive budgets, capacities, timeouts, frame rates and windows, and empty mode lists,
    /// stop the process with a message that names the parameter and the value.
    @Test(arguments: [
        ("idle-budget", "IdleTaskQueue budget must be positive (got 0.0 seconds)"),
        ("idle-capacity", "IdleTaskQueue capacity must be positive (got 0)"),
        ("idle-timeout", "IdleTaskQueue task timeout must be positive (got -0.005 seconds)"),
        ("idle-modes", "IdleTaskQueue needs at least one mode"),
        ("fps-zero", "DisplayLink framesPerSecond must be positive (got 0)"),
        ("fps-huge", "DisplayLink framesPerSecond must be at most 1,000,000 (got 2000000)"),
        ("fps-window", "FrameRateMonitor window must be positive (got 0.0 seconds)"),
        ("commit-modes", "CommitCoalescer needs at least one mode"),
        ("pool-modes", "IterationPool needs at least one mode"),
    ])
    func badInputStopsWithAClearMessage(scenario: String, message: String) throws {
        let probe = try runSchedulingProbe(scenario)
        #expect(probe.status < 0, "\(scenario) did not stop: status \(probe.status)")
        #expect(probe.stderr.contains("RunLoopScheduling: " + message), "\(probe.stderr)")
    }

    /// No descriptor left: a display link says why it cannot start (EMFILE) and is invalid; pausing
    /// and invalidating it are harmless; the idle queue and the coalescer need no descriptor and
    /// still run; once descriptors are free, a new link starts.
    @Test func aDisplayLinkWithNoDescriptorLeftReportsItAndNothingElseBreaks() throws {
        let probe = try runSchedulingProbe("no-descriptors")
        #expect(probe.status == 0, "\(probe.stderr)")
        #expect(probe.stdout.contains("link error: Too many open files"), "\(probe.stdout)")
        #expect(probe.stdout.contains("link valid: false"))
        #expect(probe.stdout.contains("ran: commit,idle"))
        #expect(probe.stdout.contains("after release: true"))
        #expect(probe.stdout.contains("done"))
    }

    /// A forked child shares the link's timerfd: its pause and invalidate must not disarm the
    /// parent's frames.
    @Test func aForkedChildCannotStopTheParentsFrames() throws {
        let probe = try runSchedulingProbe("fork-link")
        #expect(probe.status == 0, "\(probe.stderr)")
        #expect(probe.stdout.contains("child exit: 0"), "\(probe.stdout)")
        // 300 ms at 100 Hz is 30 frames; 10 leaves room for a loaded machine.
        let line = probe.stdout.split(separator: "\n").first { $0.hasPrefix("frames after the child: ") }
        let frames = line.flatMap { Int($0.split(separator: " ").last ?? "") } ?? 0
        #expect(frames >= 10, "\(probe.stdout)")
    }

    /// A commit that asks for itself again, forever: once per iteration, and timers keep firing.
    @Test func aCommitThatRequestsItselfForeverCannotStarveTimers() {
        onNewThread { loop in
            let coalescer = CommitCoalescer(loop: loop, modes: [.default])
            defer { coalescer.invalidate() }
            let commits = Count()
            let points = Count()
            let observer = RunLoopObserver(activities: [.beforeWaiting, .exit], order: Int.min) { _, _ in points.add() }
            loop.add(observer, forMode: .default)
            defer { observer.invalidate() }
            @Sendable func again() {
                commits.add()
                coalescer.setNeedsCommit(key: "self", again)
            }
            loop.perform { coalescer.setNeedsCommit(key: "self", again) }
            let fired = Count()
            let timer = RunLoopTimer(after: .milliseconds(5), repeating: .milliseconds(5)) { _ in fired.add() }
            loop.add(timer, forMode: .default)
            defer { timer.invalidate() }
            run(loop, until: { fired.value >= 20 })
            #expect(fired.value >= 20)
            // Once per beforeWaiting or exit, never more.
            #expect(commits.value > 20)
            #expect(commits.value <= points.value)
        }
    }

    /// An idle task that enqueues a new copy of itself (not `.more`) runs once per idle period:
    /// the period runs only what was queued before it began, so timers keep firing.
    @Test func anIdleTaskThatReenqueuesItselfCannotStarveTimers() {
        onNewThread { loop in
            let queue = IdleTaskQueue(loop: loop, budget: .milliseconds(50))
            defer { queue.invalidate() }
            let runs = Count()
            @Sendable func task(_ deadline: IdleDeadline) -> IdleTaskResult {
                runs.add()
                queue.enqueue(task)
                return .done
            }
            queue.enqueue(task)
            let fired = Count()
            let timer = RunLoopTimer(after: .milliseconds(5), repeating: .milliseconds(5)) { _ in fired.add() }
            loop.add(timer, forMode: .default)
            defer { timer.invalidate() }
            let counter = ActivityCounter(loop)
            run(loop, until: { fired.value >= 20 })
            #expect(fired.value >= 20)
            #expect(runs.value > 20)
            #expect(runs.value <= counter.beforeWaiting.value)
        }
    }

    /// The link's thread exits while frames come: the handler is released; the link, invalid,
    /// takes pause and invalidate calls without effect.
    @Test func aDisplayLinkIsReleasedAndClosedWhenItsThreadExits() {
        let object = Tracked()
        let watch = WeakRef(object)
        let holder = Mutex<DisplayLink?>(nil)
        onNewThread { [object] loop in
            let frames = Count()
            let link = DisplayLink(loop: loop, framesPerSecond: 200) { [object] _ in
                _ = object
                frames.add()
            }
            holder.locked { $0 = link }
            run(loop, until: { frames.value >= 3 })
        }
        _ = consume object
        #expect(watch.isReleased)
        #expect(holder.locked { $0 }?.isValid == false)
        let link = holder.locked { $0 }
        link?.isPaused = true  // on a closed link: nothing happens, no crash
        link?.invalidate()
    }

    /// Everything of the module on a loop whose thread exits with work pending: all released.
    @Test func everythingPendingIsReleasedWhenTheThreadExits() {
        let objects = (0..<4).map { _ in Tracked() }
        let watches = objects.map(WeakRef.init)
        onNewThread { [objects] loop in
            let idle = IdleTaskQueue(loop: loop)
            let commit = CommitCoalescer(loop: loop)
            let pool = IterationPool(loop: loop)
            let link = DisplayLink(loop: loop, framesPerSecond: 1) { [object = objects[3]] _ in _ = object }
            idle.enqueue(timeout: .seconds(60)) { [object = objects[0]] _ in _ = object; return .done }
            commit.setNeedsCommit(key: 1) { [object = objects[1]] in _ = object }
            pool.release(objects[2])
            withExtendedLifetime((idle, commit, pool, link)) {}
        }
        _ = consume objects
        for watch in watches { #expect(watch.isReleased) }
    }

    /// FrameRateMonitor's metrics: the FPS gauge, frame and dropped-frame counters, and one
    /// counter per bucket.
    @Test func frameRateMonitorReportsToSwiftMetrics() throws {
        _ = testMetrics
        onNewThread { loop in
            let link = DisplayLink(loop: loop, framesPerSecond: 100) { _ in }
            defer { link.invalidate() }
            let monitor = FrameRateMonitor(link: link, window: .milliseconds(100), label: "metered")
            run(loop, until: { monitor.lastReport != nil })
            loop.perform { spin(for: .milliseconds(60)) }
            run(loop, until: { monitor.totals.droppedFrames >= 3 })
            let totals = monitor.totals
            #expect(totals.droppedFrames >= 3)
        }
        let loop = [("loop", "metered")]
        let fps = try testMetrics.expectGauge("runloop_fps", loop)
        #expect((fps.lastValue ?? 0) > 0)
        let frames = try testMetrics.expectCounter("runloop_frames_total", loop)
        #expect(frames.totalValue >= 10)
        let dropped = try testMetrics.expectCounter("runloop_frames_dropped_total", loop)
        #expect(dropped.totalValue >= 3)
        let best = try testMetrics.expectCounter("runloop_frame_drops_total", [("loop", "metered"), ("bucket", "best")])
        #expect(best.totalValue >= 1)
        let middle = try testMetrics.expectCounter("runloop_frame_drops_total", [("loop", "metered"), ("bucket", "middle")])
        #expect(middle.totalValue >= 1)
    }
}

@Suite struct IdleTimingTests {
    /// A repeating timer among 3 ms tasks: the tasks all run, and a timer waits at most for the
    /// task in progress: once it is due, no task starts before it fires.
    ///
    /// Counted, not timed, so a loaded machine that preempts the loop thread cannot fail it: each
    /// fire counts the tasks that started at or after its due date. One may, where the queue's
    /// "is a timer due?" check came just before the due date and the task's start stamp just
    /// after. Without the rule, the 8 ms budget starts two or three tasks after a due date.
    @Test func aTimerWaitsAtMostForTheTaskInProgress() {
        onNewThread { loop in
            let queue = IdleTaskQueue(loop: loop, budget: .milliseconds(8))
            defer { queue.invalidate() }
            let done = Count()
            let starts = Mutex<[ContinuousClock.Instant]>([])
            for _ in 0..<40 {
                queue.enqueue { _ in
                    starts.locked { $0.append(.now) }
                    spin(for: .milliseconds(3))
                    done.add()
                    return .done
                }
            }
            let worst = Mutex<(started: Int, late: Duration)>((0, .zero))
            let fires = Count()
            let timer = RunLoopTimer(after: .milliseconds(10), repeating: .milliseconds(10)) { timer in
                let due = timer.fireDate
                let started = starts.locked { stamps in stamps.count { $0 >= due } }
                let late = ContinuousClock.now - due
                worst.locked { $0 = (max($0.started, started), max($0.late, late)) }
                fires.add()
            }
            loop.add(timer, forMode: .default)
            defer { timer.invalidate() }
            run(loop, until: { done.value == 40 })
            #expect(done.value == 40)
            #expect(fires.value >= 2)
            let (started, late) = worst.locked { $0 }
            #expect(started <= 1, "a fire came after \(started) tasks that started once it was due (\(late) late)")
        }
    }

    /// The loop sleeps until an imminent timer instead of taking another pass; a task that removes
    /// that timer must not strand the queue: it is asked again when the period ends.
    @Test func aTaskThatRemovesTheImminentTimerDoesNotStrandTheQueue() {
        onNewThread { loop in
            let source = keepAlive(loop)
            defer { source.invalidate() }
            let queue = IdleTaskQueue(loop: loop, budget: .milliseconds(50))
            defer { queue.invalidate() }
            let timer = RunLoopTimer(after: .milliseconds(2), repeating: .milliseconds(2)) { _ in }
            loop.add(timer, forMode: .default)
            let done = Count()
            for index in 0..<20 {
                queue.enqueue { _ in
                    spin(for: .milliseconds(3))
                    if index == 3 { timer.invalidate() }
                    done.add()
                    if index == 19 { loop.stop() }
                    return .done
                }
            }
            // One run: a stranded queue would leave it asleep until its deadline.
            let started = ContinuousClock.now
            let result = loop.run(mode: .default, for: .seconds(5))
            #expect(done.value == 20)
            #expect(result == .stopped)
            #expect(ContinuousClock.now - started < .seconds(4))
        }
    }
}

/// Callouts that run the loop nested, in another mode, while work for the outer mode is pending:
/// the outer run must still serve it in its next pass, not sleep to its deadline.
@Suite struct NestedRunInAnotherModeTests {
    /// A `.default` timer's callout enqueues an idle task (queue in `.default`), then runs the loop
    /// nested in `.tracking` for 150 ms; back in the outer `.default` run (300 ms), the task runs
    /// at the next `beforeWaiting`, well before the outer run's end.
    @Test func anIdleTaskQueuedBeforeANestedRunInAnotherModeRunsAfterIt() {
        onNewThread { loop in
            let log = Log()
            let source = keepAlive(loop)
            let tracking = keepAlive(loop, "tracking")
            defer { source.invalidate(); tracking.invalidate() }
            let queue = IdleTaskQueue(loop: loop, modes: [.default])
            defer { queue.invalidate() }
            let start = ContinuousClock.now
            let timer = RunLoopTimer(after: .milliseconds(10)) { _ in
                queue.enqueue { _ in
                    log.append("task at \((ContinuousClock.now - start) < .milliseconds(250) ? "once back" : "the run's end")")
                    return .done
                }
                RunLoop.current.run(mode: "tracking", for: .milliseconds(150))
                log.append("nested run returned")
            }
            loop.add(timer, forMode: .default)
            loop.run(mode: .default, for: .milliseconds(300))
            #expect(log.all == ["nested run returned", "task at once back"])
        }
    }
}

/// Callouts that run the loop nested break no scheduling object: the observers that are firing
/// are skipped in the nested run (an observer is never re-entered), sources are not, and the
/// nested run takes the wakeups meant for the outer one. Each object makes up for it itself.
@Suite struct NestedRunInACalloutTests {
    /// A deferred closure that runs the loop nested (a connection flushing in a `deinit`, say):
    /// the level the nested run pushed is not left behind, so objects handed over later, between
    /// runs, are released by the next run's drains.
    @Test func aPoolSurvivesADeferredClosureThatRunsTheLoop() {
        onNewThread { loop in
            final class Tracked: Sendable {}
            let source = keepAlive(loop)
            defer { source.invalidate() }
            let pool = IterationPool(loop: loop, modes: [.default])
            defer { pool.invalidate() }
            for _ in 0..<3 {
                pool.defer { RunLoop.current.run(mode: .default, for: .milliseconds(1)) }
                loop.run(mode: .default, for: .milliseconds(5))
            }
            // Handed over between runs: the next run's first drain lets it go.
            weak var weakObject: Tracked?
            do {
                let object = Tracked()
                weakObject = object
                pool.release(object)
            }
            #expect(run(loop, until: { weakObject == nil }, timeout: .seconds(2)), "an object handed over later was never released")
            #expect(pool.pendingCount == 0)
        }
    }

    /// A frame handler that runs the loop nested for longer than a frame is not called again
    /// inside that run (a RunLoopTimer's handler never is either); the frames that went by are
    /// reported as dropped with the next frame.
    @Test func aDisplayLinksHandlerIsNeverReentered() {
        onNewThread { loop in
            let depth = Atomic<Int>(0)
            let deepest = Atomic<Int>(0)
            let frames = Mutex<[Int]>([])
            let link = DisplayLink(loop: loop, modes: [.default], framesPerSecond: 60) { frame in
                let now = depth.add(1, ordering: .relaxed).newValue
                if now > deepest.load(ordering: .relaxed) { deepest.store(now, ordering: .relaxed) }
                let count = frames.locked { frames -> Int in
                    frames.append(frame.droppedFrames)
                    return frames.count
                }
                // The first frame runs the loop for about three frames' time.
                if count == 1 { RunLoop.current.run(mode: .default, for: .milliseconds(55)) }
                depth.subtract(1, ordering: .relaxed)
            }
            defer { link.invalidate() }
            run(loop, until: { frames.locked { $0.count } >= 3 }, timeout: .seconds(5))
            #expect(deepest.load(ordering: .relaxed) == 1, "the handler was re-entered")
            let dropped = frames.locked { $0 }
            #expect(dropped.count >= 2 && dropped[1] >= 2, "the next frame reports the skipped ones: \(dropped)")
        }
    }

    /// Work set during a commit by a run nested in a work item (a timer of that run sets it) is
    /// committed at the outer run's next pass, not when the outer run times out.
    @Test func workSetDuringACommitsNestedRunIsCommittedNext() {
        onNewThread { loop in
            let source = keepAlive(loop)
            defer { source.invalidate() }
            let coalescer = CommitCoalescer(loop: loop, modes: [.default])
            defer { coalescer.invalidate() }
            let log = Log()
            coalescer.setNeedsCommit(key: 1) {
                let timer = RunLoopTimer(after: .milliseconds(1)) { _ in
                    coalescer.setNeedsCommit(key: 2) {
                        log.append("B committed")
                        RunLoop.current.stop()
                    }
                }
                RunLoop.current.add(timer, forMode: .default)
                RunLoop.current.run(mode: .default, for: .milliseconds(20))
                log.append("A's nested run returned")
            }
            let start = ContinuousClock.now
            loop.run(mode: .default, for: .seconds(2))
            let elapsed = ContinuousClock.now - start
            #expect(log.all == ["A's nested run returned", "B committed"])
            // At the next pass: well under the outer run's 2 s (room for a loaded machine).
            #expect(elapsed < .seconds(1), "B waited \(elapsed)")
        }
    }
}
