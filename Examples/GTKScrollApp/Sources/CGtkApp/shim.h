// GTK 4, and what Swift cannot call directly: g_signal_connect and the GObject casts are macros.
#include <gtk/gtk.h>

static inline gulong app_signal_connect(gpointer instance, const char *signal, GCallback handler, gpointer data) {
    return g_signal_connect_data(instance, signal, handler, data, NULL, (GConnectFlags)0);
}
static inline GtkWindow *app_window(GtkWidget *widget) { return GTK_WINDOW(widget); }
static inline GtkBox *app_box(GtkWidget *widget) { return GTK_BOX(widget); }
static inline GtkLabel *app_label(GtkWidget *widget) { return GTK_LABEL(widget); }
static inline GtkScrolledWindow *app_scrolled_window(GtkWidget *widget) { return GTK_SCROLLED_WINDOW(widget); }
static inline GtkEventController *app_controller(GtkGesture *gesture) { return GTK_EVENT_CONTROLLER(gesture); }
