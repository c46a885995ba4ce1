#if GLib
import CGLib
import Glibc
import RunLoopGLib
import RunLoopKit
import SharedTestSupport
import Synchronization
import Testing

// GLib sources with Swift closures, GLib's log captured, and a loop thread driving a context: what
// the GLib tests share.

/// A closure a GLib source calls: retained by the source, released by its destroy notify.
final class GLibCallback: Sendable {
    let body: @Sendable () -> Bool
    init(_ body: @escaping @Sendable () -> Bool) { self.body = body }
}

/// Attaches `source` to `context` (nil: GLib's default context) with `body` as its callback
/// (true: keep the source, false: remove it); returns its id. The source is unreferenced here:
/// the context keeps it.
@discardableResult
func attach(
    _ source: UnsafeMutablePointer<GSource>, to context: OpaquePointer?, name: String? = nil, priority: Int32? = nil,
    canRecurse: Bool = false, _ body: @escaping @Sendable () -> Bool
) -> UInt32 {
    let box = Unmanaged.passRetained(GLibCallback(body)).toOpaque()
    g_source_set_callback(
        source, { data in Unmanaged<GLibCallback>.fromOpaque(data!).takeUnretainedValue().body() ? 1 : 0 }, box,
        { data in Unmanaged<GLibCallback>.fromOpaque(data!).release() })
    if let name { g_source_set_name(source, name) }
    if let priority { g_source_set_priority(source, priority) }
    if canRecurse { g_source_set_can_recurse(source, 1) }
    let id = g_source_attach(source, context)
    g_source_unref(source)
    return id
}

/// A GLib timeout every `milliseconds` on `context`.
@discardableResult
func addTimeout(
    _ milliseconds: UInt32, to context: OpaquePointer?, name: String? = nil, priority: Int32? = nil, canRecurse: Bool = false,
    _ body: @escaping @Sendable () -> Bool
) -> UInt32 {
    attach(g_timeout_source_new(milliseconds), to: context, name: name, priority: priority, canRecurse: canRecurse, body)
}

/// A GLib idle on `context`.
@discardableResult
func addIdle(_ context: OpaquePointer?, priority: Int32, name: String? = nil, _ body: @escaping @Sendable () -> Bool) -> UInt32 {
    attach(g_idle_source_new(), to: context, name: name, priority: priority, body)
}

/// A GLib descriptor watch (`g_unix_fd_source_new`) on `context`.
@discardableResult
func addWatch(
    _ descriptor: Int32, _ condition: GIOCondition = G_IO_IN, to context: OpaquePointer?, name: String? = nil,
    _ body: @escaping @Sendable () -> Bool
) -> UInt32 {
    let source = g_unix_fd_source_new(descriptor, condition)!
    let box = Unmanaged.passRetained(GLibCallback(body)).toOpaque()
    let callback: @convention(c) (Int32, GIOCondition, UnsafeMutableRawPointer?) -> gboolean = { _, _, data in
        Unmanaged<GLibCallback>.fromOpaque(data!).takeUnretainedValue().body() ? 1 : 0
    }
    g_source_set_callback(
        source, unsafeBitCast(callback, to: GSourceFunc.self), box,
        { data in Unmanaged<GLibCallback>.fromOpaque(data!).release() })
    if let name { g_source_set_name(source, name) }
    let id = g_source_attach(source, context)
    g_source_unref(source)
    return id
}

/// A pipe: (read end, write end), both non-blocking and close-on-exec.
func makePipe() -> (read: Int32, write: Int32) {
    var ends: [Int32] = [0, 0]
    precondition(pipe(&ends) == 0, "pipe failed")
    for end in ends {
        _ = fcntl(end, F_SETFL, fcntl(end, F_GETFL) | O_NONBLOCK)
        _ = fcntl(end, F_SETFD, FD_CLOEXEC)
    }
    return (ends[0], ends[1])
}

/// Reads what is in `descriptor` (non-blocking) and throws it away.
func drain(_ descriptor: Int32) {
    var buffer = [UInt8](repeating: 0, count: 256)
    while read(descriptor, &buffer, buffer.count) > 0 {}
}

/// The calling thread's kernel id.
func currentThreadID() -> Int32 { crlg_gettid() }

/// GLib's log: warnings and criticals the process's GLib code logs (g_log_set_writer_func may be
/// called once per process: every test shares this writer).
enum GLibLog {
    private static let messages = Mutex<[String]>([])

    /// Installs the writer (once); then `count` tells how many warnings or worse were logged.
    static let installed: Bool = {
        g_log_set_writer_func(
            { level, fields, count, _ in
                if level.rawValue & (G_LOG_LEVEL_ERROR.rawValue | G_LOG_LEVEL_CRITICAL.rawValue | G_LOG_LEVEL_WARNING.rawValue) != 0 {
                    var text = "level \(level.rawValue)"
                    if let fields {
                        for index in 0..<Int(count) where String(cString: fields[index].key) == "MESSAGE" {
                            if let value = fields[index].value {
                                text += ": " + String(cString: value.assumingMemoryBound(to: CChar.self))
                            }
                        }
                    }
                    GLibLog.messages.locked { $0.append(text) }
                }
                return g_log_writer_default(level, fields, count, nil)
            }, nil, nil)
        return true
    }()

    /// The warnings and criticals logged so far.
    static var warnings: [String] {
        _ = installed
        return messages.locked { $0 }
    }
}

/// Runs `body` on a new thread whose loop drives a new private context through a bridge attached
/// there (in `modes`); the bridge is invalidated and the context unreferenced after `body`.
/// Returns `body`'s result (nil if the thread did not finish: an issue is recorded).
func withBridgedLoop<T: Sendable>(
    modes: [RunLoop.Mode] = [.common], timeout: Duration = .seconds(60), sourceLocation: SourceLocation = #_sourceLocation,
    _ body: @escaping @Sendable (RunLoop, OpaquePointer, GLibBridge) -> T
) async -> T? {
    _ = GLibLog.installed
    return await TestThreads.run(name: "glib-loop", timeout: timeout, sourceLocation: sourceLocation) {
        let context = g_main_context_new()!
        defer { g_main_context_unref(context) }
        let loop = RunLoop.current
        let bridge: GLibBridge
        do {
            bridge = try GLibBridge.attach(to: loop, context: context, modes: modes)
        } catch {
            fatalError("GLibBridge.attach failed: \(error)")
        }
        defer { bridge.invalidate() }
        return body(loop, context, bridge)
    }
}

/// An `OpaquePointer` that crosses threads in tests (a `GMainContext *`, which GLib makes safe to
/// share).
struct SendablePointer: @unchecked Sendable {
    let pointer: OpaquePointer
}
#endif
