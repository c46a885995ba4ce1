#if GLib
import CGLib
import Glibc
import RunLoopGLib
import RunLoopKit
import SharedTestSupport
import Synchronization
import Testing

/// Real-time bounds, generous on a loaded 2-core machine and under a sanitizer; the assertions are
/// on counts and order.
private let slack: Duration = Sanitizers.any ? .milliseconds(400) : .milliseconds(100)

/// A loop drives a private GMainContext: GLib's timeouts, idles and descriptor watches run in the
/// loop's passes, in GLib's priority order, on the loop's thread.
@Suite struct GLibBridgeTests {
    /// A 30 ms `g_timeout` fires 3–8 times in a 200 ms `.default` run, on the loop's thread,
    /// inside a pass: an observer sees each fire between `afterWaiting` and `beforeWaiting`.
    @Test func timeoutFiresInsideThePasses() async {
        let result = await withBridgedLoop { loop, context, _ in
            let trail = Mutex<[String]>([])
            let loopThread = currentThreadID()
            let onLoopThread = Atomic<Bool>(true)
            let observer = RunLoopObserver(activities: [.afterWaiting, .beforeWaiting], order: -1) { _, activity in
                trail.locked { $0.append(activity == .afterWaiting ? "afterWaiting" : "beforeWaiting") }
            }
            loop.add(observer, forMode: .default)
            addTimeout(30, to: context) {
                if currentThreadID() != loopThread { onLoopThread.store(false, ordering: .relaxed) }
                trail.locked { $0.append("fire") }
                return true
            }
            loop.run(mode: .default, for: .milliseconds(200))
            observer.invalidate()
            return (trail.locked { $0 }, onLoopThread.load(ordering: .relaxed))
        }
        guard let (trail, onLoopThread) = result else { return }
        let fires = trail.filter { $0 == "fire" }.count
        #expect((3...8).contains(fires), "fires: \(fires)")
        #expect(onLoopThread)
        // Each fire comes after an afterWaiting (the pass it belongs to woke up) and before the
        // next beforeWaiting.
        for (index, entry) in trail.enumerated() where entry == "fire" {
            let before = trail[..<index].last { $0 != "fire" }
            #expect(before == "afterWaiting", "fire at \(index) follows \(before ?? "nothing"): \(trail)")
        }
    }

    /// Idles at DEFAULT_IDLE, HIGH and DEFAULT (added in that order) run HIGH, DEFAULT,
    /// DEFAULT_IDLE; no pass sleeps while one is pending.
    @Test func idlesDrainInPriorityOrderWithoutSleeping() async {
        let result = await withBridgedLoop { loop, context, _ in
            let order = Mutex<[String]>([])
            let slept = Mutex<[Duration]>([])
            let done = Atomic<Bool>(false)
            let reporter = loop.addIterationReporter { report in
                if !done.load(ordering: .relaxed) { slept.locked { $0.append(report.slept) } }
            }
            addIdle(context, priority: G_PRIORITY_DEFAULT_IDLE) {
                order.locked { $0.append("DEFAULT_IDLE") }
                done.store(true, ordering: .relaxed)
                loop.stop()
                return false
            }
            addIdle(context, priority: G_PRIORITY_HIGH) {
                order.locked { $0.append("HIGH") }
                return false
            }
            addIdle(context, priority: G_PRIORITY_DEFAULT) {
                order.locked { $0.append("DEFAULT") }
                return false
            }
            let start = ContinuousClock.now
            let outcome = loop.run(mode: .default, for: .seconds(5))
            let elapsed = ContinuousClock.now - start
            reporter.cancel()
            return (order.locked { $0 }, slept.locked { $0 }, outcome, elapsed)
        }
        guard let (order, slept, outcome, elapsed) = result else { return }
        #expect(order == ["HIGH", "DEFAULT", "DEFAULT_IDLE"])
        #expect(outcome == .stopped)
        #expect(elapsed < slack, "the idles took \(elapsed)")
        // Every pass until the last idle only polled the kernel: no pass slept (a pass that did
        // would sleep until the run's 5 s deadline, nothing else being due).
        #expect(!slept.isEmpty && slept.allSatisfy { $0 < .milliseconds(1) }, "slept: \(slept)")
    }

