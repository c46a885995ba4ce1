import CoreFoundation
import Foundation
import SharedTestSupport
import Testing

@testable import RunLoopKit

import class RunLoopKit.RunLoop

/// Dates and poll runs seen from inside a timer's own pass: the last differences differential
/// fuzzing found between CoreFoundation and RunLoopKit, each run on both.
@Suite struct CalloutDateDiffTests {
    static func rounded(_ seconds: Double) -> String { String(Int(seconds.rounded())) }

    /// A one-shot timer dated 8 s back asks its mode's next timer date in its own callout: the date
    /// given, as outside the callout (PastFireDateDiffTests).
    static func pastOneShotAsksInItsCalloutOnCF() -> [String] {
        let lines = Lines()
        let loop = CFRunLoopGetCurrent()
        let mode = cfhMode("callout-date-diff")
        let start = CFAbsoluteTimeGetCurrent()
        let timer = CFRunLoopTimerCreateWithHandler(nil, start - 8, 0, 0, 0) { timer in
            lines.append("in callout: next timer date \(rounded(CFRunLoopGetNextTimerFireDate(loop, mode) - start))")
            lines.append("in callout: its fireDate \(rounded(CFRunLoopTimerGetNextFireDate(timer) - start))")
        }!
        CFRunLoopAddTimer(loop, timer, mode)
        CFRunLoopRunInMode(mode, 0, false)
        lines.append("after: valid \(CFRunLoopTimerIsValid(timer))")
        return lines.all
    }

    static func pastOneShotAsksInItsCalloutOnRunLoopKit() -> [String] {
        let lines = Lines()
        let loop = RunLoop.current
        let mode: RunLoop.Mode = "callout-date-diff"
        let start = ContinuousClock.now
        @Sendable func seconds(_ instant: ContinuousClock.Instant?) -> String {
            guard let instant else { return "nil" }
            let duration = instant - start
            return rounded(Double(duration.components.seconds) + Double(duration.components.attoseconds) / 1e18)
        }
        let timer = RunLoopTimer(fireAt: start - .seconds(8)) { timer in
            lines.append("in callout: next timer date \(seconds(loop.nextTimerFireDate(forMode: mode)))")
            lines.append("in callout: its fireDate \(seconds(timer.fireDate))")
        }
        loop.add(timer, forMode: mode)
        loop.run(mode: mode, for: .zero)
        lines.append("after: valid \(timer.isValid)")
        return lines.all
    }

    @Test func aPastOneShotAsksTheNextDateInItsCallout() throws {
        let cf = try #require(TestThreads.runBlocking(name: "callout-cf") { Self.pastOneShotAsksInItsCalloutOnCF() })
        let rlk = try #require(TestThreads.runBlocking(name: "callout-rlk") { Self.pastOneShotAsksInItsCalloutOnRunLoopKit() })
        #expect(cf == ["in callout: next timer date -8", "in callout: its fireDate -8", "after: valid false"], "CoreFoundation changed: \(cf)")
        // Before: "next timer date 0", the moment the date was given (the clamped time it fired at).
        #expect(rlk == cf)
    }

    /// A repeating timer dated 8 s back; an observer at `activity` (once) optionally moves it to
    /// 2 s back, then runs the mode nested in a poll run (timeout 0).
    static func pollRunOnCF(activity: CFRunLoopActivity, moveTo: Double?) -> [String] {
        let lines = Lines()
        let loop = CFRunLoopGetCurrent()
        let mode = cfhMode("poll-diff")
        let start = CFAbsoluteTimeGetCurrent()
        let timer = CFRunLoopTimerCreateWithHandler(nil, start - 8, 1000, 0, 0) { _ in lines.append("fired") }!
        CFRunLoopAddTimer(loop, timer, mode)
        let once = Lines()
        let observer = CFRunLoopObserverCreateWithHandler(nil, activity.rawValue, true, 0) { _, _ in
            guard once.all.isEmpty else { return }
            once.append("x")
            if let moveTo { CFRunLoopTimerSetNextFireDate(timer, start + moveTo) }
            lines.append("poll run: \(cfResultName(CFRunLoopRunInMode(mode, 0, false)))")
        }!
        CFRunLoopAddObserver(loop, observer, mode)
        lines.append("outer: \(cfResultName(CFRunLoopRunInMode(mode, 0.2, true)))")
        CFRunLoopObserverInvalidate(observer)
        CFRunLoopTimerInvalidate(timer)
        return lines.all
    }

