import Foundation
import SharedTestSupport

// The differential scenarios. Each one is written once against `LoopDriver`
// (Support/CFHarness.swift) and run by DifferentialTests.swift on CFRunLoop and on RunLoopKit.
// A scenario runs on a fresh thread with a fresh loop, records what happened in a trace, and
// must be deterministic on CF: no real-time values in the trace, only facts (order of calls,
// results) and, where a clock matters, booleans against generous lower bounds.
// Times are seconds since the driver's creation; modes are strings (see `DiffMode`).

/// Mutable state shared between a scenario and its callbacks (all on the scenario thread
/// unless a helper thread is involved, which only reads/writes under the caller's ordering).
final class DiffRef<T>: @unchecked Sendable {
    var value: T
    init(_ value: T) { self.value = value }
}

typealias DiffScenario = @Sendable (any LoopDriver, DiffTrace) -> Void

enum DiffScenarios {
    // §3.1 an empty mode returns finished at once, without observer calls.
    static let emptyDefaultMode: DiffScenario = { loop, trace in
        loop.traceActivities(trace)
        trace("run: " + loop.run(DiffMode.default, 0.05))
        trace("run: " + loop.run(DiffMode.my, 0.05))
    }

    // §3.1 running in the common-modes placeholder returns finished, even with items in it.
    static let commonModesPlaceholder: DiffScenario = { loop, trace in
        loop.traceActivities(trace, DiffMode.common)
        let source = loop.makeSource(order: 0) { trace("source") }
        loop.add(source, DiffMode.common)
        source.signal()
        trace("run common: " + loop.run(DiffMode.common, 0.05))
        trace("run default: " + loop.run(DiffMode.default, 0, returnAfterSourceHandled: true))
    }

    // §3.1 observers do not make a mode non-empty.
    static let modeWithOnlyObserverIsEmpty: DiffScenario = { loop, trace in
        loop.traceActivities(trace, DiffMode.my)
        loop.traceActivities(trace, DiffMode.default)
        trace("run my: " + loop.run(DiffMode.my, 0.05))
        trace("run default: " + loop.run(DiffMode.default, 0.05))
    }

    // §3.2-3.5 order of one run: entry, beforeTimers, beforeSources, blocks, source0, blocks,
    // (no sleep after a handled source), ..., beforeWaiting, afterWaiting, timers, blocks, exit.
    static let fullIterationOrder: DiffScenario = { loop, trace in
        loop.traceActivities(trace)
        let source = loop.makeSource(order: 0) { trace("source0") }
        loop.add(source, DiffMode.default)
        source.signal()
        loop.perform { trace("block") }
        let timer = loop.makeTimer(fireAt: 0.2) { _ in
            trace("timer"); loop.stop()
        }
        loop.add(timer, DiffMode.default)
        trace("run: " + loop.run(DiffMode.default, 1.0))
    }

    // §3.3 timeout 0: no sleep, so no beforeWaiting/afterWaiting.
    static let timeoutZeroSkipsSleep: DiffScenario = { loop, trace in
        loop.traceActivities(trace)
        loop.keepAlive()
        trace("run: " + loop.run(DiffMode.default, 0))
    }

    // §3.3 a handled source means the next wait does not block: no sleep notifications.
    static let handledSourceSkipsSleep: DiffScenario = { loop, trace in
        loop.traceActivities(trace)
        let source = loop.makeSource(order: 0) { trace("source0") }
        loop.add(source, DiffMode.default)
        source.signal()
        let timer = loop.makeTimer(fireAt: 0.02) { _ in
            trace("timer"); loop.stop()
        }
        loop.add(timer, DiffMode.default)
        trace("run: " + loop.run(DiffMode.default, 1.0))
    }

    // Observers run by ascending order; equal orders keep insertion order.
    static let observersSortedByOrder: DiffScenario = { loop, trace in
        for (name, order) in [("o5", 5), ("oMinus1", -1), ("o2", 2), ("o0a", 0), ("o0b", 0), ("o2b", 2)] {
            let observer = loop.makeObserver(DiffActivity.entry | DiffActivity.exit, repeats: true, order: order) {
                _, activity in
                trace("\(name) \(DiffActivity.name(activity))")
            }
            loop.add(observer, DiffMode.default)
        }
        loop.keepAlive()
        trace("run: " + loop.run(DiffMode.default, 0))
    }

    // A non-repeating observer is invalidated right after its first call.
    static let nonRepeatingObserver: DiffScenario = { loop, trace in
        let observer = loop.makeObserver(DiffActivity.all, repeats: false, order: 0) { observer, activity in
            trace("once \(DiffActivity.name(activity)) valid=\(observer.isValid)")
        }
        loop.add(observer, DiffMode.default)
        loop.keepAlive()
        trace("run1: " + loop.run(DiffMode.default, 0))
        trace("valid after: \(observer.isValid)")
        trace("run2: " + loop.run(DiffMode.default, 0))
    }

    // An observer is not re-entered while it is running (nested run from its callback).
    static let observerNotReentered: DiffScenario = { loop, trace in
        let depth = DiffRef(0)
        let observer = loop.makeObserver(DiffActivity.entry | DiffActivity.exit, repeats: true, order: 0) {
            _, activity in
            trace("O \(DiffActivity.name(activity))")
            if activity == DiffActivity.entry && depth.value == 0 {
                depth.value += 1
                trace("nested: " + loop.run(DiffMode.default, 0))
                depth.value -= 1
            }
        }
        loop.add(observer, DiffMode.default)
        loop.traceActivities(trace, prefix: "P ", order: 1)
        loop.keepAlive()
        trace("run: " + loop.run(DiffMode.default, 0))
    }

    // §3.3 signalled Source0s are performed by ascending order.
    static let source0ByOrder: DiffScenario = { loop, trace in
        var all: [any DiffSource] = []
        for order in [3, 1, 2, -5] {
            let source = loop.makeSource(order: order) { trace("source order \(order)") }
            loop.add(source, DiffMode.default)
            all.append(source)
        }
        for source in all.reversed() { source.signal() }
        trace("run: " + loop.run(DiffMode.default, 0))
    }

    // signal() does not wake a sleeping loop: the source waits for the next pass.
    static let signalFromOtherThreadDoesNotWake: DiffScenario = { loop, trace in
        loop.traceActivities(trace)
        let source = loop.makeSource(order: 0) { trace("source0") }
        loop.add(source, DiffMode.default)
        let helper = loop.whenAsleep(trace: trace) { source.signal() }
        // The loop sleeps until the 150 ms timeout; the signal arrives while it sleeps.
        trace("run1: " + loop.run(DiffMode.default, 0.15))
        helper.join(timeout: .seconds(5))
        trace("run2: " + loop.run(DiffMode.default, 0, returnAfterSourceHandled: true))
    }