    /// A pipe watched with `g_unix_fd_add`: a worker's write ends a 5 s
    /// `run(mode:for:returnAfterSourceHandled: true)` at once, with `.handledSource`; the watch's
    /// callback ran on the loop's thread before the run returned.
    @Test func descriptorWatchEndsTheRun() async {
        let result = await withBridgedLoop { loop, context, _ in
            let (readEnd, writeEnd) = makePipe()
            defer {
                close(readEnd)
                close(writeEnd)
            }
            let loopThread = currentThreadID()
            let calledOnLoop = Atomic<Int>(0)
            addWatch(readEnd, to: context) {
                drain(readEnd)
                calledOnLoop.store(currentThreadID() == loopThread ? 1 : 2, ordering: .relaxed)
                return true
            }
            // GLib's own wakeups from attaching the watch are handled first.
            loop.run(mode: .default, for: .milliseconds(50))
            let writer = TestThread(name: "glib-writer") {
                usleep(50_000)
                var byte: UInt8 = 1
                _ = write(writeEnd, &byte, 1)
            }
            let start = ContinuousClock.now
            let outcome = loop.run(mode: .default, for: .seconds(5), returnAfterSourceHandled: true)
            let elapsed = ContinuousClock.now - start
            _ = writer.join(timeout: .seconds(5))
            return (outcome, elapsed, calledOnLoop.load(ordering: .relaxed))
        }
        guard let (outcome, elapsed, called) = result else { return }
        #expect(outcome == .handledSource)
        #expect(elapsed < .milliseconds(50) + slack, "the run took \(elapsed)")
        #expect(called == 1, "the watch's callback ran \(called == 0 ? "never" : "off the loop's thread")")
    }

    /// With nothing else pending, a worker's `g_main_context_invoke` ends a 5 s run within a few
    /// milliseconds, and the invoked function runs on the loop's thread (the bridge owns the
    /// context while the loop sleeps). `g_idle_add`, which names GLib's default context, is tested
    /// in GLibDefaultContextTests.
    @Test func invokeFromAWorkerWakesTheLoop() async {
        let result = await withBridgedLoop { loop, context, _ in
            let shared = SendablePointer(pointer: context)
            let loopThread = currentThreadID()
            let ranOn = Atomic<Int32>(0)
            let sentAt = Atomic<Int64>(0)
            let ranAt = Atomic<Int64>(0)
            let box = UInt(bitPattern: Unmanaged.passRetained(
                GLibCallback {
                    ranAt.store(RunLoop.clockNanoseconds, ordering: .relaxed)
                    ranOn.store(currentThreadID(), ordering: .relaxed)
                    RunLoop.current.stop()
                    return false
                }
            ).toOpaque())
            let worker = TestThread(name: "glib-invoker") {
                usleep(100_000)
                sentAt.store(RunLoop.clockNanoseconds, ordering: .relaxed)
                g_main_context_invoke_full(
                    shared.pointer, G_PRIORITY_DEFAULT,
                    { data in Unmanaged<GLibCallback>.fromOpaque(data!).takeUnretainedValue().body() ? 1 : 0 },
                    UnsafeMutableRawPointer(bitPattern: box),
                    { data in Unmanaged<GLibCallback>.fromOpaque(data!).release() })
            }
            let outcome = loop.run(mode: .default, for: .seconds(5))
            _ = worker.join(timeout: .seconds(5))
            let latency = Duration.nanoseconds(ranAt.load(ordering: .relaxed) - sentAt.load(ordering: .relaxed))
            return (outcome, latency, ranOn.load(ordering: .relaxed) == loopThread)
        }
        guard let (outcome, latency, onLoop) = result else { return }
        #expect(outcome == .stopped)
        #expect(onLoop, "the invoked function ran off the loop's thread")
        #expect(latency < (Sanitizers.any ? .milliseconds(100) : .milliseconds(10)), "woken after \(latency)")
    }

    /// No busy loop: idle with the bridge attached, a 500 ms run makes single-digit passes.
    @Test func idleBridgeMakesFewPasses() async {
        let passes = await withBridgedLoop { loop, _, _ in
            let count = Atomic<Int>(0)
            let observer = RunLoopObserver(activities: .beforeTimers) { _, _ in count.add(1, ordering: .relaxed) }
            loop.add(observer, forMode: .default)
            loop.run(mode: .default, for: .milliseconds(500))
            observer.invalidate()
            return count.load(ordering: .relaxed)
        }
        guard let passes else { return }
        #expect(passes < 10, "passes in 500 ms: \(passes)")
    }

