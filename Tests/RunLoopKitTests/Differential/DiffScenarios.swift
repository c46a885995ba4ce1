import Foundation

// The differential scenarios. Each one is written once against `LoopDriver`
// (Support/CFHarness.swift) and run by DifferentialTests.swift on CFRunLoop and on RunLoopKit.
// A scenario runs on a fresh thread with a fresh loop, records what happened in a trace, and
// must be deterministic on CF: no real-time values in the trace, only facts (order of calls,
// results) and, where a clock matters, booleans against generous lower bounds.
// Times are seconds since the driver's creation; modes are strings (see `DMode`).

/// Mutable state shared between a scenario and its callbacks (all on the scenario thread
/// unless a helper thread is involved, which only reads/writes under the caller's ordering).
final class DiffRef<T>: @unchecked Sendable {
    var v: T
    init(_ v: T) { self.v = v }
}

typealias DiffScenario = @Sendable (any LoopDriver, DiffTrace) -> Void

enum DiffScenarios {
    // §3.1 an empty mode returns finished at once, without observer calls.
    static let emptyDefaultMode: DiffScenario = { d, t in
        d.traceActivities(t)
        t("run: " + d.run(DMode.default, 0.05))
        t("run: " + d.run(DMode.my, 0.05))
    }

    // §3.1 running in the common-modes placeholder returns finished, even with items in it.
    static let commonModesPlaceholder: DiffScenario = { d, t in
        d.traceActivities(t, DMode.common)
        let s = d.makeSource(order: 0) { t("source") }
        d.add(s, DMode.common)
        s.signal()
        t("run common: " + d.run(DMode.common, 0.05))
        t("run default: " + d.run(DMode.default, 0, rash: true))
    }

    // §3.1 observers do not make a mode non-empty.
    static let modeWithOnlyObserverIsEmpty: DiffScenario = { d, t in
        d.traceActivities(t, DMode.my)
        d.traceActivities(t, DMode.default)
        t("run my: " + d.run(DMode.my, 0.05))
        t("run default: " + d.run(DMode.default, 0.05))
    }

    // §3.2-3.5 order of one run: entry, beforeTimers, beforeSources, blocks, source0, blocks,
    // (no sleep after a handled source), ..., beforeWaiting, afterWaiting, timers, blocks, exit.
    static let fullIterationOrder: DiffScenario = { d, t in
        d.traceActivities(t)
        let s = d.makeSource(order: 0) { t("source0") }
        d.add(s, DMode.default)
        s.signal()
        d.perform { t("block") }
        let tm = d.makeTimer(fireAt: 0.02) { _ in
            t("timer"); d.stop()
        }
        d.add(tm, DMode.default)
        t("run: " + d.run(DMode.default, 1.0))
    }

    // §3.3 timeout 0: no sleep, so no beforeWaiting/afterWaiting.
    static let timeoutZeroSkipsSleep: DiffScenario = { d, t in
        d.traceActivities(t)
        d.keepAlive()
        t("run: " + d.run(DMode.default, 0))
    }

    // §3.3 a handled source means the next wait does not block: no sleep notifications.
    static let handledSourceSkipsSleep: DiffScenario = { d, t in
        d.traceActivities(t)
        let s = d.makeSource(order: 0) { t("source0") }
        d.add(s, DMode.default)
        s.signal()
        let tm = d.makeTimer(fireAt: 0.02) { _ in
            t("timer"); d.stop()
        }
        d.add(tm, DMode.default)
        t("run: " + d.run(DMode.default, 1.0))
    }

    // Observers run by ascending order; equal orders keep insertion order.
    static let observersSortedByOrder: DiffScenario = { d, t in
        for (name, order) in [("o5", 5), ("oMinus1", -1), ("o2", 2), ("o0a", 0), ("o0b", 0), ("o2b", 2)] {
            let o = d.makeObserver(DAct.entry | DAct.exit, repeats: true, order: order) { _, a in
                t("\(name) \(DAct.name(a))")
            }
            d.add(o, DMode.default)
        }
        d.keepAlive()
        t("run: " + d.run(DMode.default, 0))
    }

    // A non-repeating observer is invalidated right after its first call.
    static let nonRepeatingObserver: DiffScenario = { d, t in
        let o = d.makeObserver(DAct.all, repeats: false, order: 0) { o, a in
            t("once \(DAct.name(a)) valid=\(o.isValid)")
        }
        d.add(o, DMode.default)
        d.keepAlive()
        t("run1: " + d.run(DMode.default, 0))
        t("valid after: \(o.isValid)")
        t("run2: " + d.run(DMode.default, 0))
    }

    // An observer is not re-entered while it is running (nested run from its callback).
    static let observerNotReentered: DiffScenario = { d, t in
        let depth = DiffRef(0)
        let o = d.makeObserver(DAct.entry | DAct.exit, repeats: true, order: 0) { _, a in
            t("O \(DAct.name(a))")
            if a == DAct.entry && depth.v == 0 {
                depth.v += 1
                t("nested: " + d.run(DMode.default, 0))
                depth.v -= 1
            }
        }
        d.add(o, DMode.default)
        d.traceActivities(t, prefix: "P ", order: 1)
        d.keepAlive()
        t("run: " + d.run(DMode.default, 0))
    }

    // §3.3 signalled Source0s are performed by ascending order.
    static let source0ByOrder: DiffScenario = { d, t in
        var all: [any DiffSource] = []
        for order in [3, 1, 2, -5] {
            let s = d.makeSource(order: order) { t("source order \(order)") }
            d.add(s, DMode.default)
            all.append(s)
        }
        for s in all.reversed() { s.signal() }
        t("run: " + d.run(DMode.default, 0))
    }

