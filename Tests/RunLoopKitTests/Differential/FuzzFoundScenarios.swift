import Foundation

// Scenarios for the divergences between CFRunLoop and RunLoopKit found by reading CF's source
// (/tmp/CFRunLoop.c is swift-corelibs-foundation's, the CF `import CoreFoundation` runs here) and
// by the differential fuzzer (DiffFuzzTests.swift). FuzzFoundDiffTests.swift runs them; each
// comment says what CF does and where in CFRunLoop.c. Same rules as DiffScenarios.swift: one
// thread, bounded time, facts and lower bounds on real time only.

enum FuzzFoundScenarios {

    // MARK: K. Source0s signalled during the Source0 phase

    /// S0's perform signals S1 (order 1, after S0). CF's __CFRunLoopDoSources0 first collects the
    /// signalled, valid sources of the mode (__CFRunLoopCollectSources0), sorts that array, then
    /// performs it: S1 was not signalled at collection, so it runs in the next pass.
    static let sourceSignalledByEarlierSource: DiffScenario = { d, t in
        d.traceActivities(t)
        let s1 = d.makeSource(order: 1) {
            t("S1"); d.stop()
        }
        let s0 = d.makeSource(order: 0) {
            t("S0 signals S1"); s1.signal()
        }
        d.add(s0, DMode.default)
        d.add(s1, DMode.default)
        s0.signal()
        t("run: " + d.run(DMode.default, 1.0))
    }

    // MARK: O. add(item, .common) after the item left one common mode

    /// CFRunLoopAdd{Source,Timer,Observer}(rl, item, kCFRunLoopCommonModes) adds the item to
    /// `_commonModeItems` (a set: no change if it is there) and then adds it to every common mode
    /// (__CFRunLoopAddItemToCommonModes), so an item removed from one common mode goes back into
    /// it. Checked with contains, and by running the mode.
    static let commonReAddSource: DiffScenario = { d, t in
        d.addCommonMode(DMode.tracking)
        d.keepAlive(DMode.tracking)
        let s = d.makeSource(order: 0) { t("S in \(d.currentMode ?? "nil")") }
        d.add(s, DMode.common)
        d.remove(s, DMode.tracking)
        t("after remove: tracking \(d.contains(s, DMode.tracking)) common \(d.contains(s, DMode.common))")
        d.add(s, DMode.common)
        t("after re-add: tracking \(d.contains(s, DMode.tracking)) common \(d.contains(s, DMode.common))")
        s.signal()
        t("run tracking: " + d.run(DMode.tracking, 0, rash: true))
    }

    static let commonReAddTimer: DiffScenario = { d, t in
        d.addCommonMode(DMode.tracking)
        let tm = d.makeTimer(fireAt: 3600) { _ in }
        d.add(tm, DMode.common)
        d.remove(tm, DMode.tracking)
        func show(_ label: String) {
            let next = diffFireDateText(d.nextTimerFireDate(DMode.tracking))
            t("\(label): tracking \(d.contains(tm, DMode.tracking)) next \(next)")
        }
        show("after remove")
        d.add(tm, DMode.common)
        show("after re-add")
        t("run tracking: " + d.run(DMode.tracking, 0))
    }

    static let commonReAddObserver: DiffScenario = { d, t in
        d.addCommonMode(DMode.tracking)
        d.keepAlive(DMode.tracking)
        let o = d.makeObserver(DAct.entry | DAct.exit, repeats: true, order: 0) { _, a in
            t("O \(DAct.name(a)) in \(d.currentMode ?? "nil")")
        }
        d.add(o, DMode.common)
        d.remove(o, DMode.tracking)
        t("after remove: tracking \(d.contains(o, DMode.tracking))")
        d.add(o, DMode.common)
        t("after re-add: tracking \(d.contains(o, DMode.tracking))")
        t("run tracking: " + d.run(DMode.tracking, 0))
    }

    // MARK: P. remove(timer, forMode:) inside the timer's own handler

