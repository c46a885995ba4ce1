#if GLib
import RunLoopGLib
import RunLoopKit
import SharedTestSupport
import Synchronization
import Testing

import class RunLoopKit.RunLoop

/// A count shared by a scenario's `@Sendable` callouts.
final class TrackingCount: Sendable {
    private let value = Atomic<Int>(0)
    var get: Int { value.load(ordering: .relaxed) }
    func set(_ new: Int) { value.store(new, ordering: .relaxed) }
    @discardableResult
    func increment() -> Int { value.add(1, ordering: .relaxed).newValue }
}

/// What a scenario's callouts saw, in order (loop thread only, read after the thread ended).
final class TrackingLog: Sendable {
    private let lines = Mutex<[String]>([])
    func note(_ line: String) { lines.locked { $0.append(line) } }
    var all: [String] { lines.locked { $0 } }
}

/// TrackingRuns without GTK: a gesture's begin and end are called from a loop timer's callout, as
/// GTK calls a GtkGestureDrag's handlers from GLib's dispatch (a callout of the loop).
@Suite struct TrackingRunsTests {
    /// `begin` inside a callout only asks: the callout returns in `.default`, then the loop enters
    /// `.tracking` (a `.default` timer stops, a `.common` one fires there), and `end` ends it at
    /// its next pass.
    @Test func theRunIsEnteredAfterTheCalloutThatBeganIt() async {
        let log = await TestThreads.run(name: "tracking-runs") { () -> [String] in
            let loop = RunLoop.current
            let log = TrackingLog()
            let tracking = TrackingRuns(loop: loop)
            let defaultFires = TrackingCount()
            let commonInTracking = TrackingCount()
            let ended = TrackingCount()
            let ticker = RunLoopTimer(after: .milliseconds(5), repeating: .milliseconds(5)) { _ in
                defaultFires.increment()
            }
            loop.add(ticker, forMode: .default)
            let common = RunLoopTimer(after: .milliseconds(5), repeating: .milliseconds(5)) { _ in
                if loop.currentMode == .tracking { commonInTracking.increment() }
            }
            loop.add(common, forMode: .common)
            loop.add(
                RunLoopTimer(after: .milliseconds(20)) { _ in
                    tracking.begin()
                    log.note("begin returned in \(loop.currentMode!.rawValue), tracking \(tracking.isTracking)")
                }, forMode: .default)
            // Ends the gesture (twice: the second does nothing) from a tracking-mode callout once
            // the common timer has fired three times in the run.
            let ender = RunLoopObserver(activities: .beforeWaiting, repeats: true) { _, _ in
                guard commonInTracking.get >= 3, ended.increment() == 1 else { return }
                log.note("in .tracking: .common timer fired, .default timer fired \(defaultFires.get) times")
                tracking.end()
                tracking.end()
            }
            loop.add(
                RunLoopObserver(activities: .entry, repeats: true) { _, _ in
                    guard loop.currentMode == .tracking else { return }
                    defaultFires.set(0)
                    log.note("entered .tracking, tracking \(tracking.isTracking)")
                }, forMode: .tracking)
            loop.add(ender, forMode: .tracking)
            loop.add(
                RunLoopObserver(activities: .exit, repeats: true) { _, _ in
                    guard loop.currentMode == .tracking else { return }
                    log.note("left .tracking")
                }, forMode: .tracking)
            loop.run(mode: .default, for: .seconds(2), returnAfterSourceHandled: false, until: { tracking.runsEntered == 1 && !tracking.isTracking })
            log.note("runs entered \(tracking.runsEntered), cut short \(tracking.runsCutShort), tracking \(tracking.isTracking)")
            ticker.invalidate()
            common.invalidate()
            return log.all
        }
        #expect(
            log == [
                "begin returned in kCFRunLoopDefaultMode, tracking false",
                "entered .tracking, tracking true",
                "in .tracking: .common timer fired, .default timer fired 0 times",
                "left .tracking",
                "runs entered 1, cut short 0, tracking false",
            ])
    }

    /// An `end` before the loop got to the entry (a click shorter than one pass) enters no run; an
    /// `end` without a `begin` does nothing.
    @Test func anEndBeforeTheEntryEntersNothing() async {
        let entered = await TestThreads.run(name: "tracking-runs") { () -> Int in
            let loop = RunLoop.current
            let tracking = TrackingRuns(loop: loop)
            tracking.end(7)
            loop.add(
                RunLoopTimer(after: .milliseconds(1)) { _ in
                    tracking.begin()
                    tracking.end()
                    tracking.end()
                }, forMode: .default)
            loop.run(mode: .default, for: .milliseconds(50))
            return tracking.runsEntered
        }
        #expect(entered == 0)
    }

    /// Two overlapping gestures: the run lasts until both have ended; a second `begin` of one
    /// enters no second run.
    @Test func overlappingGesturesShareOneRun() async {
        let log = await TestThreads.run(name: "tracking-runs") { () -> [String] in
            let loop = RunLoop.current
            let log = TrackingLog()
            let tracking = TrackingRuns(loop: loop)
            let step = TrackingCount()
            let driver = RunLoopTimer(after: .milliseconds(2), repeating: .milliseconds(2)) { _ in
                switch step.increment() {
                case 1:
                    tracking.begin(1)
                    tracking.begin(2)
                    tracking.begin(1)
                case 5:
                    tracking.end(1)
                    log.note("gesture 1 ended")
                case 10:
                    log.note("tracking after gesture 1 ended: \(tracking.isTracking), in \(loop.currentMode!.rawValue)")
                    tracking.end(2)
                    log.note("gesture 2 ended")
                default: break
                }
            }
            loop.add(driver, forMode: .common)
            loop.run(mode: .default, for: .seconds(2), returnAfterSourceHandled: false, until: { step.get >= 15 })
            log.note("runs entered \(tracking.runsEntered), tracking \(tracking.isTracking)")
            driver.invalidate()
            return log.all
        }
        #expect(
            log == [
                "gesture 1 ended",
                "tracking after gesture 1 ended: true, in UITrackingRunLoopMode",
                "gesture 2 ended",
                "runs entered 1, tracking false",
            ])
    }

    /// A gesture whose end never comes: the run ends after `limit`, counted as cut short, and the
    /// gesture is forgotten (the next `begin` enters a new run).
    @Test func aGestureThatNeverEndsIsCutShortAtTheLimit() async {
        let counts = await TestThreads.run(name: "tracking-runs") { () -> [Int] in
            let loop = RunLoop.current
            let tracking = TrackingRuns(loop: loop, limit: .milliseconds(50))
            loop.add(RunLoopTimer(after: .milliseconds(1)) { _ in tracking.begin() }, forMode: .default)
            let start = ContinuousClock.now
            loop.run(mode: .default, for: .seconds(5), returnAfterSourceHandled: false, until: { tracking.runsCutShort == 1 && !tracking.isTracking })
            let elapsed = ContinuousClock.now - start
            return [tracking.runsEntered, tracking.runsCutShort, elapsed >= .milliseconds(50) ? 1 : 0]
        }
        #expect(counts == [1, 1, 1])
    }
}

extension RunLoop {
    /// Runs in `mode` until `done()` holds (read after each pass that handled something or timed
    /// out) or `timeout` passes: the tests' bounded wait for a loop-thread condition.
    fileprivate func run(mode: Mode, for timeout: Duration, returnAfterSourceHandled: Bool, until done: () -> Bool) {
        let deadline = ContinuousClock.now + timeout
        while !done() && ContinuousClock.now < deadline {
            // Short slices: the conditions here change in timer callouts, which end no run.
            run(mode: mode, for: .milliseconds(10), returnAfterSourceHandled: returnAfterSourceHandled)
        }
    }
}
#endif
