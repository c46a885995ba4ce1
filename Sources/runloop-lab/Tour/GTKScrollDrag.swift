import ArgumentParser
import Foundation
import Glibc
#if GTK
import GTKScrollDemo
#endif

/// Experiment 24 (seeds 000, 004; GTK, Xvfb and xdotool from elsewhere): the seeds' "NSTimer
/// stops while scrolling" in a real GTK 4 window under Xvfb, driven by an xdotool drag of its
/// scroll bar. Needs the package traits GLib and GTK; runs in a child process (GTK is started
/// once per process, on its main thread).
struct GTKScrollDrag: Experiment {
    let title = "NSTimer stops while scrolling, in a real GTK 4 window dragged under Xvfb"
    let seed = Seed.cite(0, 4)
    let seedSays = """
        Seed 000 (NSTimer定时器不准, 原因): "模式的切换,当创建的timer被加入到NSDefaultRunLoopMode时,此时如果有滑动UIScrollView的操作时,\
        runloop的mode会切换为TrackingRunloopMode,这时tiemr会停止回调" (a mode switch: when the timer was \
        added to NSDefaultRunLoopMode and a UIScrollView is dragged, the run loop switches to \
        TrackingRunloopMode and the timer stops calling back), and its cure, "添加定时器到主线程的CommonMode中" \
        (add the timer to the main thread's common modes). Seed 004: "滑动 scrollView 时，主线程的 RunLoop \
        会切换到 `UITrackingRunLoopMode` ，只执行这个 Mode 下的任务，而 timer 是添加在 `NSDefaultRunLoopMode` \
        下的，所以不会执行。" (while a scrollView is dragged the main RunLoop switches to \
        UITrackingRunLoopMode and runs only that mode's work; the timer, added in \
        NSDefaultRunLoopMode, does not run), and "将 timer 放到 `NSRunLoopCommonModes ` 中执行即可解决这一问题。" \
        (putting the timer in NSRunLoopCommonModes solves it). The seeds are about UIKit on iOS. \
        Everything else here is from elsewhere, not from the seeds: GTK 4, its GtkScrolledWindow and \
        GtkGestureDrag, GLib and its g_timeout_add, Xvfb, xdotool and ImageMagick, RunLoopKit's \
        GLibBridge, and the timings.
        """
    let summary = """
        A child process starts Xvfb (a display of its own), starts GTK 4 on it and attaches \
        GLibBridge to RunLoop.main in the common modes, which include .tracking, as UIKit's \
        do. It shows a window with a GtkScrolledWindow of 150 rows. Three clocks count their \
        fires: a 100 ms loop timer added for .default (the seeds' NSTimer), the same added \
        for .common (their cure), and a 50 ms GLib timeout (g_timeout_add, GTK's own kind of \
        timer, served through the bridge). After 1 s, xdotool presses on the scroll bar's \
        slider, moves it 120 px down in 20 steps 50 ms apart, and releases. GTK 4 runs no \
        nested loop while it is dragged: a GtkGestureDrag's drag-begin only asks TrackingRuns \
        for a .tracking run. The loop enters it at the top of the loop, once GLib's dispatch of \
        the press has returned and GTK has given the press to the scroll bar. (Entering it \
        inside drag-begin starved the scroll bar of that press: the view did not move, \
        measured when the bridge was designed.) drag-end ends the run. The counts are before, during and after the \
        drag, beside the scroll position, the g_main_depth of each value-changed signal, and a \
        screenshot of the window before and after the drag.
        """

    func run() {
        #if GTK
        let missing = ["Xvfb", "xdotool", "import", "compare"].filter { ToolProcess.find($0) == nil }
        guard missing.isEmpty else {
            Out.paragraph("""
                This experiment needs \(missing.joined(separator: ", ")), which are not installed \
                (Debian: apt-get install xvfb xdotool imagemagick libgtk-4-dev), then \
                `swift run --traits GLib,GTK runloop-lab tour --only 24`.
                """, indent: 2)
            return
        }
        let directory = ProcessInfo.processInfo.environment["RUNLOOP_LAB_SCREENSHOTS"]
            ?? NSTemporaryDirectory() + "runloop-lab-24-\(getpid())"
        try? FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        let process = Process()
        process.executableURL = URL(filePath: "/proc/self/exe")
        process.arguments = ["gtk-child", directory]
        let out = Pipe()
        process.standardOutput = out
        process.standardError = out
        do {
            try process.run()
        } catch {
            print("    cannot start the child: \(error)")
            return
        }
        // The child ends itself with alarm(); this bounds a child that hangs before it.
        let killer = DispatchWorkItem { if process.isRunning { process.terminate() } }
        DispatchQueue.global().asyncAfter(deadline: .now() + 120, execute: killer)
        let data = out.fileHandleForReading.readDataToEndOfFile()
        process.waitUntilExit()
        killer.cancel()
        for line in String(decoding: data, as: UTF8.self).split(separator: "\n", omittingEmptySubsequences: false) {
            print(line.isEmpty ? "" : "  \(line)")
        }
        if process.terminationStatus != 0 { print("  (the child exited with status \(process.terminationStatus))") }
        #else
        Out.paragraph("""
            This experiment needs GTK 4, which the lab builds only with the package traits GLib and \
            GTK, and Xvfb, xdotool and ImageMagick to run it headless: `apt-get install \
            libglib2.0-dev libgtk-4-dev xvfb xdotool imagemagick`, then `swift run --traits \
            GLib,GTK runloop-lab tour --only 24`.
            """, indent: 2)
        #endif
    }
}