    /// A nested `g_main_loop_run` of 200 ms (in a loop timer's callout) serves the loop through
    /// the reverse source a handful of times (its 80 ms timer's fires, a block from a worker),
    /// not thousands; the worker's block wakes GLib's poll at once (the loop's wakers write its
    /// eventfd while GLib sleeps for it); GLib's own timeout goes on in it.
    @Test func nestedGLibLoopServesTheLoopWithoutSpinning() async {
        let result = await withBridgedLoop { loop, context, _ in
            let passes = Atomic<Int>(0)
            let inNested = Atomic<Bool>(false)
            let observer = RunLoopObserver(activities: .beforeTimers) { _, _ in
                if inNested.load(ordering: .relaxed) { passes.add(1, ordering: .relaxed) }
            }
            loop.add(observer, forMode: .default)
            let ticks = Atomic<Int>(0)
            let tick = RunLoopTimer(after: .milliseconds(80), repeating: .milliseconds(80)) { _ in
                if inNested.load(ordering: .relaxed) { ticks.add(1, ordering: .relaxed) }
            }
            loop.add(tick, forMode: .default)
            let glibTicks = Atomic<Int>(0)
            addTimeout(40, to: context) {
                if inNested.load(ordering: .relaxed) { glibTicks.add(1, ordering: .relaxed) }
                return true
            }
            let performedAt = Atomic<Int64>(0)
            let ranAt = Atomic<Int64>(0)
            let shared = SendablePointer(pointer: context)
            let worker = Mutex<TestThread?>(nil)
            let nest = RunLoopTimer(after: .milliseconds(20)) { _ in
                let nested = g_main_loop_new(shared.pointer, 0)!
                let quit = UInt(bitPattern: nested)
                addTimeout(200, to: shared.pointer) {
                    g_main_loop_quit(OpaquePointer(bitPattern: quit))
                    return false
                }
                worker.locked {
                    $0 = TestThread(name: "glib-performer") {
                        usleep(110_000)
                        performedAt.store(RunLoop.clockNanoseconds, ordering: .relaxed)
                        loop.perform { ranAt.store(RunLoop.clockNanoseconds, ordering: .relaxed) }
                    }
                }
                inNested.store(true, ordering: .relaxed)
                g_main_loop_run(nested)
                inNested.store(false, ordering: .relaxed)
                g_main_loop_unref(nested)
                RunLoop.current.stop()
            }
            loop.add(nest, forMode: .default)
            loop.run(mode: .default, for: .seconds(5))
            _ = worker.locked { $0 }?.join(timeout: .seconds(5))
            observer.invalidate()
            tick.invalidate()
            let latency = Duration.nanoseconds(ranAt.load(ordering: .relaxed) - performedAt.load(ordering: .relaxed))
            return (passes.load(ordering: .relaxed), ticks.load(ordering: .relaxed), glibTicks.load(ordering: .relaxed), latency)
        }
        guard let (passes, ticks, glibTicks, latency) = result else { return }
        #expect(ticks >= 1 && ticks <= 3, "loop timer fires in the nested GLib loop: \(ticks)")
        #expect(glibTicks >= 3, "GLib timeouts in the nested GLib loop: \(glibTicks)")
        #expect(passes >= ticks + 1 && passes < 30, "loop passes run by the reverse source: \(passes)")
        #expect(latency > .zero && latency < (Sanitizers.any ? .milliseconds(40) : .milliseconds(10)), "the worker's block ran after \(latency)")
    }