    static let signalInBeforeWaitingDoesNotWake: DiffScenario = { loop, trace in
        let source = loop.makeSource(order: 0) { trace("source0") }
        loop.add(source, DiffMode.default)
        let once = DiffRef(false)
        let observer = loop.makeObserver(DiffActivity.all, repeats: true, order: 0) { _, activity in
            trace(DiffActivity.name(activity))
            if activity == DiffActivity.beforeWaiting && !once.value {
                once.value = true; source.signal(); trace("signalled")
            }
        }
        loop.add(observer, DiffMode.default)
        trace("run1: " + loop.run(DiffMode.default, 0.1))
        trace("run2: " + loop.run(DiffMode.default, 0, returnAfterSourceHandled: true))
    }

    // signal() + wakeUp() from another thread: the sleeping loop wakes and performs the source.
    static let signalPlusWakeUpWakes: DiffScenario = { loop, trace in
        loop.traceActivities(trace)
        let source = loop.makeSource(order: 0) {
            trace("source0"); loop.stop()
        }
        loop.add(source, DiffMode.default)
        let helper = loop.whenAsleep(trace: trace) {
            source.signal(); loop.wakeUp()
        }
        trace("run: " + loop.run(DiffMode.default, 2.0))
        helper.join(timeout: .seconds(5))
    }

    // returnAfterSourceHandled with two signalled sources.
    static let returnAfterSourceHandledTwoSources: DiffScenario = { loop, trace in
        loop.traceActivities(trace)
        let a = loop.makeSource(order: 0) { trace("A") }
        let b = loop.makeSource(order: 1) { trace("B") }
        loop.add(a, DiffMode.default); loop.add(b, DiffMode.default)
        a.signal(); b.signal()
        trace("run1: " + loop.run(DiffMode.default, 1.0, returnAfterSourceHandled: true))
        trace("run2: " + loop.run(DiffMode.default, 1.0, returnAfterSourceHandled: true))
    }

    // A timer firing is not a handled source.
    static let returnAfterSourceHandledTimerNotHandled: DiffScenario = { loop, trace in
        loop.traceActivities(trace)
        let timer = loop.makeTimer(fireAt: 0.01) { _ in trace("timer") }
        loop.add(timer, DiffMode.default)
        loop.keepAlive()
        trace("run: " + loop.run(DiffMode.default, 0.1, returnAfterSourceHandled: true))
    }

    // A block is not a handled source.
    static let returnAfterSourceHandledBlockNotHandled: DiffScenario = { loop, trace in
        loop.traceActivities(trace)
        loop.keepAlive()
        loop.perform { trace("block") }
        trace("run: " + loop.run(DiffMode.default, 0.05, returnAfterSourceHandled: true))
    }

    // wakeUp() with nothing to do is not a handled source.
    static let returnAfterSourceHandledWakeUpNotHandled: DiffScenario = { loop, trace in
        loop.traceActivities(trace)
        loop.keepAlive()
        let helper = loop.whenAsleep(trace: trace) { loop.wakeUp() }
        trace("run: " + loop.run(DiffMode.default, 0.15, returnAfterSourceHandled: true))
        helper.join(timeout: .seconds(5))
    }

    // §3.4 handledSource is checked before the timeout.
    static let handledSourceBeatsTimeout: DiffScenario = { loop, trace in
        let source = loop.makeSource(order: 0) { trace("source0") }
        loop.add(source, DiffMode.default)
        source.signal()
        trace("run: " + loop.run(DiffMode.default, 0, returnAfterSourceHandled: true))
    }

    // §3.4 the timeout is checked before stop; the stop does not carry over into the next run.
    static let timeoutBeatsStop: DiffScenario = { loop, trace in
        loop.traceActivities(trace)
        let source = loop.makeSource(order: 0) {
            trace("source0 stops"); loop.stop()
        }
        loop.add(source, DiffMode.default)
        source.signal()
        trace("run1: " + loop.run(DiffMode.default, 0))
        trace("run2: " + loop.run(DiffMode.default, 0.05))
    }

    // Blocks run FIFO, only in the modes they were queued for.
    static let blocksFifoPerMode: DiffScenario = { loop, trace in
        loop.keepAlive(DiffMode.default)
        loop.keepAlive(DiffMode.my)
        loop.perform([DiffMode.default]) { trace("b1 default") }
        loop.perform([DiffMode.common]) { trace("b2 common") }
        loop.perform([DiffMode.my]) { trace("b3 my") }
        loop.perform([DiffMode.default]) { trace("b4 default") }
        loop.perform([DiffMode.my, DiffMode.default]) { trace("b5 my+default") }
        loop.perform([DiffMode.tracking]) { trace("b6 tracking") }
        trace("run default: " + loop.run(DiffMode.default, 0))
        trace("run my: " + loop.run(DiffMode.my, 0))
        trace("run default again: " + loop.run(DiffMode.default, 0))
    }

    // A pending block for a mode counts as work only if the mode exists.
    static let blockForUncreatedMode: DiffScenario = { loop, trace in
        loop.perform(["FreshMode"]) { trace("fresh block") }
        trace("run fresh: " + loop.run("FreshMode", 0.05))
        loop.perform([DiffMode.default]) { trace("default block") }
        trace("run default: " + loop.run(DiffMode.default, 0.05))
    }

    // A block queued by a block runs in the next pass, not the same one.
    static let blockFromBlockNextPass: DiffScenario = { loop, trace in
        loop.traceActivities(trace)
        loop.keepAlive()
        loop.perform {
            trace("b1")
            loop.perform {
                trace("b2 (queued by b1)"); loop.stop()
            }
        }
        trace("run: " + loop.run(DiffMode.default, 0.05))
    }

    // After a source is handled the blocks run again: a block queued by a block before the
    // sources runs after them in the same iteration.
    static let blockFromBlockAfterSources: DiffScenario = { loop, trace in
        loop.traceActivities(trace)
        let source = loop.makeSource(order: 0) { trace("source0") }
        loop.add(source, DiffMode.default)
        source.signal()
        loop.perform {
            trace("b1")
            loop.perform { trace("b2 (queued by b1)") }
        }
        trace("run: " + loop.run(DiffMode.default, 0, returnAfterSourceHandled: true))
    }