    /// A repeating timer (interval 1 s) removes itself from a mode it is not in, in its first
    /// call. CF: CFRunLoopRemoveTimer finds nothing to do; after the callout __CFRunLoopDoTimer
    /// moves the timer to its next fire point (1 s later), so the 50 ms run sees one fire.
    static let removeTimerFromOtherModeInOwnHandler: DiffScenario = { d, t in
        let n = DiffRef(0)
        let tm = d.makeTimer(fireAt: 0.001, interval: 1.0) { tm in
            n.v += 1
            t("fire #\(n.v)")
            if n.v == 1 { d.remove(tm, DMode.my) }
        }
        d.add(tm, DMode.default)
        d.keepAlive()
        t("run: " + d.run(DMode.default, 0.05))
        t("valid: \(tm.isValid) next \(diffFireDateText(d.nextTimerFireDate(DMode.default)))")
    }

    /// The same timer, in default and tracking, removes itself from default in its first call.
    /// CF reschedules it in the modes it is still in (tracking) at its next point, 1 s later: a
    /// 50 ms tracking run sees no fire.
    static let removeTimerFromOwnModeInOwnHandler: DiffScenario = { d, t in
        let n = DiffRef(0)
        let tm = d.makeTimer(fireAt: 0.001, interval: 1.0) { tm in
            n.v += 1
            t("fire #\(n.v) in \(d.currentMode ?? "nil")")
            if n.v == 1 { d.remove(tm, DMode.default) }
        }
        d.add(tm, DMode.default)
        d.add(tm, DMode.tracking)
        d.keepAlive()
        d.keepAlive(DMode.tracking)
        t("run default: " + d.run(DMode.default, 0.05))
        t("run tracking: " + d.run(DMode.tracking, 0.05))
        t("in default \(d.contains(tm, DMode.default)), in tracking \(d.contains(tm, DMode.tracking))")
    }

    // MARK: J. Wakeups requested inside a nested run

    /// The outer run's beforeWaiting observer runs a nested timeout-0 run in MyMode whose source
    /// calls wakeUp(). CF: the wakeup is written to the loop's wakeup eventfd (the nested run
    /// accepts wakeups before its wait), and the nested run's poll (__CFRunLoopServiceFileDescriptors
    /// with timeout 0) reads it. The outer run then sleeps to its 100 ms timeout: one
    /// beforeWaiting/afterWaiting pair.
    static let wakeUpInNestedPollRun: DiffScenario = { d, t in
        d.keepAlive()
        let inner = d.makeSource(order: 0) {
            t("inner source wakes the loop"); d.wakeUp()
        }
        d.add(inner, DMode.my)
        let once = DiffRef(false)
        let o = d.makeObserver(DAct.all, repeats: true, order: 0) { _, a in
            t(DAct.name(a))
            if a == DAct.beforeWaiting && !once.v {
                once.v = true
                inner.signal()
                t("nested: " + d.run(DMode.my, 0))
            }
        }
        d.add(o, DMode.default)
        t("run: " + d.run(DMode.default, 0.1))
    }

    /// The outer run's beforeWaiting observer runs a nested run in MyMode whose timer (due after
    /// 5 ms) calls wakeUp() and stop(). CF: that happens after the nested run's wait, while
    /// wakeups are ignored (__CFRunLoopSetIgnoreWakeUps after every wait): nothing is written, and
    /// the outer run sleeps to its 100 ms timeout.
    static let wakeUpAfterNestedWait: DiffScenario = { d, t in
        d.keepAlive()
        d.keepAlive(DMode.my)
        let once = DiffRef(false)
        let o = d.makeObserver(DAct.all, repeats: true, order: 0) { _, a in
            t(DAct.name(a))
            if a == DAct.beforeWaiting && !once.v {
                once.v = true
                let tm = d.makeTimer(fireAt: d.now() + 0.005) { _ in
                    t("inner timer wakes and stops the loop"); d.wakeUp(); d.stop()
                }
                d.add(tm, DMode.my)
                t("nested: " + d.run(DMode.my, 1.0))
            }
        }
        d.add(o, DMode.default)
        t("run: " + d.run(DMode.default, 0.1))
    }

    // MARK: C. A wakeup or stop requested outside a wait

