#if GTK
import CGtk
import Foundation
import RunLoopGLib
import RunLoopKit

import class RunLoopKit.RunLoop

/// The seeds' scroll experiment in a real GTK 4 window: an xdotool drag of the scroll bar while a
/// `.default` loop timer, a `.common` loop timer and a GLib timeout count their fires before,
/// during and after the drag. `GLibBridge` drives GTK from `RunLoop.main` in the common modes; the
/// window's drag gesture puts the loop in `.tracking` (``TrackingRuns``) for the drag's duration.
public enum DragExperiment {
    /// Which clock a fire came from.
    public enum Ticker: Int, CaseIterable, Sendable {
        case defaultTimer, commonTimer, glibTimeout

        public var name: String {
            switch self {
            case .defaultTimer: "loop timer added for .default (100 ms)"
            case .commonTimer: "loop timer added for .common (100 ms)"
            case .glibTimeout: "GLib timeout, g_timeout_add (50 ms)"
            }
        }

        public var key: String {
            switch self {
            case .defaultTimer: "default_timer"
            case .commonTimer: "common_timer"
            case .glibTimeout: "glib_timeout"
            }
        }
    }

    /// What one run measured.
    public struct Report: Sendable {
        /// Fires per ticker and phase (0 before, 1 during, 2 after the drag).
        public var fires: [[Int]] = Array(repeating: [0, 0, 0], count: Ticker.allCases.count)
        /// How long each phase lasted, in milliseconds.
        public var phaseMilliseconds: [Int] = [0, 0, 0]
        /// The modes the loop ran in when the `.common` timer fired during the drag.
        public var modesDuringDrag: Set<String> = []
        public var scrollBefore = 0.0, scrollAfter = 0.0, scrollUpper = 0.0
        public var valueChanges = 0
        public var valueChangeDepths: [Int] = []
        public var trackingRunsEntered = 0
        public var dragBegins = 0, dragEnds = 0
        public var pressedAt = (x: 0, y: 0)
        public var screenshotBefore = "", screenshotAfter = ""
        public var differingPixels = -1
        public var xdotoolExit: Int32 = -1

        /// `key=value` lines, for a test to read.
        public var lines: [String] {
            var lines: [String] = []
            for ticker in Ticker.allCases {
                lines.append("\(ticker.key)=\(fires[ticker.rawValue].map(String.init).joined(separator: ","))")
            }
            lines.append("phase_ms=\(phaseMilliseconds.map(String.init).joined(separator: ","))")
            lines.append("modes_during_drag=\(modesDuringDrag.sorted().joined(separator: ","))")
            lines.append("scroll_before=\(scrollBefore)")
            lines.append("scroll_after=\(scrollAfter)")
            lines.append("scroll_upper=\(scrollUpper)")
            lines.append("value_changes=\(valueChanges)")
            lines.append("value_change_depths=\(valueChangeDepths.map(String.init).joined(separator: ","))")
            lines.append("tracking_runs=\(trackingRunsEntered)")
            lines.append("drag_begins=\(dragBegins)")
            lines.append("drag_ends=\(dragEnds)")
            lines.append("xdotool_exit=\(xdotoolExit)")
            lines.append("screenshot_before=\(screenshotBefore)")
            lines.append("screenshot_after=\(screenshotAfter)")
            lines.append("differing_pixels=\(differingPixels)")
            return lines
        }
    }

    /// Why the experiment could not run to its end.
    public struct Failure: Error, CustomStringConvertible {
        public let description: String
    }

    /// The counts, on the main thread only (timers and GLib's timeout fire there).
    ///
    /// `@unchecked Sendable`: the loop's timers (`@Sendable` closures) hold it, and they, the GLib
    /// timeout and the drag's handlers all run on the main thread.
    private final class Tally: @unchecked Sendable {
        var phase = 0
        var report = Report()
        func fire(_ ticker: Ticker) {
            report.fires[ticker.rawValue][phase] += 1
            if ticker == .commonTimer && phase == 1, let mode = RunLoop.main.currentMode {
                report.modesDuringDrag.insert(mode.rawValue)
            }
        }
    }