    // A block queued by a timer handler runs at the end of the same iteration.
    static let blockFromTimerSameIteration: DiffScenario = { loop, trace in
        loop.traceActivities(trace)
        let timer = loop.makeTimer(fireAt: 0.01) { _ in
            trace("timer")
            loop.perform {
                trace("block from timer"); loop.stop()
            }
        }
        loop.add(timer, DiffMode.default)
        loop.keepAlive()
        trace("run: " + loop.run(DiffMode.default, 1.0))
    }

    // CF: CFRunLoopPerformBlock does not wake a sleeping loop.
    static let performDoesNotWake: DiffScenario = { loop, trace in
        loop.traceActivities(trace)
        loop.keepAlive()
        let start = loop.now()
        let helper = loop.whenAsleep(trace: trace) {
            loop.perform { trace("block at>=timeout: \(loop.now() - start >= 0.145)") }
        }
        trace("run: " + loop.run(DiffMode.default, 0.15))
        helper.join(timeout: .seconds(5))
    }

    // A wakeUp() from another thread lands in the window where it is ignored (an afterWaiting
    // callout); in the next pass, before its sleep, another thread removes the mode's only
    // source. The two halves of a thread that empties a mode and wakes the loop to end the run,
    // when it loses the race with the loop's emptiness check.
    static let ignoredWakeUpThenEmptied: DiffScenario = { loop, trace in
        let source = loop.keepAlive()
        let passes = DiffRef(0)
        let observer = loop.makeObserver(DiffActivity.afterWaiting | DiffActivity.beforeTimers, repeats: true, order: 0) {
            _, activity in
            if activity == DiffActivity.afterWaiting && passes.value == 1 {
                trace("afterWaiting: another thread calls wakeUp()")
                TestThread(name: "diff-waker") { loop.wakeUp() }.join(timeout: .seconds(5))
            } else if activity == DiffActivity.beforeTimers {
                passes.value += 1
                if passes.value == 2 {
                    trace("beforeTimers: another thread removes the only source")
                    TestThread(name: "diff-remover") { loop.remove(source, DiffMode.default) }.join(timeout: .seconds(5))
                }
            }
        }
        loop.add(observer, DiffMode.default)
        let helper = loop.whenAsleep(trace: trace) { loop.wakeUp() }
        trace("run: " + loop.run(DiffMode.default, 0.3))
        helper.join(timeout: .seconds(5))
    }

    // stop() ends only the innermost run.
    static let stopInnermostOnly: DiffScenario = { loop, trace in
        let b = loop.makeSource(order: 0) {
            trace("B stops"); loop.stop()
        }
        loop.add(b, DiffMode.my)
        let a = loop.makeSource(order: 0) {
            trace("A in \(loop.currentMode ?? "nil")")
            b.signal()
            trace("nested: " + loop.run(DiffMode.my, 1.0))
            trace("A after nested in \(loop.currentMode ?? "nil")")
        }
        loop.add(a, DiffMode.default)
        a.signal()
        loop.traceActivities(trace, DiffMode.default, prefix: "default ")
        loop.traceActivities(trace, DiffMode.my, prefix: "my ")
        trace("outer: " + loop.run(DiffMode.default, 0.05))
    }

    // A stop while the loop is not running is dropped.
    static let stopWhileNotRunningDropped: DiffScenario = { loop, trace in
        loop.traceActivities(trace)
        loop.keepAlive()
        loop.stop()
        trace("run: " + loop.run(DiffMode.default, 0.05))
    }

    static let stopFromOtherThread: DiffScenario = { loop, trace in
        loop.traceActivities(trace)
        loop.keepAlive()
        let helper = loop.whenAsleep(trace: trace) { loop.stop() }
        trace("run: " + loop.run(DiffMode.default, 2.0))
        helper.join(timeout: .seconds(5))
    }

    // wakeUp() with nothing to do: the run goes on until its timeout.
    static let wakeUpNothingToDo: DiffScenario = { loop, trace in
        loop.traceActivities(trace)
        loop.keepAlive()
        let helper = loop.whenAsleep(trace: trace) { loop.wakeUp() }
        trace("run: " + loop.run(DiffMode.default, 0.15))
        helper.join(timeout: .seconds(5))
    }

    // Nested run in another mode; currentMode is the innermost and is restored.
    static let nestedRunCurrentMode: DiffScenario = { loop, trace in
        trace("before: \(loop.currentMode ?? "nil")")
        let inner = loop.makeSource(order: 0) { trace("inner source in \(loop.currentMode ?? "nil")") }
        loop.add(inner, DiffMode.tracking)
        let outer = loop.makeSource(order: 0) {
            trace("outer source in \(loop.currentMode ?? "nil")")
            inner.signal()
            trace("nested: " + loop.run(DiffMode.tracking, 1.0, returnAfterSourceHandled: true))
            trace("back in \(loop.currentMode ?? "nil")")
        }
        loop.add(outer, DiffMode.default)
        outer.signal()
        let observer = loop.makeObserver(DiffActivity.entry | DiffActivity.exit, repeats: true, order: 0) {
            _, activity in
            trace("observer \(DiffActivity.name(activity)) in \(loop.currentMode ?? "nil")")
        }
        loop.add(observer, DiffMode.common)
        loop.addCommonMode(DiffMode.tracking)
        trace("run: " + loop.run(DiffMode.default, 1.0, returnAfterSourceHandled: true))
        trace("after: \(loop.currentMode ?? "nil")")
    }

    // Adding a mode to the common modes adds every common item to it.
    static let commonModesFanOut: DiffScenario = { loop, trace in
        let source = loop.makeSource(order: 0) { trace("source0 in \(loop.currentMode ?? "nil")") }
        loop.add(source, DiffMode.common)
        let observer = loop.makeObserver(DiffActivity.entry | DiffActivity.exit, repeats: true, order: 0) {
            _, activity in trace("observer \(DiffActivity.name(activity))")
        }
        loop.add(observer, DiffMode.common)
        // Due 250 ms on: never during the two runs before the third (each returns at once), even
        // on a loaded machine or under a sanitizer, where a date a few milliseconds on made the
        // timer fire in the second run on one side only. It stops the third run.
        let timer = loop.makeTimer(fireAt: loop.now() + 0.25) { _ in
            trace("timer in \(loop.currentMode ?? "nil")")
            loop.stop()
        }
        loop.add(timer, DiffMode.common)
        trace("run tracking before: " + loop.run(DiffMode.tracking, 0.05))
        loop.addCommonMode(DiffMode.tracking)
        source.signal()
        trace("run tracking: " + loop.run(DiffMode.tracking, 1.0, returnAfterSourceHandled: true))
        trace("run tracking timer: " + loop.run(DiffMode.tracking, 5.0))
        source.signal()
        trace("run default: " + loop.run(DiffMode.default, 0, returnAfterSourceHandled: true))
    }