    /// wakeUp() from the entry observer. CF: a run starts with wakeups accepted (a fresh
    /// per-run record, ignoreWakeUps = 0), so the eventfd is written; nothing reads it until the
    /// first wait, whose sleep then returns at once. The run iterates and sleeps to its timeout.
    static let wakeUpInEntryObserver: DiffScenario = { d, t in
        d.keepAlive()
        let o = d.makeObserver(DAct.all, repeats: true, order: 0) { _, a in
            t(DAct.name(a))
            if a == DAct.entry { d.wakeUp() }
        }
        d.add(o, DMode.default)
        t("run: " + d.run(DMode.default, 0.1))
    }

    /// wakeUp() from a beforeSources observer, in a pass that handles no source. CF: written
    /// (wakeups are accepted from the start of a pass), read by that pass's own sleep, which
    /// returns at once.
    static let wakeUpInBeforeSources: DiffScenario = { d, t in
        d.keepAlive()
        let once = DiffRef(false)
        let o = d.makeObserver(DAct.all, repeats: true, order: 0) { _, a in
            t(DAct.name(a))
            if a == DAct.beforeSources && !once.v { once.v = true; d.wakeUp() }
        }
        d.add(o, DMode.default)
        t("run: " + d.run(DMode.default, 0.1))
    }

    /// stop() from the entry observer. CF: CFRunLoopStop marks the run stopped and wakes the
    /// loop (written: the run accepts wakeups). __CFRunLoopRun sees the stop before its first
    /// pass: run 1 returns stopped with no pass, and the wakeup stays in the eventfd. Run 2 is a
    /// new run, but the same eventfd: its first sleep returns at once.
    static let stopInEntryObserver: DiffScenario = { d, t in
        d.keepAlive()
        let runs = DiffRef(0)
        let o = d.makeObserver(DAct.all, repeats: true, order: 0) { _, a in
            t(DAct.name(a))
            if a == DAct.entry {
                runs.v += 1
                if runs.v == 1 { d.stop() }
            }
        }
        d.add(o, DMode.default)
        t("run 1: " + d.run(DMode.default, 0.1))
        t("run 2: " + d.run(DMode.default, 0.1))
    }

    /// Wakeups requested while CF ignores them: after a wait (afterWaiting observer, timer
    /// handler) until the next pass starts, and in the exit observer of a run that has waited
    /// (__CFRunLoopSetIgnoreWakeUps after every wait; the per-run record is fresh, accepting
    /// wakeups, only when a run starts). None of them shortens a later sleep: one
    /// beforeWaiting/afterWaiting pair per sleep that a timer or a timeout ends.
    static let wakeUpWhileIgnored: DiffScenario = { d, t in
        d.keepAlive()
        let firstAfterWaiting = DiffRef(true)
        let runs = DiffRef(0)
        let o = d.makeObserver(DAct.all, repeats: true, order: 0) { _, a in
            t(DAct.name(a))
            if a == DAct.entry { runs.v += 1 }
            if a == DAct.afterWaiting && firstAfterWaiting.v {
                firstAfterWaiting.v = false
                d.wakeUp()
            }
            if a == DAct.exit && runs.v == 1 { d.wakeUp() }
        }
        d.add(o, DMode.default)
        let tm = d.makeTimer(fireAt: 0.005) { _ in
            t("timer wakes the loop"); d.wakeUp()
        }
        d.add(tm, DMode.default)
        t("run 1: " + d.run(DMode.default, 0.1))
        t("run 2: " + d.run(DMode.default, 0.05))
    }

    // MARK: A. Fire dates in the past

    /// CFRunLoopTimerCreate and CFRunLoopTimerSetNextFireDate turn a past date into "now"
    /// (`_fireTSR = mach_absolute_time()`), so overdue timers are ordered by when they were created
    /// or set, not by their dates. (CF keeps the date as given in `_nextFireDate`, which is what
    /// CFRunLoopTimerGetNextFireDate answers.)
    static let pastFireDatesFireInCreationOrder: DiffScenario = { d, t in
        let a = d.makeTimer(fireAt: -0.010) { _ in t("A (created first, date -10 ms)") }
        diffBusyWait(microseconds: 50)
        let b = d.makeTimer(fireAt: -0.020) { _ in t("B (created second, date -20 ms)") }
        d.add(b, DMode.default)
        d.add(a, DMode.default)
        let c = d.makeTimer(fireAt: 3600) { _ in t("C (set first, to -10 ms)") }
        let e = d.makeTimer(fireAt: 3601) { _ in t("E (set second, to -20 ms)") }
        d.add(e, DMode.default)
        d.add(c, DMode.default)
        c.setFireDate(-0.010)
        diffBusyWait(microseconds: 50)
        e.setFireDate(-0.020)
        t("run: " + d.run(DMode.default, 1.0))
    }