    // signal() does not wake a sleeping loop: the source waits for the next pass.
    static let signalFromOtherThreadDoesNotWake: DiffScenario = { d, t in
        d.traceActivities(t)
        let s = d.makeSource(order: 0) { t("source0") }
        d.add(s, DMode.default)
        let h = d.whenAsleep(trace: t) { s.signal() }
        // The loop sleeps until the 150 ms timeout; the signal arrives while it sleeps.
        t("run1: " + d.run(DMode.default, 0.15))
        h.join(timeout: .seconds(5))
        t("run2: " + d.run(DMode.default, 0, rash: true))
    }

    static let signalInBeforeWaitingDoesNotWake: DiffScenario = { d, t in
        let s = d.makeSource(order: 0) { t("source0") }
        d.add(s, DMode.default)
        let once = DiffRef(false)
        let o = d.makeObserver(DAct.all, repeats: true, order: 0) { _, a in
            t(DAct.name(a))
            if a == DAct.beforeWaiting && !once.v { once.v = true; s.signal(); t("signalled") }
        }
        d.add(o, DMode.default)
        t("run1: " + d.run(DMode.default, 0.1))
        t("run2: " + d.run(DMode.default, 0, rash: true))
    }

    // signal() + wakeUp() from another thread: the sleeping loop wakes and performs the source.
    static let signalPlusWakeUpWakes: DiffScenario = { d, t in
        d.traceActivities(t)
        let s = d.makeSource(order: 0) {
            t("source0"); d.stop()
        }
        d.add(s, DMode.default)
        let h = d.whenAsleep(trace: t) {
            s.signal(); d.wakeUp()
        }
        t("run: " + d.run(DMode.default, 2.0))
        h.join(timeout: .seconds(5))
    }

    // returnAfterSourceHandled with two signalled sources.
    static let rashTwoSources: DiffScenario = { d, t in
        d.traceActivities(t)
        let a = d.makeSource(order: 0) { t("A") }
        let b = d.makeSource(order: 1) { t("B") }
        d.add(a, DMode.default); d.add(b, DMode.default)
        a.signal(); b.signal()
        t("run1: " + d.run(DMode.default, 1.0, rash: true))
        t("run2: " + d.run(DMode.default, 1.0, rash: true))
    }

    // A timer firing is not a handled source.
    static let rashTimerNotHandled: DiffScenario = { d, t in
        d.traceActivities(t)
        let tm = d.makeTimer(fireAt: 0.01) { _ in t("timer") }
        d.add(tm, DMode.default)
        d.keepAlive()
        t("run: " + d.run(DMode.default, 0.1, rash: true))
    }

    // A block is not a handled source.
    static let rashBlockNotHandled: DiffScenario = { d, t in
        d.traceActivities(t)
        d.keepAlive()
        d.perform { t("block") }
        t("run: " + d.run(DMode.default, 0.05, rash: true))
    }

    // wakeUp() with nothing to do is not a handled source.
    static let rashWakeUpNotHandled: DiffScenario = { d, t in
        d.traceActivities(t)
        d.keepAlive()
        let h = d.whenAsleep(trace: t) { d.wakeUp() }
        t("run: " + d.run(DMode.default, 0.15, rash: true))
        h.join(timeout: .seconds(5))
    }

    // §3.4 handledSource is checked before the timeout.
    static let handledSourceBeatsTimeout: DiffScenario = { d, t in
        let s = d.makeSource(order: 0) { t("source0") }
        d.add(s, DMode.default)
        s.signal()
        t("run: " + d.run(DMode.default, 0, rash: true))
    }

    // §3.4 the timeout is checked before stop; the stop does not carry over into the next run.
    static let timeoutBeatsStop: DiffScenario = { d, t in
        d.traceActivities(t)
        let s = d.makeSource(order: 0) {
            t("source0 stops"); d.stop()
        }
        d.add(s, DMode.default)
        s.signal()
        t("run1: " + d.run(DMode.default, 0))
        t("run2: " + d.run(DMode.default, 0.05))
    }

    // Blocks run FIFO, only in the modes they were queued for.
    static let blocksFifoPerMode: DiffScenario = { d, t in
        d.keepAlive(DMode.default)
        d.keepAlive(DMode.my)
        d.perform([DMode.default]) { t("b1 default") }
        d.perform([DMode.common]) { t("b2 common") }
        d.perform([DMode.my]) { t("b3 my") }
        d.perform([DMode.default]) { t("b4 default") }
        d.perform([DMode.my, DMode.default]) { t("b5 my+default") }
        d.perform([DMode.tracking]) { t("b6 tracking") }
        t("run default: " + d.run(DMode.default, 0))
        t("run my: " + d.run(DMode.my, 0))
        t("run default again: " + d.run(DMode.default, 0))
    }

    // A pending block for a mode counts as work only if the mode exists.
    static let blockForUncreatedMode: DiffScenario = { d, t in
        d.perform(["FreshMode"]) { t("fresh block") }
        t("run fresh: " + d.run("FreshMode", 0.05))
        d.perform([DMode.default]) { t("default block") }
        t("run default: " + d.run(DMode.default, 0.05))
    }

    // A block queued by a block runs in the next pass, not the same one.
    static let blockFromBlockNextPass: DiffScenario = { d, t in
        d.traceActivities(t)
        d.keepAlive()
        d.perform {
            t("b1")
            d.perform {
                t("b2 (queued by b1)"); d.stop()
            }
        }
        t("run: " + d.run(DMode.default, 0.05))
    }

    // After a source is handled the blocks run again: a block queued by a block before the
    // sources runs after them in the same iteration.
    static let blockFromBlockAfterSources: DiffScenario = { d, t in
        d.traceActivities(t)
        let s = d.makeSource(order: 0) { t("source0") }
        d.add(s, DMode.default)
        s.signal()
        d.perform {
            t("b1")
            d.perform { t("b2 (queued by b1)") }
        }
        t("run: " + d.run(DMode.default, 0, rash: true))
    }