/// `runloop-lab gtk-child DIR`: experiment 24's child process. Its main thread starts Xvfb and
/// GTK, runs the drag on `RunLoop.main`, prints the trace and writes the screenshots into DIR.
struct GTKChildCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "gtk-child", abstract: "Experiment 24's child process.", shouldDisplay: false)

    @Argument var directory: String

    func run() throws {
        #if GTK
        alarm(90)
        let display: VirtualDisplay
        do {
            display = try VirtualDisplay()
        } catch {
            print("cannot start Xvfb: \(error)")
            throw ExitCode(1)
        }
        defer { display.stop() }
        do {
            try GTK.start(display: display.name)
        } catch {
            print("cannot start GTK: \(error)")
            throw ExitCode(1)
        }
        let start = ContinuousClock.now
        Out.subheading("trace (main thread; Xvfb on display \(display.name), GSK_RENDERER=cairo)")
        let report: DragExperiment.Report
        do {
            report = try DragExperiment.run(screenshotsIn: directory) { line in print("    \(line)") }
        } catch {
            print("    the experiment failed: \(error)")
            throw ExitCode(1)
        }
        let names = ["before the drag", "during the drag (.tracking)", "after the drag"]
        Out.subheading("fires per phase (\(report.phaseMilliseconds.map { "\($0) ms" }.joined(separator: " / ")))")
        for ticker in DragExperiment.Ticker.allCases {
            let counts = report.fires[ticker.rawValue]
            print("    " + ticker.name.padding(toLength: 42, withPad: " ", startingAt: 0)
                + zip(names, counts).map { "\($1) \($0)" }.joined(separator: ", "))
        }
        print("    the .common timer's fires during the drag ran in: \(report.modesDuringDrag.sorted().joined(separator: ", "))")
        Out.subheading("the scroll view")
        print("    vadjustment \(String(format: "%.1f", report.scrollBefore)) -> \(String(format: "%.1f", report.scrollAfter)) (upper \(String(format: "%.1f", report.scrollUpper))), \(report.valueChanges) value-changed signals at g_main_depth \(report.valueChangeDepths.map(String.init).joined(separator: ", "))")
        print("    drag-begin \(report.dragBegins), drag-end \(report.dragEnds), tracking runs entered \(report.trackingRunsEntered); pressed at (\(report.pressedAt.x), \(report.pressedAt.y)) in the window")
        print("    screenshots: \(report.screenshotBefore), \(report.screenshotAfter): \(report.differingPixels) pixels differ")
        let fires = report.fires
        let ok = fires[0][1] == 0 && fires[0][2] > 0 && fires[1][1] > 0 && fires[2][1] > 0 && report.scrollAfter > report.scrollBefore
            && report.differingPixels > 0
        Out.line(ok
            ? "result: as the seeds say (.default timer stopped during the drag; .common timer and GLib timeout kept firing; the view scrolled)"
            : "result: NOT as the seeds say (see the counts above)")
        Out.paragraph("""
            What it shows: the .default timer stops while the scroll bar is dragged and fires again after it \
            (once late, then on its grid: missed ticks are skipped); the .common timer and GLib's \
            timeout never stop, because the bridge is in the common modes and so runs in \
            .tracking. GTK scrolls the view from its ordinary event dispatch (value-changed at \
            g_main_depth 1): the tracking run is the loop's, entered after the handler returned, \
            as UIKit pushes its tracking mode. Took \(TourLog.ms(.now - start)).
            """, indent: 2)
        #else
        print("runloop-lab was built without the package traits GLib and GTK")
        throw ExitCode(1)
        #endif
    }
}