    /// A repeating timer (interval 100 ms) created with a date 35 ms in the past: CF's schedule
    /// counts from the clamped date (creation time), so its second fire comes ~100 ms after the
    /// epoch, not at -35 + 100 = 65 ms. "at >= 90 ms" is a lower bound on real time.
    static let pastFireDateRepeatingPhase: DiffScenario = { d, t in
        let n = DiffRef(0)
        let tm = d.makeTimer(fireAt: -0.035, interval: 0.1) { tm in
            n.v += 1
            if n.v == 2 {
                t("second fire at >= 90 ms: \(d.now() >= 0.09)")
                tm.invalidate()
            } else {
                t("fire #\(n.v)")
            }
        }
        d.add(tm, DMode.default)
        t("run: " + d.run(DMode.default, 1.0))
    }

    // MARK: B. Equal-order Source0s

    /// Three order-0 sources added X, Y, Z and signalled Z, Y, X (with distinct clock readings),
    /// then X again. CF's __CFRunLoopSourceComparator sorts by order, then by `_signaledTime`
    /// (the `mach_absolute_time()` of the first signal since the last perform: a repeated signal
    /// keeps it). So: Z, Y, X.
    static let equalOrderSourcesBySignalTime: DiffScenario = { d, t in
        let x = d.makeSource(order: 0) { t("X") }
        let y = d.makeSource(order: 0) { t("Y") }
        let z = d.makeSource(order: 0) { t("Z") }
        for s in [x, y, z] { d.add(s, DMode.default) }
        z.signal()
        diffBusyWait(microseconds: 50)
        y.signal()
        diffBusyWait(microseconds: 50)
        x.signal()
        diffBusyWait(microseconds: 50)
        z.signal()  // already signalled: keeps its first signal time
        t("run 1: " + d.run(DMode.default, 0))
        // Signalled X, Z, Y: performed in that order.
        x.signal()
        diffBusyWait(microseconds: 50)
        z.signal()
        diffBusyWait(microseconds: 50)
        y.signal()
        t("run 2: " + d.run(DMode.default, 0))
    }

    // MARK: N. A due timer's fire date set by an earlier timer of the same pass

    /// A and B are both overdue when the run starts. A's handler sets B's fire date to now (still
    /// due). CF's __CFRunLoopDoTimers collected both before firing; __CFRunLoopDoTimer fires B
    /// because its (new) `_fireTSR` is still <= now: same pass (no beforeWaiting in between).
    static let dueTimerMovedByEarlierTimer: DiffScenario = { d, t in
        d.traceActivities(t)
        let bRef = DiffRef<(any DiffTimer)?>(nil)
        let a = d.makeTimer(fireAt: 0.001) { _ in
            t("A sets B's fire date to now"); bRef.v?.setFireDate(d.now())
        }
        let b = d.makeTimer(fireAt: 0.002) { _ in
            t("B"); d.stop()
        }
        bRef.v = b
        d.add(a, DMode.default)
        d.add(b, DMode.default)
        d.keepAlive()
        usleep(10_000)  // both overdue before the run starts
        t("run: " + d.run(DMode.default, 1.0))
    }

    // MARK: L. nextTimerFireDate inside a timer's callout

    /// CFRunLoopGetNextTimerFireDate answers the `_nextFireDate` of the first timer of the mode's
    /// sorted array. A firing timer stays in that array, with its old date, until
    /// __CFRunLoopDoTimer reschedules it after the callout: so inside its own callout it is still
    /// the answer (for the repeating A and the one-shot C alike).
    static let nextTimerFireDateInCallout: DiffScenario = { d, t in
        let a = d.makeTimer(fireAt: 0.01, interval: 10) { tm in
            t("in A: next \(diffFireDateText(d.nextTimerFireDate(DMode.default)))")
            tm.invalidate()
        }
        let b = d.makeTimer(fireAt: 0.5) { _ in t("B") }
        let c = d.makeTimer(fireAt: 0.02) { _ in
            t("in C: next \(diffFireDateText(d.nextTimerFireDate(DMode.default)))")
            d.stop()
        }
        for tm in [a, b, c] { d.add(tm, DMode.default) }
        t("run: " + d.run(DMode.default, 1.0))
        t("after: next \(diffFireDateText(d.nextTimerFireDate(DMode.default)))")
    }