    // A block queued by a timer handler runs at the end of the same iteration.
    static let blockFromTimerSameIteration: DiffScenario = { d, t in
        d.traceActivities(t)
        let tm = d.makeTimer(fireAt: 0.01) { _ in
            t("timer")
            d.perform {
                t("block from timer"); d.stop()
            }
        }
        d.add(tm, DMode.default)
        d.keepAlive()
        t("run: " + d.run(DMode.default, 1.0))
    }

    // CF: CFRunLoopPerformBlock does not wake a sleeping loop.
    static let performDoesNotWake: DiffScenario = { d, t in
        d.traceActivities(t)
        d.keepAlive()
        let start = d.now()
        let h = d.whenAsleep(trace: t) {
            d.perform { t("block at>=timeout: \(d.now() - start >= 0.145)") }
        }
        t("run: " + d.run(DMode.default, 0.15))
        h.join(timeout: .seconds(5))
    }

    // stop() ends only the innermost run.
    static let stopInnermostOnly: DiffScenario = { d, t in
        let b = d.makeSource(order: 0) {
            t("B stops"); d.stop()
        }
        d.add(b, DMode.my)
        let a = d.makeSource(order: 0) {
            t("A in \(d.currentMode ?? "nil")")
            b.signal()
            t("nested: " + d.run(DMode.my, 1.0))
            t("A after nested in \(d.currentMode ?? "nil")")
        }
        d.add(a, DMode.default)
        a.signal()
        d.traceActivities(t, DMode.default, prefix: "default ")
        d.traceActivities(t, DMode.my, prefix: "my ")
        t("outer: " + d.run(DMode.default, 0.05))
    }

    // A stop while the loop is not running is dropped.
    static let stopWhileNotRunningDropped: DiffScenario = { d, t in
        d.traceActivities(t)
        d.keepAlive()
        d.stop()
        t("run: " + d.run(DMode.default, 0.05))
    }

    static let stopFromOtherThread: DiffScenario = { d, t in
        d.traceActivities(t)
        d.keepAlive()
        let h = d.whenAsleep(trace: t) { d.stop() }
        t("run: " + d.run(DMode.default, 2.0))
        h.join(timeout: .seconds(5))
    }

    // wakeUp() with nothing to do: the run goes on until its timeout.
    static let wakeUpNothingToDo: DiffScenario = { d, t in
        d.traceActivities(t)
        d.keepAlive()
        let h = d.whenAsleep(trace: t) { d.wakeUp() }
        t("run: " + d.run(DMode.default, 0.15))
        h.join(timeout: .seconds(5))
    }

    // Nested run in another mode; currentMode is the innermost and is restored.
    static let nestedRunCurrentMode: DiffScenario = { d, t in
        t("before: \(d.currentMode ?? "nil")")
        let inner = d.makeSource(order: 0) { t("inner source in \(d.currentMode ?? "nil")") }
        d.add(inner, DMode.tracking)
        let outer = d.makeSource(order: 0) {
            t("outer source in \(d.currentMode ?? "nil")")
            inner.signal()
            t("nested: " + d.run(DMode.tracking, 1.0, rash: true))
            t("back in \(d.currentMode ?? "nil")")
        }
        d.add(outer, DMode.default)
        outer.signal()
        let o = d.makeObserver(DAct.entry | DAct.exit, repeats: true, order: 0) { _, a in
            t("observer \(DAct.name(a)) in \(d.currentMode ?? "nil")")
        }
        d.add(o, DMode.common)
        d.addCommonMode(DMode.tracking)
        t("run: " + d.run(DMode.default, 1.0, rash: true))
        t("after: \(d.currentMode ?? "nil")")
    }

    // Adding a mode to the common modes adds every common item to it.
    static let commonModesFanOut: DiffScenario = { d, t in
        let s = d.makeSource(order: 0) { t("source0 in \(d.currentMode ?? "nil")") }
        d.add(s, DMode.common)
        let o = d.makeObserver(DAct.entry | DAct.exit, repeats: true, order: 0) { _, a in t("observer \(DAct.name(a))")
        }
        d.add(o, DMode.common)
        let tm = d.makeTimer(fireAt: 0.01) { _ in t("timer in \(d.currentMode ?? "nil")") }
        d.add(tm, DMode.common)
        t("run tracking before: " + d.run(DMode.tracking, 0.05))
        d.addCommonMode(DMode.tracking)
        s.signal()
        t("run tracking: " + d.run(DMode.tracking, 1.0, rash: true))
        t("run tracking timer: " + d.run(DMode.tracking, 0.1))
        s.signal()
        t("run default: " + d.run(DMode.default, 0, rash: true))
    }

    // An item added to .common later reaches every existing common mode.
    static let commonItemAddedLater: DiffScenario = { d, t in
        d.addCommonMode(DMode.my)
        d.keepAlive(DMode.my)
        let s = d.makeSource(order: 0) { t("source0 in \(d.currentMode ?? "nil")") }
        d.add(s, DMode.common)
        s.signal()
        t("run my: " + d.run(DMode.my, 0, rash: true))
        s.signal()
        t("run tracking: " + d.run(DMode.tracking, 0, rash: true))
        s.signal()
        t("run default: " + d.run(DMode.default, 0, rash: true))
    }

    // Blocks queued for .common run in every common mode (including one added later).
    static let commonBlocks: DiffScenario = { d, t in
        d.keepAlive(DMode.tracking)
        d.perform([DMode.common]) { t("common block 1 in \(d.currentMode ?? "nil")") }
        t("run tracking (not common yet): " + d.run(DMode.tracking, 0))
        d.addCommonMode(DMode.tracking)
        t("run tracking (common): " + d.run(DMode.tracking, 0))
    }