    /// A GLib loop nested in a GLib callback (a dialog's loop): the loop's timers and descriptor
    /// sources of the current mode keep firing, and GLib's timeouts too; GLib logs no warning.
    @Test func nestedGLibLoopInAGLibCallback() async {
        let warningsBefore = GLibLog.warnings.count
        let result = await withBridgedLoop { loop, context, _ in
            let inNested = Atomic<Bool>(false)
            let loopTimerFires = Atomic<Int>(0)
            let descriptorFires = Atomic<Int>(0)
            let glibFires = Atomic<Int>(0)
            let timer = RunLoopTimer(after: .milliseconds(100), repeating: .milliseconds(100)) { _ in
                if inNested.load(ordering: .relaxed) { loopTimerFires.add(1, ordering: .relaxed) }
            }
            loop.add(timer, forMode: .default)
            let (readEnd, writeEnd) = makePipe()
            defer {
                close(readEnd)
                close(writeEnd)
            }
            let source = try! FileDescriptorSource(descriptor: readEnd) { _, _ in
                drain(readEnd)
                if inNested.load(ordering: .relaxed) { descriptorFires.add(1, ordering: .relaxed) }
            }
            loop.add(source, forMode: .default)
            addTimeout(40, to: context) {
                if inNested.load(ordering: .relaxed) { glibFires.add(1, ordering: .relaxed) }
                return true
            }
            let shared = SendablePointer(pointer: context)
            let writer = Mutex<TestThread?>(nil)
            addTimeout(30, to: context, name: "dialog") {
                let nested = g_main_loop_new(shared.pointer, 0)!
                let quit = UInt(bitPattern: nested)
                addTimeout(350, to: shared.pointer) {
                    g_main_loop_quit(OpaquePointer(bitPattern: quit))
                    return false
                }
                writer.locked {
                    $0 = TestThread(name: "glib-writer") {
                        usleep(150_000)
                        var byte: UInt8 = 1
                        _ = write(writeEnd, &byte, 1)
                    }
                }
                inNested.store(true, ordering: .relaxed)
                g_main_loop_run(nested)
                inNested.store(false, ordering: .relaxed)
                g_main_loop_unref(nested)
                RunLoop.current.stop()
                return false
            }
            loop.run(mode: .default, for: .seconds(5))
            _ = writer.locked { $0 }?.join(timeout: .seconds(5))
            timer.invalidate()
            source.invalidate()
            return (
                loopTimerFires.load(ordering: .relaxed), descriptorFires.load(ordering: .relaxed),
                glibFires.load(ordering: .relaxed)
            )
        }
        guard let (timerFires, descriptorFires, glibFires) = result else { return }
        #expect(timerFires >= 2 && timerFires <= 4, "loop timer fires in the nested GLib loop: \(timerFires)")
        #expect(descriptorFires == 1, "descriptor source fires in the nested GLib loop: \(descriptorFires)")
        #expect(glibFires >= 5, "GLib timeouts in the nested GLib loop: \(glibFires)")
        let warnings = Array(GLibLog.warnings.dropFirst(warningsBefore))
        #expect(warnings.isEmpty, "GLib logged: \(warnings)")
    }

    /// A run in `.tracking` nested in a GLib callback: GLib sources in the common modes go on
    /// (except the non-recursive one dispatching, which GLib blocks; a recursive one is dispatched
    /// again); a `.default` loop timer does not fire; the outer run resumes when it returns.
    @Test func nestedTrackingRunInAGLibCallback() async {
        let result = await withBridgedLoop { loop, context, _ in
            loop.addCommonMode(.tracking)
            let inTracking = Atomic<Bool>(false)
            let entered = Atomic<Bool>(false)
            let otherFires = Atomic<Int>(0)
            let blockedFires = Atomic<Int>(0)
            let recursiveFires = Atomic<Int>(0)
            let defaultTimerInTracking = Atomic<Int>(0)
            let defaultTimerAfter = Atomic<Int>(0)
            let recursiveEntered = Atomic<Bool>(false)
            let timer = RunLoopTimer(after: .milliseconds(50), repeating: .milliseconds(50)) { _ in
                if inTracking.load(ordering: .relaxed) {
                    defaultTimerInTracking.add(1, ordering: .relaxed)
                } else if entered.load(ordering: .relaxed) {
                    defaultTimerAfter.add(1, ordering: .relaxed)
                    if defaultTimerAfter.load(ordering: .relaxed) == 2 { RunLoop.current.stop() }
                }
            }
            loop.add(timer, forMode: .default)
            addTimeout(30, to: context) {
                if inTracking.load(ordering: .relaxed) { otherFires.add(1, ordering: .relaxed) }
                return true
            }
            // A recursive source: dispatched again inside its own nested run.
            addTimeout(20, to: context, canRecurse: true) {
                if inTracking.load(ordering: .relaxed) { recursiveFires.add(1, ordering: .relaxed) }
                return true
            }
            addTimeout(20, to: context, name: "tracking") {
                if inTracking.load(ordering: .relaxed) {
                    blockedFires.add(1, ordering: .relaxed)
                    return true
                }
                guard !entered.exchange(true, ordering: .relaxed) else { return true }
                inTracking.store(true, ordering: .relaxed)
                RunLoop.current.run(mode: .tracking, for: .milliseconds(300))
                inTracking.store(false, ordering: .relaxed)
                _ = recursiveEntered
                return true
            }
            let outcome = loop.run(mode: .default, for: .seconds(5))
            timer.invalidate()
            return (
                outcome, otherFires.load(ordering: .relaxed), blockedFires.load(ordering: .relaxed),
                recursiveFires.load(ordering: .relaxed), defaultTimerInTracking.load(ordering: .relaxed),
                defaultTimerAfter.load(ordering: .relaxed)
            )
        }
        guard let (outcome, other, blocked, recursive, defaultInTracking, defaultAfter) = result else { return }
        #expect(outcome == .stopped)
        #expect(other >= 5, "GLib timeouts in the tracking run: \(other)")
        #expect(blocked == 0, "the dispatching non-recursive source ran again: \(blocked)")
        #expect(recursive >= 5, "the recursive source in the tracking run: \(recursive)")
        #expect(defaultInTracking == 0, "the .default timer fired in .tracking: \(defaultInTracking)")
        #expect(defaultAfter == 2, "the outer run went on after the tracking run")
    }