    // MARK: Deviations kept (F D E I G H)

    /// F. The beforeWaiting observer calls wakeUp() and then waits until a timer (due 2 ms after
    /// the start) is overdue: both the wakeup eventfd and the mode's timerfd are ready, the
    /// eventfd first in epoll's ready list. CF takes one event per wait (epoll_wait with
    /// maxevents 1): the wakeup; it does not look at timers after a wakeup-port wake. The timer
    /// fires only after the next wait, which the timerfd ends at once.
    static let dueTimerAfterWakeUpWait: DiffScenario = { d, t in
        d.traceActivities(t, prefix: "")
        let once = DiffRef(false)
        let o = d.makeObserver(DAct.beforeWaiting, repeats: true, order: 1) { _, _ in
            if !once.v {
                once.v = true
                d.wakeUp()
                usleep(10_000)  // the timer is overdue before the sleep starts
                t("woken, timer overdue")
            }
        }
        d.add(o, DMode.default)
        let tm = d.makeTimer(fireAt: d.now() + 0.002) { _ in
            t("timer"); d.stop()
        }
        d.add(tm, DMode.default)
        t("run: " + d.run(DMode.default, 1.0))
    }

    /// D. A timer (due 20 ms) is invalidated before the run. CF on Linux never disarms the mode's
    /// timerfd (`_mkTimerArmed` is set only where dispatch timers are used), so at 20 ms the
    /// 100 ms run wakes for nothing: an extra beforeWaiting/afterWaiting pair.
    static let invalidatedTimerSpuriousWakeUp: DiffScenario = { d, t in
        d.traceActivities(t)
        d.keepAlive()
        let tm = d.makeTimer(fireAt: 0.02) { _ in t("timer") }
        d.add(tm, DMode.default)
        tm.invalidate()
        t("run: " + d.run(DMode.default, 0.1))
    }

    /// D, second face. The mode's only source is removed by the beforeWaiting observer; a timer
    /// due at 20 ms was invalidated before the run. RunLoopKit sleeps to the 150 ms timeout
    /// (timedOut is checked before finished). CF's armed timerfd wakes it at 20 ms with the mode
    /// empty and the timeout not passed: finished.
    static let invalidatedTimerFinishesEmptyMode: DiffScenario = { d, t in
        d.traceActivities(t)
        let s = d.makeSource(order: 0) { t("source") }
        d.add(s, DMode.default)
        let tm = d.makeTimer(fireAt: 0.02) { _ in t("timer") }
        d.add(tm, DMode.default)
        tm.invalidate()
        let o = d.makeObserver(DAct.beforeWaiting, repeats: false, order: 1) { _, _ in
            d.remove(s, DMode.default)
        }
        d.add(o, DMode.default)
        t("run: " + d.run(DMode.default, 0.15))
    }

    /// E. CF implements a run's timeout with a dispatch timer that calls CFRunLoopWakeUp once.
    /// Here the outer run (timeout 20 ms) runs a nested 300 ms run from its beforeWaiting
    /// observer: the outer run's one wakeup lands in the nested run, and the outer run then
    /// sleeps with nothing left to wake it. A rescue timer at 1.5 s wakes it in this scenario
    /// (without it CF would sleep forever); RunLoopKit's sleep ends at the outer deadline, which
    /// has passed, and the rescue never fires.
    static let nestedRunEatsTimeout: DiffScenario = { d, t in
        d.keepAlive(DMode.my)
        let start = d.now()
        let rescue = d.makeTimer(fireAt: start + 1.5) { _ in t("rescue timer fired") }
        d.add(rescue, DMode.default)
        let once = DiffRef(false)
        let o = d.makeObserver(DAct.all, repeats: true, order: 0) { _, a in
            t(DAct.name(a))
            if a == DAct.beforeWaiting && !once.v {
                once.v = true
                t("nested: " + d.run(DMode.my, 0.3))
            }
        }
        d.add(o, DMode.default)
        t("run: " + d.run(DMode.default, 0.02))
        t("outer run overran its timeout by >= 1 s: \(d.now() - start >= 1.02)")
        rescue.invalidate()
    }

