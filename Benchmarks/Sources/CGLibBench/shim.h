// GLib for glib-bench (the benchmark package's own view of GLib: RunLoopKit's CGLib is not a
// product).
#include <glib.h>
