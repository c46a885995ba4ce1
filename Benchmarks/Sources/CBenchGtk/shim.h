// GTK 4 for gtk-bench (trait GTK), and libdispatch's main-queue port, which a GLib-owned loop
// serves with a GSource the way CoreFoundation's main loop does (exported by the toolchain's
// libdispatch.so; declared here because no header of it is installed).
#ifndef CBENCHGTK_SHIM_H
#define CBENCHGTK_SHIM_H

#include <gtk/gtk.h>
#include <glib-unix.h>

/// The main queue's eventfd: readable when work is queued on the main queue.
extern int _dispatch_get_main_queue_handle_4CF(void);
/// Drains the main queue on the main thread.
extern void _dispatch_main_queue_callback_4CF(void *msg);

static inline GtkWindow *cbg_window(GtkWidget *widget) { return GTK_WINDOW(widget); }

#endif