    // A repeating timer keeps its phase and skips missed fire points.
    static let repeatingTimerSkipsMissed: DiffScenario = { d, t in
        // interval 40 ms, first fire at 40 ms; the first call blocks 100 ms (2.5 intervals), so
        // fire points 80 and 120 ms are missed and the next fire is at point 3 (160 ms). Fire point
        // index = floor((now - first) / interval): robust to up to 40 ms of lateness.
        let first = 0.04, interval = 0.04
        let n = DiffRef(0)
        let tm = d.makeTimer(fireAt: first, interval: interval) { tm in
            let k = Int(((d.now() - first) / interval).rounded(.down))
            n.v += 1
            t("fire #\(n.v) at point \(k)")
            if n.v == 1 { usleep(100_000) }
            if n.v == 2 { tm.invalidate() }
        }
        d.add(tm, DMode.default)
        t("run: " + d.run(DMode.default, 1.0))
    }

    // A fire date set inside the handler of a repeating timer is kept.
    static let setFireDateInHandlerRepeating: DiffScenario = { d, t in
        let n = DiffRef(0)
        let tm = d.makeTimer(fireAt: 0.01, interval: 10) { tm in
            n.v += 1
            t("fire #\(n.v)")
            if n.v == 1 { tm.setFireDate(d.now() + 0.03) }  // instead of the next interval (10 s)
            if n.v == 2 { t("valid: \(tm.isValid)"); tm.invalidate() }
        }
        d.add(tm, DMode.default)
        t("run: " + d.run(DMode.default, 1.0))
    }

    static let setFireDateInHandlerOneShot: DiffScenario = { d, t in
        let n = DiffRef(0)
        let tm = d.makeTimer(fireAt: 0.01) { tm in
            n.v += 1
            t("fire #\(n.v)")
            if n.v == 1 { tm.setFireDate(d.now() + 0.03) }
        }
        d.add(tm, DMode.default)
        d.keepAlive()
        t("run: " + d.run(DMode.default, 0.15))
        t("valid after: \(tm.isValid)")
    }

    // Two timers with the same fire date.
    static let equalFireDates: DiffScenario = { d, t in
        for name in ["A", "B", "C"] {
            let tm = d.makeTimer(fireAt: 0.02) { _ in t("timer \(name)") }
            d.add(tm, DMode.default)
        }
        t("run: " + d.run(DMode.default, 1.0))
    }

    // Due timers fire by ascending fire date, whatever the insertion order.
    static let timersByFireDate: DiffScenario = { d, t in
        for (name, at) in [("t3", 0.003), ("t1", 0.001), ("t2", 0.002)] {
            let tm = d.makeTimer(fireAt: at) { _ in t("timer \(name)") }
            d.add(tm, DMode.default)
        }
        usleep(10_000)  // all three are due before the run starts
        d.traceActivities(t)
        t("run: " + d.run(DMode.default, 1.0))
    }

    // Invalidating a source from its own perform and from another perform in the same pass.
    static let invalidateSources: DiffScenario = { d, t in
        let cRef = DiffRef<(any DiffSource)?>(nil)
        let aRef = DiffRef<(any DiffSource)?>(nil)
        let a = d.makeSource(order: 0) {
            t("A invalidates itself"); aRef.v?.invalidate()
        }
        aRef.v = a
        let b = d.makeSource(order: 1) {
            t("B invalidates C"); cRef.v?.invalidate()
        }
        let c = d.makeSource(order: 2) { t("C") }
        cRef.v = c
        let e = d.makeSource(order: 3) { t("E") }
        for s in [a, b, c, e] { d.add(s, DMode.default); s.signal() }
        t("run1: " + d.run(DMode.default, 0))
        t("valid: a=\(a.isValid) b=\(b.isValid) c=\(c.isValid)")
        a.signal(); c.signal(); b.signal()
        t("run2: " + d.run(DMode.default, 0))
    }

    // Removing (not invalidating) a signalled source from another perform in the same pass.
    static let removeSourceSamePass: DiffScenario = { d, t in
        let cRef = DiffRef<(any DiffSource)?>(nil)
        let b = d.makeSource(order: 1) {
            t("B removes C"); if let c = cRef.v { d.remove(c, DMode.default) }
        }
        let c = d.makeSource(order: 2) { t("C") }
        cRef.v = c
        d.keepAlive()
        for s in [b, c] { d.add(s, DMode.default); s.signal() }
        t("run1: " + d.run(DMode.default, 0))
        t("run2: " + d.run(DMode.default, 0))
        d.add(c, DMode.default)
        t("run3 (C re-added, still signalled?): " + d.run(DMode.default, 0))
    }

    // Invalidating observers from their own callback and another one in the same pass.
    static let invalidateObservers: DiffScenario = { d, t in
        let yRef = DiffRef<(any DiffObserver)?>(nil)
        let x = d.makeObserver(DAct.beforeTimers, repeats: true, order: 0) { o, _ in
            t("X invalidates itself and Y"); o.invalidate(); yRef.v?.invalidate()
        }
        let y = d.makeObserver(DAct.beforeTimers, repeats: true, order: 1) { _, _ in t("Y") }
        yRef.v = y
        let z = d.makeObserver(DAct.beforeTimers | DAct.exit, repeats: true, order: 2) { _, a in t("Z \(DAct.name(a))")
        }
        for o in [x, y, z] { d.add(o, DMode.default) }
        d.keepAlive()
        t("run1: " + d.run(DMode.default, 0))
        t("run2: " + d.run(DMode.default, 0))
    }

