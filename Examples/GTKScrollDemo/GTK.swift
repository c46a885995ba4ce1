#if GTK
import CGtk
import Foundation
import Glibc
import Synchronization

/// GTK 4 started once in this process, on its main thread, on an X display.
public enum GTK {
    private static let started = Atomic<Bool>(false)

    /// Points GTK at `display` (`:N`), with the settings that make it run headless and
    /// repeatable under Xvfb (X11 backend, the cairo renderer, no accessibility bus, which would
    /// look for a D-Bus session), and initialises it. Call it once, on the main thread.
    public static func start(display: String) throws(GTKError) {
        guard Thread.isMainThread else { throw .notMainThread }
        guard !started.exchange(true, ordering: .relaxed) else { throw .startedTwice }
        setenv("DISPLAY", display, 1)
        setenv("GDK_BACKEND", "x11", 1)
        setenv("GSK_RENDERER", "cairo", 1)
        setenv("NO_AT_BRIDGE", "1", 1)
        setenv("GTK_A11Y", "none", 1)
        guard gtk_init_check() != 0 else { throw .initFailed(display: display) }
    }

    /// `g_main_depth()`: how many GLib dispatches are on this thread's stack.
    public static var mainDepth: Int { Int(g_main_depth()) }
}

/// Why GTK could not be started.
public enum GTKError: Error, CustomStringConvertible, Sendable {
    case notMainThread
    case startedTwice
    case initFailed(display: String)

    public var description: String {
        switch self {
        case .notMainThread: "GTK must be started on the main thread"
        case .startedTwice: "GTK is started once per process"
        case .initFailed(let display): "gtk_init_check() failed: cannot open display \(display)"
        }
    }
}

/// A Swift object handed to a C callback as its `gpointer` (unretained: the caller keeps it).
func userData(_ object: AnyObject) -> gpointer { Unmanaged.passUnretained(object).toOpaque() }

/// The object behind a callback's `gpointer`.
func object<T: AnyObject>(_ data: gpointer?, as type: T.Type) -> T {
    Unmanaged<T>.fromOpaque(data!).takeUnretainedValue()
}

/// `g_signal_connect` for a C handler of the signal's signature.
func connect<F>(_ instance: OpaquePointer, _ signal: String, _ handler: F, _ data: gpointer) {
    _ = crgtk_signal_connect(UnsafeMutableRawPointer(instance), signal, unsafeBitCast(handler, to: GCallback.self), data)
}

/// `g_signal_connect` on an object Swift imports as a typed pointer (a public GTK struct).
func connect<T, F>(_ instance: UnsafeMutablePointer<T>, _ signal: String, _ handler: F, _ data: gpointer) {
    _ = crgtk_signal_connect(UnsafeMutableRawPointer(instance), signal, unsafeBitCast(handler, to: GCallback.self), data)
}
#endif
