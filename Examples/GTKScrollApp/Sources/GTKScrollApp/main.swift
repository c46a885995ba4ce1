// A GTK 4 window on RunLoop.main: a scroll view, and two labels that two loop timers update, one
// added for .default and one for .common. Drag the scroll bar: the .default one stops until you
// let go (the loop runs in .tracking meanwhile), the .common one keeps counting, as the seeds'
// NSTimer does on iOS. DispatchQueue.main and @MainActor work run as in any RunLoopKit program.

import CGtkApp
import Dispatch
import Glibc
import RunLoopConcurrency
import RunLoopGLib
import RunLoopKit

import class RunLoopKit.RunLoop

// 1. The main actor's executor is the main loop (optional: without it, main-actor jobs come
//    through libdispatch's main queue, which the main loop serves too).
RunLoopConcurrency.installMainExecutor()

// 2. GTK, then the bridge: from here RunLoop.main drives GLib's default context, GTK's.
guard gtk_init_check() != 0 else {
    print("GTKScrollApp: cannot open a display (set DISPLAY, or run it under xvfb-run)")
    exit(1)
}
let bridge = try GLibBridge.attach(to: .main)
RunLoop.main.addCommonMode(.tracking)  // GTK keeps running while the loop tracks a drag

/// The window's widgets and state. `@unchecked Sendable`: used on the main thread only (GTK calls
/// its handlers on the thread that drives its context, the main loop's; the loop's timers fire on
/// that thread), and Sendable only so that the timers' `@Sendable` closures may hold it.
final class App: @unchecked Sendable {
    let window = gtk_window_new()!
    let defaultLabel = gtk_label_new("")!
    let commonLabel = gtk_label_new("")!
    let tracking = TrackingRuns(loop: .main)
    var defaultTicks = 0
    var commonTicks = 0

    init() {
        gtk_window_set_title(app_window(window), "RunLoopKit on GTK 4")
        gtk_window_set_default_size(app_window(window), 420, 360)
        let column = gtk_box_new(GTK_ORIENTATION_VERTICAL, 4)!
        gtk_box_append(app_box(column), defaultLabel)
        gtk_box_append(app_box(column), commonLabel)
        let scrolled = gtk_scrolled_window_new()!
        gtk_widget_set_vexpand(scrolled, 1)
        let rows = gtk_box_new(GTK_ORIENTATION_VERTICAL, 2)!
        for row in 1...150 { gtk_box_append(app_box(rows), gtk_label_new("Row \(row)")) }
        gtk_scrolled_window_set_child(app_scrolled_window(scrolled), rows)
        gtk_box_append(app_box(column), scrolled)
        gtk_window_set_child(app_window(window), column)

        // 3. The drag maps to a tracking run: begin only asks, the loop enters .tracking after
        //    GTK has delivered the press to the scroll bar; end stops it.
        let me = Unmanaged.passUnretained(self).toOpaque()
        let drag = gtk_gesture_drag_new()!
        gtk_event_controller_set_propagation_phase(app_controller(drag), GTK_PHASE_CAPTURE)
        let begin: @convention(c) (gpointer?, Double, Double, gpointer?) -> Void = { gesture, _, _, data in
            Unmanaged<App>.fromOpaque(data!).takeUnretainedValue().tracking.begin(UInt(bitPattern: gesture))
        }
        let end: @convention(c) (gpointer?, Double, Double, gpointer?) -> Void = { gesture, _, _, data in
            Unmanaged<App>.fromOpaque(data!).takeUnretainedValue().tracking.end(UInt(bitPattern: gesture))
        }
        app_signal_connect(UnsafeMutableRawPointer(drag), "drag-begin", unsafeBitCast(begin, to: GCallback.self), me)
        app_signal_connect(UnsafeMutableRawPointer(drag), "drag-end", unsafeBitCast(end, to: GCallback.self), me)
        gtk_widget_add_controller(scrolled, app_controller(drag))

        // Closing the window stops the main loop.
        let close: @convention(c) (gpointer?, gpointer?) -> gboolean = { _, _ in
            RunLoop.main.stop()
            return 0
        }
        app_signal_connect(UnsafeMutableRawPointer(window), "close-request", unsafeBitCast(close, to: GCallback.self), me)
        update()
    }

    func update() {
        gtk_label_set_text(app_label(defaultLabel), "timer added for .default: \(defaultTicks)")
        gtk_label_set_text(app_label(commonLabel), "timer added for .common: \(commonTicks)")
    }
}

/// The window, the timers and the main loop (a function: top-level variables of a main.swift are
/// the main actor's, which the timers' `@Sendable` closures may not touch).
func runApp(_ bridge: GLibBridge) {
    let app = App()
    gtk_window_present(app_window(app.window))

    // 4. The seeds' two timers: only the .common one runs while the scroll bar is dragged.
    let defaultTimer = RunLoopTimer(after: .milliseconds(100), repeating: .milliseconds(100)) { _ in
        app.defaultTicks += 1
        app.update()
    }
    let commonTimer = RunLoopTimer(after: .milliseconds(100), repeating: .milliseconds(100)) { _ in
        app.commonTicks += 1
        app.update()
    }
    RunLoop.main.add(defaultTimer, forMode: .default)
    RunLoop.main.add(commonTimer, forMode: .common)

    // 5. The main queue and the main actor from another thread, with no tickler.
    DispatchQueue.global().async {
        DispatchQueue.main.async { print("DispatchQueue.main.async ran on the main loop") }
        Task { @MainActor in print("Task { @MainActor } ran on the main loop") }
    }

    if let index = CommandLine.arguments.firstIndex(of: "--quit-after"), index + 1 < CommandLine.arguments.count,
        let seconds = Double(CommandLine.arguments[index + 1])
    {
        RunLoop.main.add(RunLoopTimer(after: .seconds(seconds)) { _ in RunLoop.main.stop() }, forMode: .common)
    }

    // 6. The main loop, until the window is closed.
    RunLoop.main.run()
    print("timer added for .default: \(app.defaultTicks) ticks, for .common: \(app.commonTicks)")
    defaultTimer.invalidate()
    commonTimer.invalidate()
    bridge.invalidate()
}

runApp(bridge)