    // An item added to .common later reaches every existing common mode.
    static let commonItemAddedLater: DiffScenario = { loop, trace in
        loop.addCommonMode(DiffMode.my)
        loop.keepAlive(DiffMode.my)
        let source = loop.makeSource(order: 0) { trace("source0 in \(loop.currentMode ?? "nil")") }
        loop.add(source, DiffMode.common)
        source.signal()
        trace("run my: " + loop.run(DiffMode.my, 0, returnAfterSourceHandled: true))
        source.signal()
        trace("run tracking: " + loop.run(DiffMode.tracking, 0, returnAfterSourceHandled: true))
        source.signal()
        trace("run default: " + loop.run(DiffMode.default, 0, returnAfterSourceHandled: true))
    }

    // Blocks queued for .common run in every common mode (including one added later).
    static let commonBlocks: DiffScenario = { loop, trace in
        loop.keepAlive(DiffMode.tracking)
        loop.perform([DiffMode.common]) { trace("common block 1 in \(loop.currentMode ?? "nil")") }
        trace("run tracking (not common yet): " + loop.run(DiffMode.tracking, 0))
        loop.addCommonMode(DiffMode.tracking)
        trace("run tracking (common): " + loop.run(DiffMode.tracking, 0))
    }

    // A repeating timer keeps its phase and skips missed fire points.
    static let repeatingTimerSkipsMissed: DiffScenario = { loop, trace in
        // interval 100 ms, first fire at 100 ms; the first call blocks until 350 ms (point 2.5),
        // so fire points 200 and 300 ms are missed and the next fire is at point 3 (400 ms). The
        // call blocks until an instant, not for a duration, so a late first fire changes nothing;
        // the block's end may overshoot by up to 50 ms before point 4 becomes the next. Fire point
        // index = floor((now - first) / interval): robust to up to 100 ms of lateness.
        let first = 0.1, interval = 0.1
        let calls = DiffRef(0)
        let timer = loop.makeTimer(fireAt: first, interval: interval) { timer in
            let point = Int(((loop.now() - first) / interval).rounded(.down))
            calls.value += 1
            trace("fire #\(calls.value) at point \(point)")
            if calls.value == 1 { while loop.now() < first + 2.5 * interval { usleep(1_000) } }
            if calls.value == 2 { timer.invalidate() }
        }
        loop.add(timer, DiffMode.default)
        trace("run: " + loop.run(DiffMode.default, 1.0))
    }

    // A fire date set inside the handler of a repeating timer is kept.
    static let setFireDateInHandlerRepeating: DiffScenario = { loop, trace in
        let calls = DiffRef(0)
        let timer = loop.makeTimer(fireAt: 0.01, interval: 10) { timer in
            calls.value += 1
            trace("fire #\(calls.value)")
            if calls.value == 1 { timer.setFireDate(loop.now() + 0.03) }  // instead of the next interval (10 s)
            if calls.value == 2 { trace("valid: \(timer.isValid)"); timer.invalidate() }
        }
        loop.add(timer, DiffMode.default)
        trace("run: " + loop.run(DiffMode.default, 1.0))
    }

    static let setFireDateInHandlerOneShot: DiffScenario = { loop, trace in
        let calls = DiffRef(0)
        let timer = loop.makeTimer(fireAt: 0.01) { timer in
            calls.value += 1
            trace("fire #\(calls.value)")
            if calls.value == 1 { timer.setFireDate(loop.now() + 0.03) }
        }
        loop.add(timer, DiffMode.default)
        loop.keepAlive()
        trace("run: " + loop.run(DiffMode.default, 0.15))
        trace("valid after: \(timer.isValid)")
    }

    // Two timers with the same fire date.
    static let equalFireDates: DiffScenario = { loop, trace in
        for name in ["A", "B", "C"] {
            let timer = loop.makeTimer(fireAt: 0.02) { _ in trace("timer \(name)") }
            loop.add(timer, DiffMode.default)
        }
        trace("run: " + loop.run(DiffMode.default, 1.0))
    }

    // Due timers fire by ascending fire date, whatever the insertion order.
    static let timersByFireDate: DiffScenario = { loop, trace in
        // Dates 20 ms apart from one base, so that the order of their dates, not of their making,
        // decides (with 1 ms apart, a slow make under a sanitizer clamped a date passed meanwhile
        // to "now" on one side only).
        let base = loop.now() + 0.05
        for (name, at) in [("t3", base + 0.04), ("t1", base), ("t2", base + 0.02)] {
            let timer = loop.makeTimer(fireAt: at) { _ in trace("timer \(name)") }
            loop.add(timer, DiffMode.default)
        }
        usleep(150_000)  // all three are due before the run starts
        loop.traceActivities(trace)
        trace("run: " + loop.run(DiffMode.default, 1.0))
    }

    // Invalidating a source from its own perform and from another perform in the same pass.
    static let invalidateSources: DiffScenario = { loop, trace in
        let cRef = DiffRef<(any DiffSource)?>(nil)
        let aRef = DiffRef<(any DiffSource)?>(nil)
        let a = loop.makeSource(order: 0) {
            trace("A invalidates itself"); aRef.value?.invalidate()
        }
        aRef.value = a
        let b = loop.makeSource(order: 1) {
            trace("B invalidates C"); cRef.value?.invalidate()
        }
        let c = loop.makeSource(order: 2) { trace("C") }
        cRef.value = c
        let e = loop.makeSource(order: 3) { trace("E") }
        for source in [a, b, c, e] { loop.add(source, DiffMode.default); source.signal() }
        trace("run1: " + loop.run(DiffMode.default, 0))
        trace("valid: a=\(a.isValid) b=\(b.isValid) c=\(c.isValid)")
        a.signal(); c.signal(); b.signal()
        trace("run2: " + loop.run(DiffMode.default, 0))
    }

    // Removing (not invalidating) a signalled source from another perform in the same pass.
    static let removeSourceSamePass: DiffScenario = { loop, trace in
        let cRef = DiffRef<(any DiffSource)?>(nil)
        let b = loop.makeSource(order: 1) {
            trace("B removes C"); if let c = cRef.value { loop.remove(c, DiffMode.default) }
        }
        let c = loop.makeSource(order: 2) { trace("C") }
        cRef.value = c
        loop.keepAlive()
        for source in [b, c] { loop.add(source, DiffMode.default); source.signal() }
        trace("run1: " + loop.run(DiffMode.default, 0))
        trace("run2: " + loop.run(DiffMode.default, 0))
        loop.add(c, DiffMode.default)
        trace("run3 (C re-added, still signalled?): " + loop.run(DiffMode.default, 0))
    }

