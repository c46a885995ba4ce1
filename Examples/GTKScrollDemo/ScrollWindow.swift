#if GTK
public import CGtk
public import RunLoopGLib
import RunLoopKit

/// A GTK 4 window with a scroll view of 150 rows (`GtkScrolledWindow`, overlay scrolling off so
/// that its scroll bar stays visible and can be dragged) and a drawing area above it, on the main
/// thread's loop. A `GtkGestureDrag` on the scroll view (capture phase, never claimed: the scroll
/// bar still gets the press) maps the drag to a ``TrackingRuns`` run, which is how a GTK 4 app
/// gets the seeds' UITrackingRunLoopMode.
///
/// `@unchecked Sendable`: GTK's objects and every mutable property are used on the main thread
/// only. GTK calls its handlers on the thread that iterates its context (the main loop's, which
/// drives it through `GLibBridge`), and the loop's timers that read the counts fire on that
/// thread too; the type is Sendable only so that those timers' `@Sendable` closures may hold it.
public final class ScrollWindow: @unchecked Sendable {
    /// The `GtkWindow`.
    public let window: UnsafeMutablePointer<GtkWidget>
    /// The `GtkScrolledWindow`.
    public let scrolledWindow: UnsafeMutablePointer<GtkWidget>
    /// The drawing area above the rows (its draws are counted).
    public let drawingArea: UnsafeMutablePointer<GtkWidget>
    /// The scroll view's vertical `GtkAdjustment`.
    public let adjustment: UnsafeMutablePointer<GtkAdjustment>
    /// The tracking runs that the drag begins and ends.
    public let tracking: TrackingRuns

    /// `value-changed` signals of the adjustment, and the deepest `g_main_depth()` seen in one.
    public private(set) var valueChanges = 0
    public private(set) var valueChangeDepths: Set<Int> = []
    /// Frames seen by the tick callback (while one is installed).
    public private(set) var frames = 0
    /// Draws of the drawing area.
    public private(set) var draws = 0
    /// Pointer motions over the window, and `g_main_depth()` at the last one.
    public private(set) var motions = 0
    public private(set) var lastMotionDepth = 0
    /// Drags that began and ended.
    public private(set) var dragBegins = 0
    public private(set) var dragEnds = 0

    /// Called on the main thread at a drag's begin and end (after the tracking request), at a
    /// pointer motion, and at each frame while ``startTicking()`` is on.
    public var onDragBegin: (() -> Void)?
    public var onDragEnd: (() -> Void)?
    public var onMotion: (() -> Void)?
    public var onDraw: (() -> Void)?
    private var ticking = false

    /// Builds the window (not shown yet: ``present()``). GTK must be started (`GTK.start`).
    public init(title: String = "RunLoopKit on GTK 4", width: Int32 = 420, height: Int32 = 320, rows: Int = 150) {
        // A drag here lasts about a second; one whose end is lost ends the run after 10 s.
        tracking = TrackingRuns(loop: .main, mode: .tracking, limit: .seconds(10))
        window = gtk_window_new()
        gtk_window_set_title(crgtk_window(window), title)
        gtk_window_set_default_size(crgtk_window(window), width, height)
        // No decorations: the widgets' coordinates are the X window's (xdotool's) coordinates.
        gtk_window_set_decorated(crgtk_window(window), 0)
        let column = gtk_box_new(GTK_ORIENTATION_VERTICAL, 0)!
        drawingArea = gtk_drawing_area_new()
        gtk_drawing_area_set_content_height(crgtk_drawing_area(drawingArea), 24)
        gtk_box_append(crgtk_box(column), drawingArea)
        scrolledWindow = gtk_scrolled_window_new()
        gtk_scrolled_window_set_overlay_scrolling(crgtk_scrolled_window(scrolledWindow), 0)
        gtk_scrolled_window_set_policy(crgtk_scrolled_window(scrolledWindow), GTK_POLICY_NEVER, GTK_POLICY_ALWAYS)
        gtk_widget_set_vexpand(scrolledWindow, 1)
        let list = gtk_box_new(GTK_ORIENTATION_VERTICAL, 2)!
        for row in 1...rows {
            let label = gtk_label_new("Row \(row): RunLoopKit drives GTK 4 through GLibBridge")!
            gtk_widget_set_halign(label, GTK_ALIGN_START)
            gtk_box_append(crgtk_box(list), label)
        }
        gtk_scrolled_window_set_child(crgtk_scrolled_window(scrolledWindow), list)
        gtk_box_append(crgtk_box(column), scrolledWindow)
        gtk_window_set_child(crgtk_window(window), column)
        adjustment = gtk_scrolled_window_get_vadjustment(crgtk_scrolled_window(scrolledWindow))
        connectHandlers()
    }