    /// I. A (order 0) invalidates B (order 1); both are signalled. CF's __CFRunLoopDoSources0
    /// keeps only the result of the LAST collected source (`sourceHandled = __CFRunLoopDoSource0`
    /// in the loop): B is not performed, so the pass counts as not handled and CF goes to sleep
    /// (beforeWaiting/afterWaiting) to its timeout.
    static let lastCollectedSourceNotPerformed: DiffScenario = { d, t in
        d.traceActivities(t)
        d.keepAlive()
        let bRef = DiffRef<(any DiffSource)?>(nil)
        let a = d.makeSource(order: 0) {
            t("A invalidates B"); bRef.v?.invalidate()
        }
        let b = d.makeSource(order: 1) { t("B") }
        bRef.v = b
        for s in [a, b] { d.add(s, DMode.default); s.signal() }
        t("run: " + d.run(DMode.default, 0.05))
    }

    /// G. CFRunLoopPerformBlock with kCFRunLoopCommonModes makes ("ensures") a mode of that name:
    /// CF's allModes then lists "kCFRunLoopCommonModes".
    static let performCommonMakesMode: DiffScenario = { d, t in
        t("fresh: \(d.allModes)")
        d.perform([DMode.common]) {}
        t("after perform(.common): \(d.allModes)")
        d.perform([DMode.tracking, DMode.common]) {}
        t("after perform([tracking, .common]): \(d.allModes)")
    }

    /// H. fireDate of a timer invalidated before firing, and of a one-shot timer after it fired.
    /// CF: CFRunLoopTimerGetNextFireDate answers 0 (its reference date) for an invalid timer.
    static let fireDateOfDeadTimer: DiffScenario = { d, t in
        let a = d.makeTimer(fireAt: 0.3) { _ in }
        t("A before: \(diffFireDateText(a.fireDate))")
        a.invalidate()
        t("A invalidated: \(diffFireDateText(a.fireDate))")
        let b = d.makeTimer(fireAt: 0.01) { _ in t("B fired") }
        d.add(b, DMode.default)
        t("run: " + d.run(DMode.default, 1.0))
        t("B after firing: valid \(b.isValid), \(diffFireDateText(b.fireDate))")
    }

    /// Cause R (fuzz seed 1573): a run nested in a timer's handler, in the same mode, fires the
    /// other due timers the outer pass collected but has not fired yet (in CF they stay in the
    /// mode); the outer pass then skips them.
    static let nestedRunFiresCollectedTimers: DiffScenario = { d, t in
        d.addCommonMode(DMode.my)
        // Made first: a fire date in the past counts as now, so T0 is due before T1.
        let t0 = d.makeTimer(fireAt: -1, interval: 1000) { _ in
            t("T0 fired; nested run")
            t("nested: " + d.run(DMode.my, 0, rash: true))
        }
        diffBusyWait(microseconds: 20)
        let t1 = d.makeTimer(fireAt: -1) { _ in t("T1 fired") }
        d.add(t1, DMode.my)
        d.add(t0, DMode.common)
        t("run: " + d.run(DMode.my, 0))
        t("T1 valid: \(t1.isValid)")
        t0.invalidate()
    }

    /// Cause Q (fuzz seed 793): an observer that removes itself from its only (common) mode and is
    /// then invalidated (a one-shot observer after its call). CF keeps it in the loop's set of
    /// common items, so `contains(.common)` stays true; RunLoopKit answers false.
    static let invalidatedCommonObserver: DiffScenario = { d, t in
        let o = d.makeObserver(DAct.beforeTimers, repeats: false) { o, _ in
            t("O called")
            d.remove(o, DMode.default)
        }
        let timer = d.makeTimer(fireAt: -1) { _ in t("timer fired") }
        d.add(timer, DMode.common)
        d.add(o, DMode.common)
        t("run: " + d.run(DMode.default, 0))
        t("O valid: \(o.isValid), in .common: \(d.contains(o, DMode.common)), in default: \(d.contains(o, DMode.default))")
    }
}