    // Invalidating observers from their own callback and another one in the same pass.
    static let invalidateObservers: DiffScenario = { loop, trace in
        let yRef = DiffRef<(any DiffObserver)?>(nil)
        let x = loop.makeObserver(DiffActivity.beforeTimers, repeats: true, order: 0) { observer, _ in
            trace("X invalidates itself and Y"); observer.invalidate(); yRef.value?.invalidate()
        }
        let y = loop.makeObserver(DiffActivity.beforeTimers, repeats: true, order: 1) { _, _ in trace("Y") }
        yRef.value = y
        let z = loop.makeObserver(DiffActivity.beforeTimers | DiffActivity.exit, repeats: true, order: 2) {
            _, activity in trace("Z \(DiffActivity.name(activity))")
        }
        for observer in [x, y, z] { loop.add(observer, DiffMode.default) }
        loop.keepAlive()
        trace("run1: " + loop.run(DiffMode.default, 0))
        trace("run2: " + loop.run(DiffMode.default, 0))
    }

    static let removeObserverSamePass: DiffScenario = { loop, trace in
        let yRef = DiffRef<(any DiffObserver)?>(nil)
        let x = loop.makeObserver(DiffActivity.beforeTimers, repeats: true, order: 0) { _, _ in
            trace("X removes Y"); if let y = yRef.value { loop.remove(y, DiffMode.default) }
        }
        let y = loop.makeObserver(DiffActivity.beforeTimers, repeats: true, order: 1) { _, _ in trace("Y") }
        yRef.value = y
        for observer in [x, y] { loop.add(observer, DiffMode.default) }
        loop.keepAlive()
        trace("run1: " + loop.run(DiffMode.default, 0))
        trace("run2: " + loop.run(DiffMode.default, 0))
    }

    // Invalidating timers from their own handler and from another handler in the same pass.
    static let invalidateTimers: DiffScenario = { loop, trace in
        let bRef = DiffRef<(any DiffTimer)?>(nil)
        let a = loop.makeTimer(fireAt: 0.001, interval: 0.01) { timer in
            trace("A invalidates itself and B"); timer.invalidate(); bRef.value?.invalidate()
        }
        let b = loop.makeTimer(fireAt: 0.002, interval: 0.01) { _ in trace("B") }
        bRef.value = b
        let c = loop.makeTimer(fireAt: 0.003) { _ in trace("C") }
        for timer in [a, b, c] { loop.add(timer, DiffMode.default) }
        usleep(10_000)
        trace("run: " + loop.run(DiffMode.default, 0.05))
    }

    static let removeTimerSamePass: DiffScenario = { loop, trace in
        let bRef = DiffRef<(any DiffTimer)?>(nil)
        let a = loop.makeTimer(fireAt: 0.001) { _ in
            trace("A removes B"); if let b = bRef.value { loop.remove(b, DiffMode.default) }
        }
        let b = loop.makeTimer(fireAt: 0.002) { _ in trace("B") }
        bRef.value = b
        for timer in [a, b] { loop.add(timer, DiffMode.default) }
        usleep(10_000)
        loop.keepAlive()
        trace("run: " + loop.run(DiffMode.default, 0.05))
        trace("B valid: \(b.isValid)")
    }

    // A one-shot timer that was the only item: after it fires the mode is empty → finished.
    static let oneShotTimerOnlyItem: DiffScenario = { loop, trace in
        loop.traceActivities(trace)
        let timer = loop.makeTimer(fireAt: 0.01) { _ in trace("timer") }
        loop.add(timer, DiffMode.default)
        trace("run: " + loop.run(DiffMode.default, 1.0))
    }

    static let sourceRemovesItselfLastItem: DiffScenario = { loop, trace in
        loop.traceActivities(trace)
        let ref = DiffRef<(any DiffSource)?>(nil)
        let source = loop.makeSource(order: 0) {
            trace("source removes itself"); if let source = ref.value { loop.remove(source, DiffMode.default) }
        }
        ref.value = source
        loop.add(source, DiffMode.default)
        source.signal()
        trace("run: " + loop.run(DiffMode.default, 1.0))
    }

    static let timerInOtherModeDoesNotFire: DiffScenario = { loop, trace in
        let timer = loop.makeTimer(fireAt: 0.001) { _ in trace("timer in \(loop.currentMode ?? "nil")") }
        loop.add(timer, DiffMode.my)
        loop.keepAlive()
        usleep(5_000)
        trace("run default: " + loop.run(DiffMode.default, 0.03))
        trace("run my: " + loop.run(DiffMode.my, 0.03))
    }

    // Tolerance: CF Linux ignores it; RunLoopKit uses it to share wakeups (deviation 2).
    // A is due at 20 ms with 100 ms of tolerance, B at 60 ms with none. "late" means A ran at
    // least 30 ms after its fire date, i.e. in B's wakeup (CF runs it at ~20 ms).
    static let tolerance: DiffScenario = { loop, trace in
        loop.traceActivities(trace)
        let a = loop.makeTimer(fireAt: 0.02, tolerance: 0.1) { _ in trace("A late=\(loop.now() >= 0.05)") }
        let b = loop.makeTimer(fireAt: 0.06) { _ in
            trace("B"); loop.stop()
        }
        loop.add(a, DiffMode.default); loop.add(b, DiffMode.default)
        trace("run: " + loop.run(DiffMode.default, 1.0))
    }

    static let wakeUpWhileNotRunningDropped: DiffScenario = { loop, trace in
        loop.traceActivities(trace)
        loop.keepAlive()
        loop.wakeUp()
        trace("run: " + loop.run(DiffMode.default, 0.05))
    }

    static let runUntilStopped: DiffScenario = { loop, trace in
        loop.traceActivities(trace)
        let calls = DiffRef(0)
        let timer = loop.makeTimer(fireAt: 0.01, interval: 0.01) { _ in
            calls.value += 1
            trace("timer #\(calls.value)")
            if calls.value == 2 { loop.stop() }
        }
        loop.add(timer, DiffMode.default)
        loop.runUntilStoppedOrFinished()
        trace("returned")
    }

    static let runUntilFinished: DiffScenario = { loop, trace in
        loop.traceActivities(trace)
        let timer = loop.makeTimer(fireAt: 0.01) { _ in trace("timer") }
        loop.add(timer, DiffMode.default)
        loop.runUntilStoppedOrFinished()
        trace("returned")
    }