    static let removeObserverSamePass: DiffScenario = { d, t in
        let yRef = DiffRef<(any DiffObserver)?>(nil)
        let x = d.makeObserver(DAct.beforeTimers, repeats: true, order: 0) { _, _ in
            t("X removes Y"); if let y = yRef.v { d.remove(y, DMode.default) }
        }
        let y = d.makeObserver(DAct.beforeTimers, repeats: true, order: 1) { _, _ in t("Y") }
        yRef.v = y
        for o in [x, y] { d.add(o, DMode.default) }
        d.keepAlive()
        t("run1: " + d.run(DMode.default, 0))
        t("run2: " + d.run(DMode.default, 0))
    }

    // Invalidating timers from their own handler and from another handler in the same pass.
    static let invalidateTimers: DiffScenario = { d, t in
        let bRef = DiffRef<(any DiffTimer)?>(nil)
        let a = d.makeTimer(fireAt: 0.001, interval: 0.01) { tm in
            t("A invalidates itself and B"); tm.invalidate(); bRef.v?.invalidate()
        }
        let b = d.makeTimer(fireAt: 0.002, interval: 0.01) { _ in t("B") }
        bRef.v = b
        let c = d.makeTimer(fireAt: 0.003) { _ in t("C") }
        for tm in [a, b, c] { d.add(tm, DMode.default) }
        usleep(10_000)
        t("run: " + d.run(DMode.default, 0.05))
    }

    static let removeTimerSamePass: DiffScenario = { d, t in
        let bRef = DiffRef<(any DiffTimer)?>(nil)
        let a = d.makeTimer(fireAt: 0.001) { _ in
            t("A removes B"); if let b = bRef.v { d.remove(b, DMode.default) }
        }
        let b = d.makeTimer(fireAt: 0.002) { _ in t("B") }
        bRef.v = b
        for tm in [a, b] { d.add(tm, DMode.default) }
        usleep(10_000)
        d.keepAlive()
        t("run: " + d.run(DMode.default, 0.05))
        t("B valid: \(b.isValid)")
    }

    // A one-shot timer that was the only item: after it fires the mode is empty → finished.
    static let oneShotTimerOnlyItem: DiffScenario = { d, t in
        d.traceActivities(t)
        let tm = d.makeTimer(fireAt: 0.01) { _ in t("timer") }
        d.add(tm, DMode.default)
        t("run: " + d.run(DMode.default, 1.0))
    }

    static let sourceRemovesItselfLastItem: DiffScenario = { d, t in
        d.traceActivities(t)
        let ref = DiffRef<(any DiffSource)?>(nil)
        let s = d.makeSource(order: 0) {
            t("source removes itself"); if let s = ref.v { d.remove(s, DMode.default) }
        }
        ref.v = s
        d.add(s, DMode.default)
        s.signal()
        t("run: " + d.run(DMode.default, 1.0))
    }

    static let timerInOtherModeDoesNotFire: DiffScenario = { d, t in
        let tm = d.makeTimer(fireAt: 0.001) { _ in t("timer in \(d.currentMode ?? "nil")") }
        d.add(tm, DMode.my)
        d.keepAlive()
        usleep(5_000)
        t("run default: " + d.run(DMode.default, 0.03))
        t("run my: " + d.run(DMode.my, 0.03))
    }

    // Tolerance: CF Linux ignores it; RunLoopKit uses it to share wakeups (deviation 2).
    // A is due at 20 ms with 100 ms of tolerance, B at 60 ms with none. "late" means A ran at
    // least 30 ms after its fire date, i.e. in B's wakeup (CF runs it at ~20 ms).
    static let tolerance: DiffScenario = { d, t in
        d.traceActivities(t)
        let a = d.makeTimer(fireAt: 0.02, tolerance: 0.1) { _ in t("A late=\(d.now() >= 0.05)") }
        let b = d.makeTimer(fireAt: 0.06) { _ in
            t("B"); d.stop()
        }
        d.add(a, DMode.default); d.add(b, DMode.default)
        t("run: " + d.run(DMode.default, 1.0))
    }

    static let wakeUpWhileNotRunningDropped: DiffScenario = { d, t in
        d.traceActivities(t)
        d.keepAlive()
        d.wakeUp()
        t("run: " + d.run(DMode.default, 0.05))
    }

    static let runUntilStopped: DiffScenario = { d, t in
        d.traceActivities(t)
        let n = DiffRef(0)
        let tm = d.makeTimer(fireAt: 0.01, interval: 0.01) { _ in
            n.v += 1
            t("timer #\(n.v)")
            if n.v == 2 { d.stop() }
        }
        d.add(tm, DMode.default)
        d.runUntilStoppedOrFinished()
        t("returned")
    }

    static let runUntilFinished: DiffScenario = { d, t in
        d.traceActivities(t)
        let tm = d.makeTimer(fireAt: 0.01) { _ in t("timer") }
        d.add(tm, DMode.default)
        d.runUntilStoppedOrFinished()
        t("returned")
    }

    // The classic UIScrollView case: a default-mode timer waits during a tracking-mode run,
    // a common-mode timer fires in it.
    static let trackingModeTimers: DiffScenario = { d, t in
        d.addCommonMode(DMode.tracking)
        let dt = d.makeTimer(fireAt: 0.01) { _ in t("default timer in \(d.currentMode ?? "nil")") }
        d.add(dt, DMode.default)
        let ct = d.makeTimer(fireAt: 0.01) { _ in t("common timer in \(d.currentMode ?? "nil")") }
        d.add(ct, DMode.common)
        d.keepAlive(DMode.tracking)
        let s = d.makeSource(order: 0) {
            t("nested tracking: " + d.run(DMode.tracking, 0.05))
        }
        d.add(s, DMode.default)
        s.signal()
        t("run default: " + d.run(DMode.default, 0.05))
    }