    private func connectHandlers() {
        let me = userData(self)
        gtk_drawing_area_set_draw_func(
            crgtk_drawing_area(drawingArea),
            { _, cairo, width, height, data in
                let window = object(data, as: ScrollWindow.self)
                window.draws += 1
                // A bar whose length shows the frame count: frames change what is drawn.
                cairo_set_source_rgb(cairo, 0.2, 0.4, 0.8)
                cairo_rectangle(cairo, 0, 0, Double(window.frames % 60) / 60 * Double(width), Double(height))
                cairo_fill(cairo)
                window.onDraw?()
            }, me, nil)

        let drag = gtk_gesture_drag_new()!
        gtk_event_controller_set_propagation_phase(crgtk_controller(drag), GTK_PHASE_CAPTURE)
        let dragBegin: @convention(c) (gpointer?, Double, Double, gpointer?) -> Void = { gesture, _, _, data in
            let window = object(data, as: ScrollWindow.self)
            window.dragBegins += 1
            // Only asks: the tracking run starts once this handler (GLib's dispatch of the press)
            // has returned and GTK has delivered the press to the scroll bar.
            window.tracking.begin(UInt(bitPattern: gesture))
            window.onDragBegin?()
        }
        let dragEnd: @convention(c) (gpointer?, Double, Double, gpointer?) -> Void = { gesture, _, _, data in
            let window = object(data, as: ScrollWindow.self)
            window.dragEnds += 1
            window.tracking.end(UInt(bitPattern: gesture))
            window.onDragEnd?()
        }
        connect(drag, "drag-begin", dragBegin, me)
        connect(drag, "drag-end", dragEnd, me)
        // A cancelled gesture ends too (end is idempotent, so drag-end after it does nothing).
        let cancel: @convention(c) (gpointer?, gpointer?, gpointer?) -> Void = { gesture, _, data in
            object(data, as: ScrollWindow.self).tracking.end(UInt(bitPattern: gesture))
        }
        connect(drag, "cancel", cancel, me)
        gtk_widget_add_controller(scrolledWindow, crgtk_controller(drag))

        let motion = gtk_event_controller_motion_new()!
        let moved: @convention(c) (gpointer?, Double, Double, gpointer?) -> Void = { _, _, _, data in
            let window = object(data, as: ScrollWindow.self)
            window.motions += 1
            window.lastMotionDepth = Int(g_main_depth())
            window.onMotion?()
        }
        connect(motion, "motion", moved, me)
        gtk_widget_add_controller(window, motion)

        let valueChanged: @convention(c) (gpointer?, gpointer?) -> Void = { _, data in
            let window = object(data, as: ScrollWindow.self)
            window.valueChanges += 1
            window.valueChangeDepths.insert(Int(g_main_depth()))
        }
        connect(adjustment, "value-changed", valueChanged, me)
    }

    /// Shows the window.
    public func present() { gtk_window_present(crgtk_window(window)) }

    /// Destroys the window.
    public func destroy() { gtk_window_destroy(crgtk_window(window)) }

    /// Installs a tick callback on the drawing area that counts frames and redraws it: GDK's frame
    /// clock then runs at 60 Hz (Xvfb has no vblank, so GDK paces frames itself).
    public func startTicking() {
        guard !ticking else { return }
        ticking = true
        gtk_widget_add_tick_callback(
            drawingArea,
            { widget, _, data in
                let window = object(data, as: ScrollWindow.self)
                guard window.ticking else { return 0 }
                window.frames += 1
                gtk_widget_queue_draw(widget)
                return 1
            }, userData(self), nil)
    }

    /// Removes the tick callback at its next frame: the frame clock goes idle.
    public func stopTicking() { ticking = false }

    /// Asks GTK to draw the drawing area again (`gtk_widget_queue_draw`).
    public func queueDraw() { gtk_widget_queue_draw(drawingArea) }

    /// The vertical scroll position, and its largest value.
    public var scrollValue: Double { gtk_adjustment_get_value(adjustment) }
    public var scrollUpper: Double { gtk_adjustment_get_upper(adjustment) - gtk_adjustment_get_page_size(adjustment) }

    /// Whether the window is mapped (on screen).
    public var isMapped: Bool { gtk_widget_get_mapped(window) != 0 }

    /// The X11 window id (0 before the window is realised).
    public var xWindow: UInt { UInt(crgtk_x11_window(window)) }

    /// The centre of the vertical scroll bar's slider, in the X window's coordinates; nil before
    /// it is laid out.
    public var sliderCentre: (x: Int, y: Int)? {
        guard let scrollbar = gtk_scrolled_window_get_vscrollbar(crgtk_scrolled_window(scrolledWindow)),
            let slider = Self.descendant(of: scrollbar, cssName: "slider")
        else { return nil }
        var x = 0.0, y = 0.0, width = 0.0, height = 0.0
        guard crgtk_bounds(slider, window, &x, &y, &width, &height) != 0, width > 0, height > 0 else { return nil }
        var offsetX = 0.0, offsetY = 0.0
        crgtk_surface_offset(window, &offsetX, &offsetY)
        return (Int(offsetX + x + width / 2), Int(offsetY + y + height / 2))
    }

    private static func descendant(
        of widget: UnsafeMutablePointer<GtkWidget>, cssName: String
    ) -> UnsafeMutablePointer<GtkWidget>? {
        var child = gtk_widget_get_first_child(widget)
        while let current = child {
            if let name = gtk_widget_get_css_name(current), String(cString: name) == cssName { return current }
            if let found = descendant(of: current, cssName: cssName) { return found }
            child = gtk_widget_get_next_sibling(current)
        }
        return nil
    }
}
#endif