    static func pollRunOnRunLoopKit(activity: RunLoop.Activity, moveTo: Int64?) -> [String] {
        let lines = Lines()
        let loop = RunLoop.current
        let mode: RunLoop.Mode = "poll-diff"
        let start = ContinuousClock.now
        let timer = RunLoopTimer(fireAt: start - .seconds(8), interval: .seconds(1000)) { _ in lines.append("fired") }
        loop.add(timer, forMode: mode)
        let once = Lines()
        let observer = RunLoopObserver(activities: activity, repeats: true) { _, _ in
            guard once.all.isEmpty else { return }
            once.append("x")
            if let moveTo { timer.fireDate = start + .seconds(moveTo) }
            lines.append("poll run: \(loop.run(mode: mode, for: .zero, returnAfterSourceHandled: false))")
        }
        loop.add(observer, forMode: mode)
        lines.append("outer: \(loop.run(mode: mode, for: .milliseconds(200), returnAfterSourceHandled: true))")
        observer.invalidate()
        timer.invalidate()
        return lines.all
    }

    static func cfResultName(_ result: CFRunLoopRunResult) -> String {
        switch result {
        case .finished: "finished"
        case .stopped: "stopped"
        case .timedOut: "timedOut"
        case .handledSource: "handledSource"
        @unknown default: "?"
        }
    }

    /// A poll run from an observer fires the past-dated timer in the poll run on both, at each
    /// activity, with or without moving the timer to another past date first; but from
    /// afterWaiting with the timer unmoved (`aPollRunFromAfterWaiting_deviation`).
    @Test(arguments: [("entry", 0), ("beforeTimers", 1), ("beforeSources", 2), ("beforeWaiting", 3), ("afterWaiting", 4)], [false, true])
    func aPollRunFromAnObserver(activity: (name: String, index: Int), move: Bool) throws {
        if activity.name == "afterWaiting" && !move { return }
        let (cf, rlk) = try Self.pollRuns(activity.index, move: move)
        #expect(cf == ["fired", "poll run: timedOut", "outer: timedOut"], "CoreFoundation changed: \(cf)")
        #expect(rlk == cf)
    }

    /// DEVIATION (CF fires timers only when its timer port fires): the outer run's wait took the
    /// timer port's wakeup, so CF's poll run from afterWaiting, before the outer pass fires its
    /// timers, sees no port and times out, and the overdue timer fires after it, in the outer
    /// pass. RunLoopKit fires every due timer of the mode in any pass, the poll run's included.
    /// Moving the timer first (a second past date) re-arms CF's port, and CF fires it in the poll
    /// run too (above).
    @Test func aPollRunFromAfterWaiting_deviation() throws {
        let (cf, rlk) = try Self.pollRuns(4, move: false)
        #expect(cf == ["poll run: timedOut", "fired", "outer: timedOut"], "CoreFoundation changed: \(cf)")
        #expect(rlk == ["fired", "poll run: timedOut", "outer: timedOut"])
    }

    static func pollRuns(_ index: Int, move: Bool) throws -> (cf: [String], rlk: [String]) {
        let cfActivities: [CFRunLoopActivity] = [.entry, .beforeTimers, .beforeSources, .beforeWaiting, .afterWaiting]
        let activities: [RunLoop.Activity] = [.entry, .beforeTimers, .beforeSources, .beforeWaiting, .afterWaiting]
        let cf = try #require(TestThreads.runBlocking(name: "poll-cf") { Self.pollRunOnCF(activity: cfActivities[index], moveTo: move ? -2 : nil) })
        let rlk = try #require(TestThreads.runBlocking(name: "poll-rlk") { Self.pollRunOnRunLoopKit(activity: activities[index], moveTo: move ? -2 : nil) })
        return (cf, rlk)
    }
}