    /// A mode outside the common modes pauses GLib: a GLib timeout does not fire there, and fires
    /// when the loop runs a common mode again.
    @Test func privateModePausesGLib() async {
        let result = await withBridgedLoop { loop, context, _ in
            let fires = Atomic<Int>(0)
            addTimeout(30, to: context) {
                fires.add(1, ordering: .relaxed)
                return true
            }
            let privateMode = RunLoop.Mode(rawValue: "glib.test.private")
            let keepAlive = RunLoopTimer(after: .seconds(100)) { _ in }
            loop.add(keepAlive, forMode: privateMode)
            loop.run(mode: privateMode, for: .milliseconds(200))
            let inPrivate = fires.load(ordering: .relaxed)
            loop.run(mode: .default, for: .milliseconds(100))
            keepAlive.invalidate()
            return (inPrivate, fires.load(ordering: .relaxed))
        }
        guard let (inPrivate, total) = result else { return }
        #expect(inPrivate == 0, "GLib fired \(inPrivate) times in a private mode")
        #expect(total >= 1, "GLib's timeout did not fire after the private run")
    }

    /// A HIGH idle that always continues starves a DEFAULT_IDLE idle (GLib's rule), but never a
    /// loop timer or the loop's blocks: each pass runs one GLib iteration.
    @Test func glibPrioritiesNeverStarveTheLoop() async {
        let result = await withBridgedLoop { loop, context, _ in
            let highRuns = Atomic<Int>(0)
            let lowRuns = Atomic<Int>(0)
            let timerFires = Atomic<Int>(0)
            let blocks = Atomic<Int>(0)
            addIdle(context, priority: G_PRIORITY_HIGH) {
                highRuns.add(1, ordering: .relaxed)
                return true
            }
            addIdle(context, priority: G_PRIORITY_DEFAULT_IDLE) {
                lowRuns.add(1, ordering: .relaxed)
                return true
            }
            let timer = RunLoopTimer(after: .milliseconds(20), repeating: .milliseconds(20)) { _ in
                timerFires.add(1, ordering: .relaxed)
            }
            loop.add(timer, forMode: .default)
            @Sendable func chain() {
                blocks.add(1, ordering: .relaxed)
                RunLoop.current.perform { chain() }
            }
            loop.perform { chain() }
            loop.run(mode: .default, for: .milliseconds(300))
            timer.invalidate()
            return (highRuns.load(ordering: .relaxed), lowRuns.load(ordering: .relaxed), timerFires.load(ordering: .relaxed), blocks.load(ordering: .relaxed))
        }
        guard let (high, low, fires, blocks) = result else { return }
        #expect(high > 100, "HIGH idle runs: \(high)")
        #expect(low == 0, "the DEFAULT_IDLE idle ran \(low) times beside an always-ready HIGH one")
        #expect(fires >= 8, "loop timer fires: \(fires)")
        #expect(blocks >= high / 2, "the loop's blocks: \(blocks), HIGH idle runs: \(high)")
    }
}
#endif