    // The classic UIScrollView case: a default-mode timer waits during a tracking-mode run,
    // a common-mode timer fires in it.
    static let trackingModeTimers: DiffScenario = { loop, trace in
        loop.addCommonMode(DiffMode.tracking)
        let defaultTimer = loop.makeTimer(fireAt: 0.01) { _ in trace("default timer in \(loop.currentMode ?? "nil")") }
        loop.add(defaultTimer, DiffMode.default)
        let commonTimer = loop.makeTimer(fireAt: 0.01) { _ in trace("common timer in \(loop.currentMode ?? "nil")") }
        loop.add(commonTimer, DiffMode.common)
        loop.keepAlive(DiffMode.tracking)
        let source = loop.makeSource(order: 0) {
            trace("nested tracking: " + loop.run(DiffMode.tracking, 0.05))
        }
        loop.add(source, DiffMode.default)
        source.signal()
        trace("run default: " + loop.run(DiffMode.default, 0.05))
    }

    // stop() from a beforeWaiting observer.
    static let stopInBeforeWaiting: DiffScenario = { loop, trace in
        loop.keepAlive()
        let observer = loop.makeObserver(DiffActivity.all, repeats: true, order: 0) { _, activity in
            trace(DiffActivity.name(activity))
            if activity == DiffActivity.beforeWaiting { loop.stop() }
        }
        loop.add(observer, DiffMode.default)
        let start = loop.now()
        trace("run: " + loop.run(DiffMode.default, 0.15))
        trace("returned before timeout: \(loop.now() - start < 0.14)")
    }

    // wakeUp() from a beforeWaiting observer.
    static let wakeUpInBeforeWaiting: DiffScenario = { loop, trace in
        loop.keepAlive()
        let once = DiffRef(false)
        let observer = loop.makeObserver(DiffActivity.all, repeats: true, order: 0) { _, activity in
            trace(DiffActivity.name(activity))
            if activity == DiffActivity.beforeWaiting && !once.value { once.value = true; loop.wakeUp() }
        }
        loop.add(observer, DiffMode.default)
        trace("run: " + loop.run(DiffMode.default, 0.15))
    }

    // A timer is not re-entered while its handler runs a nested run.
    static let timerNotReentered: DiffScenario = { loop, trace in
        let calls = DiffRef(0)
        let a = loop.makeTimer(fireAt: 0.001, interval: 0.01) { timer in
            calls.value += 1
            trace("A #\(calls.value)")
            if calls.value == 1 {
                trace("nested: " + loop.run(DiffMode.default, 0.05))
                timer.invalidate()
            }
        }
        loop.add(a, DiffMode.default)
        let b = loop.makeTimer(fireAt: 0.02) { _ in trace("B") }
        loop.add(b, DiffMode.default)
        trace("run: " + loop.run(DiffMode.default, 0.1))
    }

    // A source that signals itself runs again in the next iteration, not the same pass.
    static let sourceResignalsItself: DiffScenario = { loop, trace in
        loop.traceActivities(trace)
        let calls = DiffRef(0)
        let ref = DiffRef<(any DiffSource)?>(nil)
        let source = loop.makeSource(order: 0) {
            calls.value += 1
            trace("source #\(calls.value)")
            if calls.value == 1 { ref.value?.signal() } else { loop.stop() }
        }
        ref.value = source
        loop.add(source, DiffMode.default)
        source.signal()
        trace("run: " + loop.run(DiffMode.default, 1.0))
    }

    // A source signalled from a beforeSources observer is performed in the same iteration.
    static let signalInBeforeSources: DiffScenario = { loop, trace in
        let source = loop.makeSource(order: 0) { trace("source0") }
        loop.add(source, DiffMode.default)
        let once = DiffRef(false)
        let observer = loop.makeObserver(DiffActivity.all, repeats: true, order: 0) { _, activity in
            trace(DiffActivity.name(activity))
            if activity == DiffActivity.beforeSources && !once.value { once.value = true; source.signal() }
        }
        loop.add(observer, DiffMode.default)
        trace("run: " + loop.run(DiffMode.default, 0, returnAfterSourceHandled: true))
    }

    // A default-mode block queued during a nested tracking run waits for the outer run.
    static let blockForOuterModeWaitsForNested: DiffScenario = { loop, trace in
        loop.keepAlive(DiffMode.tracking)
        let source = loop.makeSource(order: 0) {
            loop.perform([DiffMode.default]) { trace("default block in \(loop.currentMode ?? "nil")") }
            loop.perform([DiffMode.tracking]) { trace("tracking block in \(loop.currentMode ?? "nil")") }
            trace("nested: " + loop.run(DiffMode.tracking, 0))
            trace("nested returned")
        }
        loop.add(source, DiffMode.default)
        source.signal()
        trace("run: " + loop.run(DiffMode.default, 0))
    }

    // One observer added to two modes is called once per activity of the running mode.
    static let observerInTwoModes: DiffScenario = { loop, trace in
        let observer = loop.makeObserver(DiffActivity.entry | DiffActivity.exit, repeats: true, order: 0) {
            _, activity in
            trace("observer \(DiffActivity.name(activity)) in \(loop.currentMode ?? "nil")")
        }
        loop.add(observer, DiffMode.default)
        loop.add(observer, DiffMode.tracking)
        loop.keepAlive(DiffMode.default)
        loop.keepAlive(DiffMode.tracking)
        trace("run default: " + loop.run(DiffMode.default, 0))
        trace("run tracking: " + loop.run(DiffMode.tracking, 0))
        loop.remove(observer, DiffMode.default)
        trace("run default: " + loop.run(DiffMode.default, 0))
        trace("run tracking: " + loop.run(DiffMode.tracking, 0))
    }

    // NSRunLoop run(mode:before:): false at once for an empty mode; otherwise one run that
    // returns after the first handled source (true).
    static let runModeBeforeDate: DiffScenario = { loop, trace in
        loop.traceActivities(trace)
        trace("empty: \(loop.runBefore(DiffMode.default, 0.05))")
        let a = loop.makeSource(order: 0) { trace("A") }
        let b = loop.makeSource(order: 1) { trace("B") }
        loop.add(a, DiffMode.default); loop.add(b, DiffMode.default)
        a.signal(); b.signal()
        trace("with sources: \(loop.runBefore(DiffMode.default, 0.05))")
        // Due 30 ms on (not at a fixed date, which a slow side reaches before its run starts): the
        // run sleeps, fires it, and sleeps to its end on both sides.
        let timer = loop.makeTimer(fireAt: loop.now() + 0.03) { _ in trace("timer") }
        loop.add(timer, DiffMode.default)
        trace("with timer: \(loop.runBefore(DiffMode.default, 0.1))")
    }

