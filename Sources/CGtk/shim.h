// GTK 4 for the lab's experiment 24, the GTK test probe and the GTK example (package trait GTK
// only: no library product links GTK). What Swift cannot call directly: `g_signal_connect` and
// the GObject casts are macros, and GDK's X11 window id is in a header of its own.
#ifndef CGTK_SHIM_H
#define CGTK_SHIM_H

#include <gtk/gtk.h>
#include <gdk/x11/gdkx.h>
#include <glib-unix.h>

/// `g_signal_connect` (a macro): connects `handler`, a C function of the signal's signature cast
/// to `GCallback`, with `data` as its last argument.
static inline gulong crgtk_signal_connect(gpointer instance, const char *signal, GCallback handler, gpointer data) {
    return g_signal_connect_data(instance, signal, handler, data, NULL, (GConnectFlags)0);
}

static inline GtkWindow *crgtk_window(GtkWidget *widget) { return GTK_WINDOW(widget); }
static inline GtkBox *crgtk_box(GtkWidget *widget) { return GTK_BOX(widget); }
static inline GtkScrolledWindow *crgtk_scrolled_window(GtkWidget *widget) { return GTK_SCROLLED_WINDOW(widget); }
static inline GtkDrawingArea *crgtk_drawing_area(GtkWidget *widget) { return GTK_DRAWING_AREA(widget); }
static inline GtkEventController *crgtk_controller(GtkGesture *gesture) { return GTK_EVENT_CONTROLLER(gesture); }
static inline GtkGestureDrag *crgtk_gesture_drag(GtkGesture *gesture) { return GTK_GESTURE_DRAG(gesture); }

/// The X11 window id of `widget`'s native surface (0 when it has none yet or is not on X11).
static inline unsigned long crgtk_x11_window(GtkWidget *widget) {
    GtkNative *native = gtk_widget_get_native(widget);
    if (native == NULL) return 0;
    GdkSurface *surface = gtk_native_get_surface(native);
    if (surface == NULL || !GDK_IS_X11_SURFACE(surface)) return 0;
    return (unsigned long)gdk_x11_surface_get_xid(surface);
}

/// `widget`'s bounds in `target`'s coordinates (gtk_widget_compute_bounds); false if they have
/// no common ancestor or are not laid out.
static inline gboolean crgtk_bounds(GtkWidget *widget, GtkWidget *target, double *x, double *y, double *width, double *height) {
    graphene_rect_t rect;
    if (!gtk_widget_compute_bounds(widget, target, &rect)) return FALSE;
    *x = rect.origin.x; *y = rect.origin.y; *width = rect.size.width; *height = rect.size.height;
    return TRUE;
}

/// Where `window`'s own coordinates start in its surface (the X window): a client-side
/// decoration's shadow, 0 without one (gtk_native_get_surface_transform).
static inline void crgtk_surface_offset(GtkWidget *window, double *x, double *y) {
    *x = 0; *y = 0;
    GtkNative *native = gtk_widget_get_native(window);
    if (native != NULL) gtk_native_get_surface_transform(native, x, y);
}

#endif