    // stop() from a beforeWaiting observer.
    static let stopInBeforeWaiting: DiffScenario = { d, t in
        d.keepAlive()
        let o = d.makeObserver(DAct.all, repeats: true, order: 0) { _, a in
            t(DAct.name(a))
            if a == DAct.beforeWaiting { d.stop() }
        }
        d.add(o, DMode.default)
        let start = d.now()
        t("run: " + d.run(DMode.default, 0.15))
        t("returned before timeout: \(d.now() - start < 0.14)")
    }

    // wakeUp() from a beforeWaiting observer.
    static let wakeUpInBeforeWaiting: DiffScenario = { d, t in
        d.keepAlive()
        let once = DiffRef(false)
        let o = d.makeObserver(DAct.all, repeats: true, order: 0) { _, a in
            t(DAct.name(a))
            if a == DAct.beforeWaiting && !once.v { once.v = true; d.wakeUp() }
        }
        d.add(o, DMode.default)
        t("run: " + d.run(DMode.default, 0.15))
    }

    // A timer is not re-entered while its handler runs a nested run.
    static let timerNotReentered: DiffScenario = { d, t in
        let n = DiffRef(0)
        let a = d.makeTimer(fireAt: 0.001, interval: 0.01) { tm in
            n.v += 1
            t("A #\(n.v)")
            if n.v == 1 {
                t("nested: " + d.run(DMode.default, 0.05))
                tm.invalidate()
            }
        }
        d.add(a, DMode.default)
        let b = d.makeTimer(fireAt: 0.02) { _ in t("B") }
        d.add(b, DMode.default)
        t("run: " + d.run(DMode.default, 0.1))
    }

    // A source that signals itself runs again in the next iteration, not the same pass.
    static let sourceResignalsItself: DiffScenario = { d, t in
        d.traceActivities(t)
        let n = DiffRef(0)
        let ref = DiffRef<(any DiffSource)?>(nil)
        let s = d.makeSource(order: 0) {
            n.v += 1
            t("source #\(n.v)")
            if n.v == 1 { ref.v?.signal() } else { d.stop() }
        }
        ref.v = s
        d.add(s, DMode.default)
        s.signal()
        t("run: " + d.run(DMode.default, 1.0))
    }

    // A source signalled from a beforeSources observer is performed in the same iteration.
    static let signalInBeforeSources: DiffScenario = { d, t in
        let s = d.makeSource(order: 0) { t("source0") }
        d.add(s, DMode.default)
        let once = DiffRef(false)
        let o = d.makeObserver(DAct.all, repeats: true, order: 0) { _, a in
            t(DAct.name(a))
            if a == DAct.beforeSources && !once.v { once.v = true; s.signal() }
        }
        d.add(o, DMode.default)
        t("run: " + d.run(DMode.default, 0, rash: true))
    }

    // A default-mode block queued during a nested tracking run waits for the outer run.
    static let blockForOuterModeWaitsForNested: DiffScenario = { d, t in
        d.keepAlive(DMode.tracking)
        let s = d.makeSource(order: 0) {
            d.perform([DMode.default]) { t("default block in \(d.currentMode ?? "nil")") }
            d.perform([DMode.tracking]) { t("tracking block in \(d.currentMode ?? "nil")") }
            t("nested: " + d.run(DMode.tracking, 0))
            t("nested returned")
        }
        d.add(s, DMode.default)
        s.signal()
        t("run: " + d.run(DMode.default, 0))
    }

    // One observer added to two modes is called once per activity of the running mode.
    static let observerInTwoModes: DiffScenario = { d, t in
        let o = d.makeObserver(DAct.entry | DAct.exit, repeats: true, order: 0) { _, a in
            t("observer \(DAct.name(a)) in \(d.currentMode ?? "nil")")
        }
        d.add(o, DMode.default)
        d.add(o, DMode.tracking)
        d.keepAlive(DMode.default)
        d.keepAlive(DMode.tracking)
        t("run default: " + d.run(DMode.default, 0))
        t("run tracking: " + d.run(DMode.tracking, 0))
        d.remove(o, DMode.default)
        t("run default: " + d.run(DMode.default, 0))
        t("run tracking: " + d.run(DMode.tracking, 0))
    }

    // NSRunLoop run(mode:before:): false at once for an empty mode; otherwise one run that
    // returns after the first handled source (true).
    static let runModeBeforeDate: DiffScenario = { d, t in
        d.traceActivities(t)
        t("empty: \(d.runBefore(DMode.default, 0.05))")
        let a = d.makeSource(order: 0) { t("A") }
        let b = d.makeSource(order: 1) { t("B") }
        d.add(a, DMode.default); d.add(b, DMode.default)
        a.signal(); b.signal()
        t("with sources: \(d.runBefore(DMode.default, 0.05))")
        let tm = d.makeTimer(fireAt: 0.01) { _ in t("timer") }
        d.add(tm, DMode.default)
        t("with timer: \(d.runBefore(DMode.default, 0.05))")
    }

    // NSRunLoop run(until:): a stop() ends one pass only; the passes go on until the date.
    static let runUntilDate: DiffScenario = { d, t in
        d.traceActivities(t)
        let s = d.makeSource(order: 0) {
            t("source stops"); d.stop()
        }
        d.add(s, DMode.default)
        s.signal()
        let start = d.now()
        let tm = d.makeTimer(fireAt: start + 0.02) { _ in t("timer") }
        d.add(tm, DMode.default)
        d.keepAlive()
        d.runUntil(0.08)
        t("returned after the date: \(d.now() - start >= 0.075)")
    }