    // NSRunLoop run(until:): a stop() ends one pass only; the passes go on until the date.
    static let runUntilDate: DiffScenario = { loop, trace in
        loop.traceActivities(trace)
        let source = loop.makeSource(order: 0) {
            trace("source stops"); loop.stop()
        }
        loop.add(source, DiffMode.default)
        source.signal()
        let start = loop.now()
        let timer = loop.makeTimer(fireAt: start + 0.02) { _ in trace("timer") }
        loop.add(timer, DiffMode.default)
        loop.keepAlive()
        loop.runUntil(0.08)
        trace("returned after the date: \(loop.now() - start >= 0.075)")
    }

    static let runUntilDateEmpty: DiffScenario = { loop, trace in
        loop.traceActivities(trace)
        let start = loop.now()
        loop.runUntil(0.05)
        trace("returned at once: \(loop.now() - start < 0.04)")
    }

    // Modes are created on demand and never removed.
    static let modesCreatedOnDemand: DiffScenario = { loop, trace in
        trace("fresh: \(loop.allModes)")
        let timer = loop.makeTimer(fireAt: 3600) { _ in }
        loop.add(timer, DiffMode.my)
        trace("after adding a timer to MyMode: \(loop.allModes)")
        loop.remove(timer, DiffMode.my)
        trace("after removing it: \(loop.allModes)")
        loop.perform(["BlockMode"]) {}
        trace("after queueing a block for BlockMode: \(loop.allModes)")
        _ = loop.run("RunOnlyMode", 0)
        trace("after running RunOnlyMode: \(loop.allModes)")
    }

    // wakeUp() from a source's perform, while the loop is busy (not about to sleep).
    static let wakeUpWhileBusy: DiffScenario = { loop, trace in
        loop.traceActivities(trace)
        let source = loop.makeSource(order: 0) {
            trace("source wakes the loop"); loop.wakeUp()
        }
        loop.add(source, DiffMode.default)
        source.signal()
        trace("run: " + loop.run(DiffMode.default, 0.1))
    }

    // CF: addCommonMode creates the mode only when .common holds items to copy into it.
    static let addCommonModeWithoutCommonItems: DiffScenario = { loop, trace in
        loop.addCommonMode(DiffMode.tracking)
        trace("after addCommonMode(tracking): \(loop.allModes)")
        loop.keepAlive(DiffMode.common)
        loop.addCommonMode(DiffMode.my)
        trace("after a common item and addCommonMode(MyMode): \(loop.allModes)")
    }

    // A timer added from a callback during a run: the loop sleeps until it is due.
    static let timerAddedFromCallback: DiffScenario = { loop, trace in
        loop.traceActivities(trace)
        let source = loop.makeSource(order: 0) {
            trace("source adds a timer")
            let timer = loop.makeTimer(fireAt: loop.now() + 0.01) { _ in
                trace("timer"); loop.stop()
            }
            loop.add(timer, DiffMode.default)
        }
        loop.add(source, DiffMode.default)
        source.signal()
        trace("run: " + loop.run(DiffMode.default, 1.0))
    }

    // A timer belongs to at most one loop: adding it to a second loop does nothing.
    static let timerBelongsToOneLoop: DiffScenario = { loop, trace in
        let timer = loop.makeTimer(fireAt: 0.01) { _ in trace("timer fired") }
        let added = DispatchSemaphore(value: 0)
        let done = DispatchSemaphore(value: 0)
        let helper = TestThread(name: "diff-helper") {
            let other = loop.sibling()  // the helper thread's own loop, never run
            other.add(timer, DiffMode.default)
            added.signal()
            _ = done.wait(timeout: .now() + 5)
        }
        _ = added.wait(timeout: .now() + 5)
        loop.add(timer, DiffMode.default)  // ignored
        trace("run: " + loop.run(DiffMode.default, 0.05))
        trace("valid: \(timer.isValid)")
        done.signal()
        helper.join(timeout: .seconds(5))
    }

    // NSRunLoop acceptInput(forMode:before:): one run that returns after a handled source.
    static let acceptInputOnce: DiffScenario = { loop, trace in
        loop.traceActivities(trace)
        let a = loop.makeSource(order: 0) { trace("A") }
        let b = loop.makeSource(order: 1) { trace("B") }
        loop.add(a, DiffMode.default); loop.add(b, DiffMode.default)
        a.signal(); b.signal()
        loop.acceptInput(DiffMode.default, 0.05)
        trace("returned")
        loop.acceptInput(DiffMode.my, 0.05)  // empty mode: returns at once
        trace("returned from empty mode")
    }

    // nextTimerFireDate(forMode:): the earliest valid timer of the mode, nil if none.
    // Dates are printed rounded to 10 ms (they are whole multiples of 100 ms from the epoch).
    static let nextTimerFireDate: DiffScenario = { loop, trace in
        func show(_ label: String, _ mode: String) {
            trace("\(label): " + (loop.nextTimerFireDate(mode).map { String(format: "%.2f", $0) } ?? "nil"))
        }
        show("empty default", DiffMode.default)
        let late = loop.makeTimer(fireAt: 0.5) { _ in }
        let early = loop.makeTimer(fireAt: 0.3) { _ in }
        loop.add(late, DiffMode.my); loop.add(early, DiffMode.my)
        show("my", DiffMode.my)
        show("default", DiffMode.default)
        early.invalidate()
        show("my after invalidating the earliest", DiffMode.my)
        let common = loop.makeTimer(fireAt: 0.2) { _ in }
        loop.add(common, DiffMode.common)
        loop.addCommonMode(DiffMode.tracking)
        show("tracking (common)", DiffMode.tracking)
        show("default (common)", DiffMode.default)
        late.setFireDate(0.1)
        show("my after moving the other", DiffMode.my)
    }

    // A signalled source invalidated before the run is not performed.
    static let invalidatedSignalledSource: DiffScenario = { loop, trace in
        let source = loop.makeSource(order: 0) { trace("source0") }
        loop.add(source, DiffMode.default)
        source.signal()
        source.invalidate()
        loop.keepAlive()
        trace("run: " + loop.run(DiffMode.default, 0, returnAfterSourceHandled: true))
    }

    // An observer added by another observer during a pass is not called for that activity, but
    // is for the next one.
    static let observerAddedDuringPass: DiffScenario = { loop, trace in
        let added = DiffRef(false)
        let x = loop.makeObserver(DiffActivity.beforeTimers, repeats: true, order: 0) { _, _ in
            trace("X beforeTimers")
            if !added.value {
                added.value = true
                let y = loop.makeObserver(
                    DiffActivity.beforeTimers | DiffActivity.beforeSources, repeats: true, order: 1
                ) { _, activity in
                    trace("Y \(DiffActivity.name(activity))")
                }
                loop.add(y, DiffMode.default)
            }
        }
        loop.add(x, DiffMode.default)
        loop.keepAlive()
        trace("run: " + loop.run(DiffMode.default, 0))
    }