    /// Runs it on the main thread with GTK started (`GTK.start`): attaches a `GLibBridge` to
    /// `RunLoop.main` for its duration, shows the window, drags, and writes the screenshots
    /// `before-drag.png` and `after-drag.png` into `directory`. `note` gets a line at each step.
    public static func run(screenshotsIn directory: String, note: @escaping (String) -> Void = { _ in }) throws -> Report {
        let bridge = try GLibBridge.attach(to: .main)
        defer { bridge.invalidate() }
        RunLoop.main.addCommonMode(.tracking)
        let driver = MainLoopDriver()
        defer { driver.invalidate() }
        let window = ScrollWindow()
        defer {
            window.destroy()
            driver.run(for: .milliseconds(100))
        }
        let tally = Tally()
        let start = ContinuousClock.now
        func ms(_ instant: ContinuousClock.Instant) -> Int {
            let d = instant - start
            return Int(d.components.seconds * 1000 + d.components.attoseconds / 1_000_000_000_000_000)
        }

        window.present()
        let shown = driver.run(for: .seconds(10)) {
            window.isMapped && window.xWindow != 0 && window.draws > 0 && window.sliderCentre != nil
        }
        guard shown else { throw Failure(description: "the window was not shown within 10 s") }
        driver.run(for: .milliseconds(300))
        guard let slider = window.sliderCentre else { throw Failure(description: "no scroll bar slider") }
        note("window 0x\(String(window.xWindow, radix: 16)) shown at +\(ms(.now)) ms; slider at (\(slider.x), \(slider.y))")

        var report = Report()
        report.screenshotBefore = directory + "/before-drag.png"
        report.screenshotAfter = directory + "/after-drag.png"
        let before = try XTools.startScreenshot(window: window.xWindow, path: report.screenshotBefore)
        let beforeCode = driver.run(until: before, timeout: .seconds(20))
        guard beforeCode == 0 else { throw Failure(description: "import exited with \(beforeCode): \(before.output())") }
        report.scrollBefore = window.scrollValue

        let defaultTimer = RunLoopTimer(after: .milliseconds(100), repeating: .milliseconds(100)) { _ in
            tally.fire(.defaultTimer)
        }
        let commonTimer = RunLoopTimer(after: .milliseconds(100), repeating: .milliseconds(100)) { _ in
            tally.fire(.commonTimer)
        }
        RunLoop.main.add(defaultTimer, forMode: .default)
        RunLoop.main.add(commonTimer, forMode: .common)
        let glibTimeout = g_timeout_add(
            50,
            { data in
                Unmanaged<Tally>.fromOpaque(data!).takeUnretainedValue().fire(.glibTimeout)
                return 1
            }, Unmanaged.passUnretained(tally).toOpaque())
        defer {
            defaultTimer.invalidate()
            commonTimer.invalidate()
            g_source_remove(glibTimeout)
        }
        var phaseStart = ContinuousClock.now
        window.onDragBegin = {
            tally.report.phaseMilliseconds[0] = ms(.now) - ms(phaseStart)
            phaseStart = .now
            tally.phase = 1
            note("drag-begin at +\(ms(.now)) ms (g_main_depth \(g_main_depth())): tracking run requested")
        }
        window.onDragEnd = {
            tally.report.phaseMilliseconds[1] = ms(.now) - ms(phaseStart)
            phaseStart = .now
            tally.phase = 2
            note("drag-end at +\(ms(.now)) ms (g_main_depth \(g_main_depth())): tracking run ends at its next pass")
        }
        note("timers and GLib timeout added at +\(ms(.now)) ms; running .default for 1 s before the drag")
        driver.run(for: .seconds(1))

        note("xdotool: press on the slider, 20 moves of 6 px every 50 ms, release")
        let drag = try XTools.startDrag(window: window.xWindow, from: slider)
        report.xdotoolExit = driver.run(until: drag, timeout: .seconds(20))
        let ended = driver.run(for: .seconds(5)) { window.dragEnds > 0 && !window.tracking.isTracking }
        guard window.dragBegins > 0 else {
            throw Failure(description: "the drag never reached the window (xdotool exit \(report.xdotoolExit): \(drag.output()))")
        }
        guard ended else { throw Failure(description: "the drag did not end within 5 s of xdotool's release") }
        note("back in .default at +\(ms(.now)) ms; running 1.5 s after the drag")
        driver.run(for: .milliseconds(1500))
        tally.report.phaseMilliseconds[2] = ms(.now) - ms(phaseStart)

        let after = try XTools.startScreenshot(window: window.xWindow, path: report.screenshotAfter)
        let afterCode = driver.run(until: after, timeout: .seconds(20))
        guard afterCode == 0 else { throw Failure(description: "import exited with \(afterCode): \(after.output())") }

        report.fires = tally.report.fires
        report.phaseMilliseconds = tally.report.phaseMilliseconds
        report.modesDuringDrag = tally.report.modesDuringDrag
        report.scrollAfter = window.scrollValue
        report.scrollUpper = window.scrollUpper
        report.valueChanges = window.valueChanges
        report.valueChangeDepths = window.valueChangeDepths.sorted()
        report.trackingRunsEntered = window.tracking.runsEntered
        report.dragBegins = window.dragBegins
        report.dragEnds = window.dragEnds
        report.pressedAt = slider
        report.differingPixels = try XTools.differingPixels(report.screenshotBefore, report.screenshotAfter)
        return report
    }
}
#endif