    static let runUntilDateEmpty: DiffScenario = { d, t in
        d.traceActivities(t)
        let start = d.now()
        d.runUntil(0.05)
        t("returned at once: \(d.now() - start < 0.04)")
    }

    // Modes are created on demand and never removed.
    static let modesCreatedOnDemand: DiffScenario = { d, t in
        t("fresh: \(d.allModes)")
        let tm = d.makeTimer(fireAt: 3600) { _ in }
        d.add(tm, DMode.my)
        t("after adding a timer to MyMode: \(d.allModes)")
        d.remove(tm, DMode.my)
        t("after removing it: \(d.allModes)")
        d.perform(["BlockMode"]) {}
        t("after queueing a block for BlockMode: \(d.allModes)")
        _ = d.run("RunOnlyMode", 0)
        t("after running RunOnlyMode: \(d.allModes)")
    }

    // wakeUp() from a source's perform, while the loop is busy (not about to sleep).
    static let wakeUpWhileBusy: DiffScenario = { d, t in
        d.traceActivities(t)
        let s = d.makeSource(order: 0) {
            t("source wakes the loop"); d.wakeUp()
        }
        d.add(s, DMode.default)
        s.signal()
        t("run: " + d.run(DMode.default, 0.1))
    }

    // CF: addCommonMode creates the mode only when .common holds items to copy into it.
    static let addCommonModeWithoutCommonItems: DiffScenario = { d, t in
        d.addCommonMode(DMode.tracking)
        t("after addCommonMode(tracking): \(d.allModes)")
        d.keepAlive(DMode.common)
        d.addCommonMode(DMode.my)
        t("after a common item and addCommonMode(MyMode): \(d.allModes)")
    }

    // A timer added from a callback during a run: the loop sleeps until it is due.
    static let timerAddedFromCallback: DiffScenario = { d, t in
        d.traceActivities(t)
        let s = d.makeSource(order: 0) {
            t("source adds a timer")
            let tm = d.makeTimer(fireAt: d.now() + 0.01) { _ in
                t("timer"); d.stop()
            }
            d.add(tm, DMode.default)
        }
        d.add(s, DMode.default)
        s.signal()
        t("run: " + d.run(DMode.default, 1.0))
    }

    // A timer belongs to at most one loop: adding it to a second loop does nothing.
    static let timerBelongsToOneLoop: DiffScenario = { d, t in
        let tm = d.makeTimer(fireAt: 0.01) { _ in t("timer fired") }
        let added = DispatchSemaphore(value: 0)
        let done = DispatchSemaphore(value: 0)
        let h = TestThread(name: "diff-helper") {
            let other = d.sibling()  // the helper thread's own loop, never run
            other.add(tm, DMode.default)
            added.signal()
            _ = done.wait(timeout: .now() + 5)
        }
        _ = added.wait(timeout: .now() + 5)
        d.add(tm, DMode.default)  // ignored
        t("run: " + d.run(DMode.default, 0.05))
        t("valid: \(tm.isValid)")
        done.signal()
        h.join(timeout: .seconds(5))
    }

    // NSRunLoop acceptInput(forMode:before:): one run that returns after a handled source.
    static let acceptInputOnce: DiffScenario = { d, t in
        d.traceActivities(t)
        let a = d.makeSource(order: 0) { t("A") }
        let b = d.makeSource(order: 1) { t("B") }
        d.add(a, DMode.default); d.add(b, DMode.default)
        a.signal(); b.signal()
        d.acceptInput(DMode.default, 0.05)
        t("returned")
        d.acceptInput(DMode.my, 0.05)  // empty mode: returns at once
        t("returned from empty mode")
    }

    // nextTimerFireDate(forMode:): the earliest valid timer of the mode, nil if none.
    // Dates are printed rounded to 10 ms (they are whole multiples of 100 ms from the epoch).
    static let nextTimerFireDate: DiffScenario = { d, t in
        func show(_ label: String, _ mode: String) {
            t("\(label): " + (d.nextTimerFireDate(mode).map { String(format: "%.2f", $0) } ?? "nil"))
        }
        show("empty default", DMode.default)
        let late = d.makeTimer(fireAt: 0.5) { _ in }
        let early = d.makeTimer(fireAt: 0.3) { _ in }
        d.add(late, DMode.my); d.add(early, DMode.my)
        show("my", DMode.my)
        show("default", DMode.default)
        early.invalidate()
        show("my after invalidating the earliest", DMode.my)
        let common = d.makeTimer(fireAt: 0.2) { _ in }
        d.add(common, DMode.common)
        d.addCommonMode(DMode.tracking)
        show("tracking (common)", DMode.tracking)
        show("default (common)", DMode.default)
        late.setFireDate(0.1)
        show("my after moving the other", DMode.my)
    }

    // A signalled source invalidated before the run is not performed.
    static let invalidatedSignalledSource: DiffScenario = { d, t in
        let s = d.makeSource(order: 0) { t("source0") }
        d.add(s, DMode.default)
        s.signal()
        s.invalidate()
        d.keepAlive()
        t("run: " + d.run(DMode.default, 0, rash: true))
    }

    // An observer added by another observer during a pass is not called for that activity, but
    // is for the next one.
    static let observerAddedDuringPass: DiffScenario = { d, t in
        let added = DiffRef(false)
        let x = d.makeObserver(DAct.beforeTimers, repeats: true, order: 0) { _, _ in
            t("X beforeTimers")
            if !added.v {
                added.v = true
                let y = d.makeObserver(DAct.beforeTimers | DAct.beforeSources, repeats: true, order: 1) { _, a in
                    t("Y \(DAct.name(a))")
                }
                d.add(y, DMode.default)
            }
        }
        d.add(x, DMode.default)
        d.keepAlive()
        t("run: " + d.run(DMode.default, 0))
    }