    // A source added and signalled by another source's perform runs in the next iteration.
    static let sourceAddedDuringPass: DiffScenario = { loop, trace in
        loop.traceActivities(trace)
        let a = loop.makeSource(order: 0) {
            trace("A adds and signals B")
            let b = loop.makeSource(order: 1) {
                trace("B"); loop.stop()
            }
            loop.add(b, DiffMode.default)
            b.signal()
        }
        loop.add(a, DiffMode.default)
        a.signal()
        trace("run: " + loop.run(DiffMode.default, 1.0))
    }

    // A timer added by a timer handler with a fire date already past fires in the next pass.
    static let dueTimerAddedByTimer: DiffScenario = { loop, trace in
        loop.traceActivities(trace)
        let a = loop.makeTimer(fireAt: 0.005) { _ in
            trace("A adds an overdue timer")
            let b = loop.makeTimer(fireAt: 0) { _ in
                trace("B"); loop.stop()
            }
            loop.add(b, DiffMode.default)
        }
        loop.add(a, DiffMode.default)
        trace("run: " + loop.run(DiffMode.default, 1.0))
    }

    // Moving a timer's fire date earlier from another thread wakes the sleeping loop.
    static let setFireDateFromOtherThread: DiffScenario = { loop, trace in
        loop.traceActivities(trace)
        let timer = loop.makeTimer(fireAt: 3600) { _ in
            trace("timer"); loop.stop()
        }
        loop.add(timer, DiffMode.default)
        let helper = loop.whenAsleep(trace: trace) {
            timer.setFireDate(loop.now())
        }
        trace("run: " + loop.run(DiffMode.default, 2.0))
        helper.join(timeout: .seconds(5))
    }

    // A timer added from another thread while the loop sleeps fires at its date.
    static let timerAddedFromOtherThread: DiffScenario = { loop, trace in
        loop.traceActivities(trace)
        loop.keepAlive()
        let helper = loop.whenAsleep(trace: trace) {
            let timer = loop.makeTimer(fireAt: loop.now() + 0.01) { _ in
                trace("timer"); loop.stop()
            }
            loop.add(timer, DiffMode.default)
        }
        trace("run: " + loop.run(DiffMode.default, 2.0))
        helper.join(timeout: .seconds(5))
    }

    // A source added from another thread while the loop sleeps, then signalled and woken.
    static let sourceAddedFromOtherThread: DiffScenario = { loop, trace in
        loop.traceActivities(trace)
        loop.keepAlive()
        let helper = loop.whenAsleep(trace: trace) {
            let source = loop.makeSource(order: 0) {
                trace("source0"); loop.stop()
            }
            loop.add(source, DiffMode.default)
            source.signal()
            loop.wakeUp()
        }
        trace("run: " + loop.run(DiffMode.default, 2.0))
        helper.join(timeout: .seconds(5))
    }

    // A negative timeout counts as zero.
    static let negativeTimeout: DiffScenario = { loop, trace in
        loop.traceActivities(trace)
        loop.keepAlive()
        trace("run: " + loop.run(DiffMode.default, -1))
    }

    // A source is not protected against re-entry: re-signalled from its own perform, it is
    // performed again by a nested run started in that perform.
    static let sourceReenteredInNestedRun: DiffScenario = { loop, trace in
        let depth = DiffRef(0)
        let ref = DiffRef<(any DiffSource)?>(nil)
        let source = loop.makeSource(order: 0) {
            trace("source at depth \(depth.value)")
            if depth.value == 0 {
                depth.value += 1
                ref.value?.signal()
                trace("nested: " + loop.run(DiffMode.default, 0.05, returnAfterSourceHandled: true))
                depth.value -= 1
            }
        }
        ref.value = source
        loop.add(source, DiffMode.default)
        source.signal()
        trace("run: " + loop.run(DiffMode.default, 0.05, returnAfterSourceHandled: true))
    }

    // The only item (a timer) is invalidated from another thread while the loop sleeps.
    static let lastItemInvalidatedFromOtherThread: DiffScenario = { loop, trace in
        loop.traceActivities(trace)
        let timer = loop.makeTimer(fireAt: 3600) { _ in trace("timer") }
        loop.add(timer, DiffMode.default)
        let helper = loop.whenAsleep(trace: trace) { timer.invalidate() }
        trace("run: " + loop.run(DiffMode.default, 0.15))
        helper.join(timeout: .seconds(5))
    }

    // The only item (a source) is removed from another thread while the loop sleeps.
    static let lastSourceRemovedFromOtherThread: DiffScenario = { loop, trace in
        loop.traceActivities(trace)
        let source = loop.makeSource(order: 0) { trace("source0") }
        loop.add(source, DiffMode.default)
        let helper = loop.whenAsleep(trace: trace) {
            loop.remove(source, DiffMode.default)
        }
        trace("run: " + loop.run(DiffMode.default, 0.15))
        helper.join(timeout: .seconds(5))
    }

    // Adding invalidated items does nothing: the mode stays empty.
    static let addingInvalidatedItems: DiffScenario = { loop, trace in
        let source = loop.makeSource(order: 0) { trace("source0") }
        source.invalidate()
        loop.add(source, DiffMode.default)
        let timer = loop.makeTimer(fireAt: 0) { _ in trace("timer") }
        timer.invalidate()
        loop.add(timer, DiffMode.default)
        let observer = loop.makeObserver(DiffActivity.all, repeats: true, order: 0) { _, activity in
            trace("observer \(DiffActivity.name(activity))")
        }
        observer.invalidate()
        loop.add(observer, DiffMode.default)
        trace("run: " + loop.run(DiffMode.default, 0.05))
    }

    // A one-shot timer in two modes fires once, in whichever mode runs when it is due.
    static let timerInTwoModesFiresOnce: DiffScenario = { loop, trace in
        let timer = loop.makeTimer(fireAt: 0.01) { _ in trace("timer in \(loop.currentMode ?? "nil")") }
        loop.add(timer, DiffMode.default)
        loop.add(timer, DiffMode.tracking)
        let source = loop.makeSource(order: 0) {
            trace("nested tracking: " + loop.run(DiffMode.tracking, 0.05))
        }
        loop.add(source, DiffMode.default)
        source.signal()
        trace("run default: " + loop.run(DiffMode.default, 0.05))
        trace("valid: \(timer.isValid)")
    }
}
