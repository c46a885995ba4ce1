import Foundation
import SharedTestSupport

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
    static let sourceSignalledByEarlierSource: DiffScenario = { loop, trace in
        loop.traceActivities(trace)
        let s1 = loop.makeSource(order: 1) {
            trace("S1"); loop.stop()
        }
        let s0 = loop.makeSource(order: 0) {
            trace("S0 signals S1"); s1.signal()
        }
        loop.add(s0, DiffMode.default)
        loop.add(s1, DiffMode.default)
        s0.signal()
        trace("run: " + loop.run(DiffMode.default, 1.0))
    }

    // MARK: O. add(item, .common) after the item left one common mode

    /// CFRunLoopAdd{Source,Timer,Observer}(rl, item, kCFRunLoopCommonModes) adds the item to
    /// `_commonModeItems` (a set: no change if it is there) and then adds it to every common mode
    /// (__CFRunLoopAddItemToCommonModes), so an item removed from one common mode goes back into
    /// it. Checked with contains, and by running the mode.
    static let commonReAddSource: DiffScenario = { loop, trace in
        loop.addCommonMode(DiffMode.tracking)
        loop.keepAlive(DiffMode.tracking)
        let source = loop.makeSource(order: 0) { trace("S in \(loop.currentMode ?? "nil")") }
        loop.add(source, DiffMode.common)
        loop.remove(source, DiffMode.tracking)
        trace(
            "after remove: tracking \(loop.contains(source, DiffMode.tracking)) common \(loop.contains(source, DiffMode.common))"
        )
        loop.add(source, DiffMode.common)
        trace(
            "after re-add: tracking \(loop.contains(source, DiffMode.tracking)) common \(loop.contains(source, DiffMode.common))"
        )
        source.signal()
        trace("run tracking: " + loop.run(DiffMode.tracking, 0, returnAfterSourceHandled: true))
    }

    static let commonReAddTimer: DiffScenario = { loop, trace in
        loop.addCommonMode(DiffMode.tracking)
        let timer = loop.makeTimer(fireAt: 3600) { _ in }
        loop.add(timer, DiffMode.common)
        loop.remove(timer, DiffMode.tracking)
        func show(_ label: String) {
            let next = diffFireDateText(loop.nextTimerFireDate(DiffMode.tracking))
            trace("\(label): tracking \(loop.contains(timer, DiffMode.tracking)) next \(next)")
        }
        show("after remove")
        loop.add(timer, DiffMode.common)
        show("after re-add")
        trace("run tracking: " + loop.run(DiffMode.tracking, 0))
    }

    static let commonReAddObserver: DiffScenario = { loop, trace in
        loop.addCommonMode(DiffMode.tracking)
        loop.keepAlive(DiffMode.tracking)
        let observer = loop.makeObserver(DiffActivity.entry | DiffActivity.exit, repeats: true, order: 0) {
            _, activity in
            trace("O \(DiffActivity.name(activity)) in \(loop.currentMode ?? "nil")")
        }
        loop.add(observer, DiffMode.common)
        loop.remove(observer, DiffMode.tracking)
        trace("after remove: tracking \(loop.contains(observer, DiffMode.tracking))")
        loop.add(observer, DiffMode.common)
        trace("after re-add: tracking \(loop.contains(observer, DiffMode.tracking))")
        trace("run tracking: " + loop.run(DiffMode.tracking, 0))
    }

    // MARK: P. remove(timer, forMode:) inside the timer's own handler

    /// A repeating timer (interval 1 s) removes itself from a mode it is not in, in its first
    /// call. CF: CFRunLoopRemoveTimer finds nothing to do; after the callout __CFRunLoopDoTimer
    /// moves the timer to its next fire point (1 s later), so the 50 ms run sees one fire.
    static let removeTimerFromOtherModeInOwnHandler: DiffScenario = { loop, trace in
        let calls = DiffRef(0)
        let timer = loop.makeTimer(fireAt: 0.001, interval: 1.0) { timer in
            calls.value += 1
            trace("fire #\(calls.value)")
            if calls.value == 1 { loop.remove(timer, DiffMode.my) }
        }
        loop.add(timer, DiffMode.default)
        loop.keepAlive()
        trace("run: " + loop.run(DiffMode.default, 0.05))
        trace("valid: \(timer.isValid) next \(diffFireDateText(loop.nextTimerFireDate(DiffMode.default)))")
    }

    /// The same timer, in default and tracking, removes itself from default in its first call.
    /// CF reschedules it in the modes it is still in (tracking) at its next point, 1 s later: a
    /// 50 ms tracking run sees no fire.
    static let removeTimerFromOwnModeInOwnHandler: DiffScenario = { loop, trace in
        let calls = DiffRef(0)
        let timer = loop.makeTimer(fireAt: 0.001, interval: 1.0) { timer in
            calls.value += 1
            trace("fire #\(calls.value) in \(loop.currentMode ?? "nil")")
            if calls.value == 1 { loop.remove(timer, DiffMode.default) }
        }
        loop.add(timer, DiffMode.default)
        loop.add(timer, DiffMode.tracking)
        loop.keepAlive()
        loop.keepAlive(DiffMode.tracking)
        trace("run default: " + loop.run(DiffMode.default, 0.05))
        trace("run tracking: " + loop.run(DiffMode.tracking, 0.05))
        trace(
            "in default \(loop.contains(timer, DiffMode.default)), in tracking \(loop.contains(timer, DiffMode.tracking))"
        )
    }

    // MARK: J. Wakeups requested inside a nested run

    /// The outer run's beforeWaiting observer runs a nested timeout-0 run in MyMode whose source
    /// calls wakeUp(). CF: the wakeup is written to the loop's wakeup eventfd (the nested run
    /// accepts wakeups before its wait), and the nested run's poll (__CFRunLoopServiceFileDescriptors
    /// with timeout 0) reads it. The outer run then sleeps to its 100 ms timeout: one
    /// beforeWaiting/afterWaiting pair.
    static let wakeUpInNestedPollRun: DiffScenario = { loop, trace in
        loop.keepAlive()
        let inner = loop.makeSource(order: 0) {
            trace("inner source wakes the loop"); loop.wakeUp()
        }
        loop.add(inner, DiffMode.my)
        let once = DiffRef(false)
        let observer = loop.makeObserver(DiffActivity.all, repeats: true, order: 0) { _, activity in
            trace(DiffActivity.name(activity))
            if activity == DiffActivity.beforeWaiting && !once.value {
                once.value = true
                inner.signal()
                trace("nested: " + loop.run(DiffMode.my, 0))
            }
        }
        loop.add(observer, DiffMode.default)
        trace("run: " + loop.run(DiffMode.default, 0.1))
    }

    /// The outer run's beforeWaiting observer runs a nested run in MyMode whose timer (due after
    /// 5 ms) calls wakeUp() and stop(). CF: that happens after the nested run's wait, while
    /// wakeups are ignored (__CFRunLoopSetIgnoreWakeUps after every wait): nothing is written, and
    /// the outer run sleeps to its 100 ms timeout.
    static let wakeUpAfterNestedWait: DiffScenario = { loop, trace in
        loop.keepAlive()
        loop.keepAlive(DiffMode.my)
        let once = DiffRef(false)
        let observer = loop.makeObserver(DiffActivity.all, repeats: true, order: 0) { _, activity in
            trace(DiffActivity.name(activity))
            if activity == DiffActivity.beforeWaiting && !once.value {
                once.value = true
                let timer = loop.makeTimer(fireAt: loop.now() + 0.005) { _ in
                    trace("inner timer wakes and stops the loop"); loop.wakeUp(); loop.stop()
                }
                loop.add(timer, DiffMode.my)
                trace("nested: " + loop.run(DiffMode.my, 1.0))
            }
        }
        loop.add(observer, DiffMode.default)
        trace("run: " + loop.run(DiffMode.default, 0.1))
    }

    // MARK: C. A wakeup or stop requested outside a wait

    /// wakeUp() from the entry observer. CF: a run starts with wakeups accepted (a fresh
    /// per-run record, ignoreWakeUps = 0), so the eventfd is written; nothing reads it until the
    /// first wait, whose sleep then returns at once. The run iterates and sleeps to its timeout.
    static let wakeUpInEntryObserver: DiffScenario = { loop, trace in
        loop.keepAlive()
        let observer = loop.makeObserver(DiffActivity.all, repeats: true, order: 0) { _, activity in
            trace(DiffActivity.name(activity))
            if activity == DiffActivity.entry { loop.wakeUp() }
        }
        loop.add(observer, DiffMode.default)
        trace("run: " + loop.run(DiffMode.default, 0.1))
    }

    /// wakeUp() from a beforeSources observer, in a pass that handles no source. CF: written
    /// (wakeups are accepted from the start of a pass), read by that pass's own sleep, which
    /// returns at once.
    static let wakeUpInBeforeSources: DiffScenario = { loop, trace in
        loop.keepAlive()
        let once = DiffRef(false)
        let observer = loop.makeObserver(DiffActivity.all, repeats: true, order: 0) { _, activity in
            trace(DiffActivity.name(activity))
            if activity == DiffActivity.beforeSources && !once.value { once.value = true; loop.wakeUp() }
        }
        loop.add(observer, DiffMode.default)
        trace("run: " + loop.run(DiffMode.default, 0.1))
    }

    /// stop() from the entry observer. CF: CFRunLoopStop marks the run stopped and wakes the
    /// loop (written: the run accepts wakeups). __CFRunLoopRun sees the stop before its first
    /// pass: run 1 returns stopped with no pass, and the wakeup stays in the eventfd. Run 2 is a
    /// new run, but the same eventfd: its first sleep returns at once.
    static let stopInEntryObserver: DiffScenario = { loop, trace in
        loop.keepAlive()
        let runs = DiffRef(0)
        let observer = loop.makeObserver(DiffActivity.all, repeats: true, order: 0) { _, activity in
            trace(DiffActivity.name(activity))
            if activity == DiffActivity.entry {
                runs.value += 1
                if runs.value == 1 { loop.stop() }
            }
        }
        loop.add(observer, DiffMode.default)
        trace("run 1: " + loop.run(DiffMode.default, 0.1))
        trace("run 2: " + loop.run(DiffMode.default, 0.1))
    }

    /// Wakeups requested while CF ignores them: after a wait (afterWaiting observer, timer
    /// handler) until the next pass starts, and in the exit observer of a run that has waited
    /// (__CFRunLoopSetIgnoreWakeUps after every wait; the per-run record is fresh, accepting
    /// wakeups, only when a run starts). None of them shortens a later sleep: one
    /// beforeWaiting/afterWaiting pair per sleep that a timer or a timeout ends.
    static let wakeUpWhileIgnored: DiffScenario = { loop, trace in
        loop.keepAlive()
        let firstAfterWaiting = DiffRef(true)
        let runs = DiffRef(0)
        let observer = loop.makeObserver(DiffActivity.all, repeats: true, order: 0) { _, activity in
            trace(DiffActivity.name(activity))
            if activity == DiffActivity.entry { runs.value += 1 }
            if activity == DiffActivity.afterWaiting && firstAfterWaiting.value {
                firstAfterWaiting.value = false
                loop.wakeUp()
            }
            if activity == DiffActivity.exit && runs.value == 1 { loop.wakeUp() }
        }
        loop.add(observer, DiffMode.default)
        let timer = loop.makeTimer(fireAt: 0.005) { _ in
            trace("timer wakes the loop"); loop.wakeUp()
        }
        loop.add(timer, DiffMode.default)
        trace("run 1: " + loop.run(DiffMode.default, 0.1))
        trace("run 2: " + loop.run(DiffMode.default, 0.05))
    }

    // MARK: A. Fire dates in the past

    /// CFRunLoopTimerCreate and CFRunLoopTimerSetNextFireDate turn a past date into "now"
    /// (`_fireTSR = mach_absolute_time()`), so overdue timers are ordered by when they were created
    /// or set, not by their dates. (CF keeps the date as given in `_nextFireDate`, which is what
    /// CFRunLoopTimerGetNextFireDate answers.)
    static let pastFireDatesFireInCreationOrder: DiffScenario = { loop, trace in
        let a = loop.makeTimer(fireAt: -0.010) { _ in trace("A (created first, date -10 ms)") }
        diffBusyWait(microseconds: 50)
        let b = loop.makeTimer(fireAt: -0.020) { _ in trace("B (created second, date -20 ms)") }
        loop.add(b, DiffMode.default)
        loop.add(a, DiffMode.default)
        let c = loop.makeTimer(fireAt: 3600) { _ in trace("C (set first, to -10 ms)") }
        let e = loop.makeTimer(fireAt: 3601) { _ in trace("E (set second, to -20 ms)") }
        loop.add(e, DiffMode.default)
        loop.add(c, DiffMode.default)
        c.setFireDate(-0.010)
        diffBusyWait(microseconds: 50)
        e.setFireDate(-0.020)
        trace("run: " + loop.run(DiffMode.default, 1.0))
    }

    /// A repeating timer (interval 100 ms) created with a date 35 ms in the past: CF's schedule
    /// counts from the clamped date (creation time), so its second fire comes ~100 ms after the
    /// epoch, not at -35 + 100 = 65 ms. "at >= 90 ms" is a lower bound on real time.
    static let pastFireDateRepeatingPhase: DiffScenario = { loop, trace in
        let calls = DiffRef(0)
        let timer = loop.makeTimer(fireAt: -0.035, interval: 0.1) { timer in
            calls.value += 1
            if calls.value == 2 {
                trace("second fire at >= 90 ms: \(loop.now() >= 0.09)")
                timer.invalidate()
            } else {
                trace("fire #\(calls.value)")
            }
        }
        loop.add(timer, DiffMode.default)
        trace("run: " + loop.run(DiffMode.default, 1.0))
    }

    // MARK: B. Equal-order Source0s

    /// Three order-0 sources added X, Y, Z and signalled Z, Y, X (with distinct clock readings),
    /// then X again. CF's __CFRunLoopSourceComparator sorts by order, then by `_signaledTime`
    /// (the `mach_absolute_time()` of the first signal since the last perform: a repeated signal
    /// keeps it). So: Z, Y, X.
    static let equalOrderSourcesBySignalTime: DiffScenario = { loop, trace in
        let x = loop.makeSource(order: 0) { trace("X") }
        let y = loop.makeSource(order: 0) { trace("Y") }
        let z = loop.makeSource(order: 0) { trace("Z") }
        for source in [x, y, z] { loop.add(source, DiffMode.default) }
        z.signal()
        diffBusyWait(microseconds: 50)
        y.signal()
        diffBusyWait(microseconds: 50)
        x.signal()
        diffBusyWait(microseconds: 50)
        z.signal()  // already signalled: keeps its first signal time
        trace("run 1: " + loop.run(DiffMode.default, 0))
        // Signalled X, Z, Y: performed in that order.
        x.signal()
        diffBusyWait(microseconds: 50)
        z.signal()
        diffBusyWait(microseconds: 50)
        y.signal()
        trace("run 2: " + loop.run(DiffMode.default, 0))
    }

    // MARK: N. A due timer's fire date set by an earlier timer of the same pass

    /// A and B are both overdue when the run starts. A's handler sets B's fire date to now (still
    /// due). CF's __CFRunLoopDoTimers collected both before firing; __CFRunLoopDoTimer fires B
    /// because its (new) `_fireTSR` is still <= now: same pass (no beforeWaiting in between).
    static let dueTimerMovedByEarlierTimer: DiffScenario = { loop, trace in
        loop.traceActivities(trace)
        let bRef = DiffRef<(any DiffTimer)?>(nil)
        let a = loop.makeTimer(fireAt: 0.001) { _ in
            trace("A sets B's fire date to now"); bRef.value?.setFireDate(loop.now())
        }
        let b = loop.makeTimer(fireAt: 0.002) { _ in
            trace("B"); loop.stop()
        }
        bRef.value = b
        loop.add(a, DiffMode.default)
        loop.add(b, DiffMode.default)
        loop.keepAlive()
        usleep(10_000)  // both overdue before the run starts
        trace("run: " + loop.run(DiffMode.default, 1.0))
    }

    // MARK: L. nextTimerFireDate inside a timer's callout

    /// CFRunLoopGetNextTimerFireDate answers the `_nextFireDate` of the first timer of the mode's
    /// sorted array. A firing timer stays in that array, with its old date, until
    /// __CFRunLoopDoTimer reschedules it after the callout: so inside its own callout it is still
    /// the answer (for the repeating A and the one-shot C alike).
    static let nextTimerFireDateInCallout: DiffScenario = { loop, trace in
        let a = loop.makeTimer(fireAt: 0.01, interval: 10) { timer in
            trace("in A: next \(diffFireDateText(loop.nextTimerFireDate(DiffMode.default)))")
            timer.invalidate()
        }
        let b = loop.makeTimer(fireAt: 0.5) { _ in trace("B") }
        let c = loop.makeTimer(fireAt: 0.02) { _ in
            trace("in C: next \(diffFireDateText(loop.nextTimerFireDate(DiffMode.default)))")
            loop.stop()
        }
        for timer in [a, b, c] { loop.add(timer, DiffMode.default) }
        trace("run: " + loop.run(DiffMode.default, 1.0))
        trace("after: next \(diffFireDateText(loop.nextTimerFireDate(DiffMode.default)))")
    }

    // MARK: Deviations kept (F D E I G H)

    /// F. The beforeWaiting observer calls wakeUp() and then waits until a timer (due 2 ms after
    /// the start) is overdue: both the wakeup eventfd and the mode's timerfd are ready, the
    /// eventfd first in epoll's ready list. CF takes one event per wait (epoll_wait with
    /// maxevents 1): the wakeup; it does not look at timers after a wakeup-port wake. The timer
    /// fires only after the next wait, which the timerfd ends at once.
    static let dueTimerAfterWakeUpWait: DiffScenario = { loop, trace in
        loop.traceActivities(trace, prefix: "")
        let once = DiffRef(false)
        let observer = loop.makeObserver(DiffActivity.beforeWaiting, repeats: true, order: 1) { _, _ in
            if !once.value {
                once.value = true
                loop.wakeUp()
                usleep(10_000)  // the timer is overdue before the sleep starts
                trace("woken, timer overdue")
            }
        }
        loop.add(observer, DiffMode.default)
        let timer = loop.makeTimer(fireAt: loop.now() + 0.002) { _ in
            trace("timer"); loop.stop()
        }
        loop.add(timer, DiffMode.default)
        trace("run: " + loop.run(DiffMode.default, 1.0))
    }

    /// D. A timer (due 20 ms) is invalidated before the run. CF on Linux never disarms the mode's
    /// timerfd (`_mkTimerArmed` is set only where dispatch timers are used), so at 20 ms the
    /// 100 ms run wakes for nothing: an extra beforeWaiting/afterWaiting pair.
    static let invalidatedTimerSpuriousWakeUp: DiffScenario = { loop, trace in
        loop.traceActivities(trace)
        loop.keepAlive()
        let timer = loop.makeTimer(fireAt: 0.02) { _ in trace("timer") }
        loop.add(timer, DiffMode.default)
        timer.invalidate()
        trace("run: " + loop.run(DiffMode.default, 0.1))
    }

    /// D, second face. The mode's only source is removed by the beforeWaiting observer; a timer
    /// due at 20 ms was invalidated before the run. RunLoopKit sleeps to the 150 ms timeout
    /// (timedOut is checked before finished). CF's armed timerfd wakes it at 20 ms with the mode
    /// empty and the timeout not passed: finished.
    static let invalidatedTimerFinishesEmptyMode: DiffScenario = { loop, trace in
        loop.traceActivities(trace)
        let source = loop.makeSource(order: 0) { trace("source") }
        loop.add(source, DiffMode.default)
        let timer = loop.makeTimer(fireAt: 0.02) { _ in trace("timer") }
        loop.add(timer, DiffMode.default)
        timer.invalidate()
        let observer = loop.makeObserver(DiffActivity.beforeWaiting, repeats: false, order: 1) { _, _ in
            loop.remove(source, DiffMode.default)
        }
        loop.add(observer, DiffMode.default)
        trace("run: " + loop.run(DiffMode.default, 0.15))
    }

    /// E. CF implements a run's timeout with a dispatch timer that calls CFRunLoopWakeUp once.
    /// Here the outer run (timeout 20 ms) runs a nested 300 ms run from its beforeWaiting
    /// observer: the outer run's one wakeup lands in the nested run, and the outer run then
    /// sleeps with nothing left to wake it. A rescue timer at 1.5 s wakes it in this scenario
    /// (without it CF would sleep forever); RunLoopKit's sleep ends at the outer deadline, which
    /// has passed, and the rescue never fires.
    static let nestedRunEatsTimeout: DiffScenario = { loop, trace in
        loop.keepAlive(DiffMode.my)
        let start = loop.now()
        let rescue = loop.makeTimer(fireAt: start + 1.5) { _ in trace("rescue timer fired") }
        loop.add(rescue, DiffMode.default)
        let once = DiffRef(false)
        let observer = loop.makeObserver(DiffActivity.all, repeats: true, order: 0) { _, activity in
            trace(DiffActivity.name(activity))
            if activity == DiffActivity.beforeWaiting && !once.value {
                once.value = true
                trace("nested: " + loop.run(DiffMode.my, 0.3))
            }
        }
        loop.add(observer, DiffMode.default)
        trace("run: " + loop.run(DiffMode.default, 0.02))
        trace("outer run overran its timeout by >= 1 s: \(loop.now() - start >= 1.02)")
        rescue.invalidate()
    }

    /// I. A (order 0) invalidates B (order 1); both are signalled. CF's __CFRunLoopDoSources0
    /// keeps only the result of the LAST collected source (`sourceHandled = __CFRunLoopDoSource0`
    /// in the loop): B is not performed, so the pass counts as not handled and CF goes to sleep
    /// (beforeWaiting/afterWaiting) to its timeout.
    static let lastCollectedSourceNotPerformed: DiffScenario = { loop, trace in
        loop.traceActivities(trace)
        loop.keepAlive()
        let bRef = DiffRef<(any DiffSource)?>(nil)
        let a = loop.makeSource(order: 0) {
            trace("A invalidates B"); bRef.value?.invalidate()
        }
        let b = loop.makeSource(order: 1) { trace("B") }
        bRef.value = b
        for source in [a, b] { loop.add(source, DiffMode.default); source.signal() }
        trace("run: " + loop.run(DiffMode.default, 0.05))
    }

    /// G. CFRunLoopPerformBlock with kCFRunLoopCommonModes makes ("ensures") a mode of that name:
    /// CF's allModes then lists "kCFRunLoopCommonModes".
    static let performCommonMakesMode: DiffScenario = { loop, trace in
        trace("fresh: \(loop.allModes)")
        loop.perform([DiffMode.common]) {}
        trace("after perform(.common): \(loop.allModes)")
        loop.perform([DiffMode.tracking, DiffMode.common]) {}
        trace("after perform([tracking, .common]): \(loop.allModes)")
    }

    /// H. fireDate of a timer invalidated before firing, and of a one-shot timer after it fired.
    /// CF: CFRunLoopTimerGetNextFireDate answers 0 (its reference date) for an invalid timer.
    static let fireDateOfDeadTimer: DiffScenario = { loop, trace in
        let a = loop.makeTimer(fireAt: 0.3) { _ in }
        trace("A before: \(diffFireDateText(a.fireDate))")
        a.invalidate()
        trace("A invalidated: \(diffFireDateText(a.fireDate))")
        let b = loop.makeTimer(fireAt: 0.01) { _ in trace("B fired") }
        loop.add(b, DiffMode.default)
        trace("run: " + loop.run(DiffMode.default, 1.0))
        trace("B after firing: valid \(b.isValid), \(diffFireDateText(b.fireDate))")
    }

    /// Cause R (fuzz seed 1573): a run nested in a timer's handler, in the same mode, fires the
    /// other due timers the outer pass collected but has not fired yet (in CF they stay in the
    /// mode); the outer pass then skips them.
    static let nestedRunFiresCollectedTimers: DiffScenario = { loop, trace in
        loop.addCommonMode(DiffMode.my)
        // Made first: a fire date in the past counts as now, so T0 is due before T1.
        let t0 = loop.makeTimer(fireAt: -1, interval: 1000) { _ in
            trace("T0 fired; nested run")
            trace("nested: " + loop.run(DiffMode.my, 0, returnAfterSourceHandled: true))
        }
        diffBusyWait(microseconds: 20)
        let t1 = loop.makeTimer(fireAt: -1) { _ in trace("T1 fired") }
        loop.add(t1, DiffMode.my)
        loop.add(t0, DiffMode.common)
        trace("run: " + loop.run(DiffMode.my, 0))
        trace("T1 valid: \(t1.isValid)")
        t0.invalidate()
    }

    /// Cause Q (fuzz seed 793): an observer that removes itself from its only (common) mode and is
    /// then invalidated (a one-shot observer after its call). CF keeps it in the loop's set of
    /// common items, so `contains(.common)` stays true; RunLoopKit answers false.
    static let invalidatedCommonObserver: DiffScenario = { loop, trace in
        let observer = loop.makeObserver(DiffActivity.beforeTimers, repeats: false) { observer, _ in
            trace("O called")
            loop.remove(observer, DiffMode.default)
        }
        let timer = loop.makeTimer(fireAt: -1) { _ in trace("timer fired") }
        loop.add(timer, DiffMode.common)
        loop.add(observer, DiffMode.common)
        trace("run: " + loop.run(DiffMode.default, 0))
        trace(
            "O valid: \(observer.isValid), in .common: \(loop.contains(observer, DiffMode.common)), in default: \(loop.contains(observer, DiffMode.default))"
        )
    }

    /// Fuzz seeds 1743 and 2024: a repeating timer with a past fire date that removes itself from
    /// its mode (or invalidates itself) in its handler, then asks for the mode's next fire date.
    /// CF's mode no longer lists it: nil. (RunLoopKit counted the firing timer until its batch
    /// ended.)
    static let firingTimerThatLeavesItsMode: DiffScenario = { loop, trace in
        loop.addCommonMode(DiffMode.my)
        let removed = loop.makeTimer(fireAt: -1, interval: 1000) { timer in
            loop.remove(timer, DiffMode.default)
            trace("removed itself; next in default: \(diffFireDateText(loop.nextTimerFireDate(DiffMode.default)))")
        }
        loop.add(removed, DiffMode.default)
        trace("run: " + loop.run(DiffMode.default, 0, returnAfterSourceHandled: true))
        let invalidated = loop.makeTimer(fireAt: -1, interval: 1010) { timer in
            timer.invalidate()
            trace("invalidated itself; next in my: \(diffFireDateText(loop.nextTimerFireDate(DiffMode.my)))")
        }
        loop.add(invalidated, DiffMode.common)
        trace("run: " + loop.run(DiffMode.my, 0))
        removed.invalidate()
    }
}