    // A source added and signalled by another source's perform runs in the next iteration.
    static let sourceAddedDuringPass: DiffScenario = { d, t in
        d.traceActivities(t)
        let a = d.makeSource(order: 0) {
            t("A adds and signals B")
            let b = d.makeSource(order: 1) {
                t("B"); d.stop()
            }
            d.add(b, DMode.default)
            b.signal()
        }
        d.add(a, DMode.default)
        a.signal()
        t("run: " + d.run(DMode.default, 1.0))
    }

    // A timer added by a timer handler with a fire date already past fires in the next pass.
    static let dueTimerAddedByTimer: DiffScenario = { d, t in
        d.traceActivities(t)
        let a = d.makeTimer(fireAt: 0.005) { _ in
            t("A adds an overdue timer")
            let b = d.makeTimer(fireAt: 0) { _ in
                t("B"); d.stop()
            }
            d.add(b, DMode.default)
        }
        d.add(a, DMode.default)
        t("run: " + d.run(DMode.default, 1.0))
    }

    // Moving a timer's fire date earlier from another thread wakes the sleeping loop.
    static let setFireDateFromOtherThread: DiffScenario = { d, t in
        d.traceActivities(t)
        let tm = d.makeTimer(fireAt: 3600) { _ in
            t("timer"); d.stop()
        }
        d.add(tm, DMode.default)
        let h = d.whenAsleep(trace: t) {
            tm.setFireDate(d.now())
        }
        t("run: " + d.run(DMode.default, 2.0))
        h.join(timeout: .seconds(5))
    }

    // A timer added from another thread while the loop sleeps fires at its date.
    static let timerAddedFromOtherThread: DiffScenario = { d, t in
        d.traceActivities(t)
        d.keepAlive()
        let h = d.whenAsleep(trace: t) {
            let tm = d.makeTimer(fireAt: d.now() + 0.01) { _ in
                t("timer"); d.stop()
            }
            d.add(tm, DMode.default)
        }
        t("run: " + d.run(DMode.default, 2.0))
        h.join(timeout: .seconds(5))
    }

    // A source added from another thread while the loop sleeps, then signalled and woken.
    static let sourceAddedFromOtherThread: DiffScenario = { d, t in
        d.traceActivities(t)
        d.keepAlive()
        let h = d.whenAsleep(trace: t) {
            let s = d.makeSource(order: 0) {
                t("source0"); d.stop()
            }
            d.add(s, DMode.default)
            s.signal()
            d.wakeUp()
        }
        t("run: " + d.run(DMode.default, 2.0))
        h.join(timeout: .seconds(5))
    }

    // A negative timeout counts as zero.
    static let negativeTimeout: DiffScenario = { d, t in
        d.traceActivities(t)
        d.keepAlive()
        t("run: " + d.run(DMode.default, -1))
    }

    // A source is not protected against re-entry: re-signalled from its own perform, it is
    // performed again by a nested run started in that perform.
    static let sourceReenteredInNestedRun: DiffScenario = { d, t in
        let depth = DiffRef(0)
        let ref = DiffRef<(any DiffSource)?>(nil)
        let s = d.makeSource(order: 0) {
            t("source at depth \(depth.v)")
            if depth.v == 0 {
                depth.v += 1
                ref.v?.signal()
                t("nested: " + d.run(DMode.default, 0.05, rash: true))
                depth.v -= 1
            }
        }
        ref.v = s
        d.add(s, DMode.default)
        s.signal()
        t("run: " + d.run(DMode.default, 0.05, rash: true))
    }

    // The only item (a timer) is invalidated from another thread while the loop sleeps.
    static let lastItemInvalidatedFromOtherThread: DiffScenario = { d, t in
        d.traceActivities(t)
        let tm = d.makeTimer(fireAt: 3600) { _ in t("timer") }
        d.add(tm, DMode.default)
        let h = d.whenAsleep(trace: t) { tm.invalidate() }
        t("run: " + d.run(DMode.default, 0.15))
        h.join(timeout: .seconds(5))
    }

    // The only item (a source) is removed from another thread while the loop sleeps.
    static let lastSourceRemovedFromOtherThread: DiffScenario = { d, t in
        d.traceActivities(t)
        let s = d.makeSource(order: 0) { t("source0") }
        d.add(s, DMode.default)
        let h = d.whenAsleep(trace: t) {
            d.remove(s, DMode.default)
        }
        t("run: " + d.run(DMode.default, 0.15))
        h.join(timeout: .seconds(5))
    }

    // Adding invalidated items does nothing: the mode stays empty.
    static let addingInvalidatedItems: DiffScenario = { d, t in
        let s = d.makeSource(order: 0) { t("source0") }
        s.invalidate()
        d.add(s, DMode.default)
        let tm = d.makeTimer(fireAt: 0) { _ in t("timer") }
        tm.invalidate()
        d.add(tm, DMode.default)
        let o = d.makeObserver(DAct.all, repeats: true, order: 0) { _, a in t("observer \(DAct.name(a))") }
        o.invalidate()
        d.add(o, DMode.default)
        t("run: " + d.run(DMode.default, 0.05))
    }

    // A one-shot timer in two modes fires once, in whichever mode runs when it is due.
    static let timerInTwoModesFiresOnce: DiffScenario = { d, t in
        let tm = d.makeTimer(fireAt: 0.01) { _ in t("timer in \(d.currentMode ?? "nil")") }
        d.add(tm, DMode.default)
        d.add(tm, DMode.tracking)
        let s = d.makeSource(order: 0) {
            t("nested tracking: " + d.run(DMode.tracking, 0.05))
        }
        d.add(s, DMode.default)
        s.signal()
        t("run default: " + d.run(DMode.default, 0.05))
        t("valid: \(tm.isValid)")
    }
}
