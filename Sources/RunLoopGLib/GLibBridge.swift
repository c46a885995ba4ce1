#if GLib
internal import CGLib
import Glibc
public import RunLoopKit
import Synchronization

/// Drives a GLib `GMainContext` from a RunLoopKit loop: `RunLoop.main` (or any loop) runs, and
/// GLib's sources (timeouts, idles, descriptor watches, GTK's event and frame-clock sources) are
/// dispatched in the loop's passes, in the modes the bridge is given.
///
/// ```swift
/// let bridge = try GLibBridge.attach()          // RunLoop.current drives GLib's default context
/// RunLoop.current.run()                         // GLib's sources run in the loop's passes
/// bridge.invalidate()                           // GLib's own loops may run the context again
/// ```
///
/// How it drives the context (see <doc:DrivingAContext>):
/// - It acquires the context on the loop's thread when it attaches and holds it until
///   ``invalidate()``: other threads' `g_idle_add`, `g_timeout_add`, `g_source_attach` and
///   `g_main_context_invoke` then wake the sleeping loop, and an invoked function runs on the
///   loop's thread.
/// - Before the loop sleeps (a `beforeWaiting` observer) it runs GLib's prepare and query, puts
///   GLib's descriptors in one epoll descriptor of its own, watched by a `FileDescriptorSource`,
///   and GLib's timeout in a `RunLoopTimer`. After the loop wakes it runs GLib's check and
///   dispatch: one GLib iteration per pass, one callout (labelled `GLib dispatch`), so GLib's
///   priorities stay GLib's and the loop's own sources, timers and main queue run in every pass.
/// - A GSource of its own serves the loop while someone else runs a GLib loop on its thread (a
///   nested `g_main_loop_run` in a callback).
///
/// The loop keeps the bridge (its items hold it) until ``invalidate()`` or the loop's thread
/// exits.
///
/// `@unchecked Sendable`: its stored properties are constants (the loop, the modes, the context
/// pointer, which GLib makes safe to pass between threads) and the driver, whose state only the
/// loop's thread touches (see `GLibDriver`) except for atomics.
public final class GLibBridge: @unchecked Sendable, CustomStringConvertible {
    /// The loop that drives the context.
    public let loop: RunLoop
    /// The modes the bridge drives GLib in (`RunLoop.Mode.common` by default).
    public let modes: [RunLoop.Mode]
    /// The `GMainContext *` driven (GLib's global default context unless another was given).
    public let context: OpaquePointer
    let driver: GLibDriver

    /// Attaches to `loop`'s thread: from here, `loop` drives `context` whenever it runs in one of
    /// `modes`. Call it on `loop`'s thread.
    ///
    /// - Parameters:
    ///   - loop: The loop to drive the context: the calling thread's (`RunLoop.current`).
    ///   - context: A `GMainContext *`; nil for GLib's global default context (GTK's).
    ///   - modes: The modes GLib runs in: `RunLoop.Mode.common` (the default) runs it in every
    ///     common mode, as a CoreFoundation source added to the common modes runs, so GLib keeps
    ///     running in `.tracking` once that is a common mode, and pauses in a private mode.
    /// - Throws: ``GLibBridgeError``: not on the loop's thread, the context already driven by a
    ///   bridge, the context owned by another thread, a child of `fork()`, no descriptor left.
    public static func attach(
        to loop: RunLoop = .current, context: OpaquePointer? = nil, modes: [RunLoop.Mode] = [.common]
    ) throws(GLibBridgeError) -> GLibBridge {
        guard !RunLoop.isForkedChild, !loop.wasMadeBeforeFork else { throw .forkedChild }
        guard loop.isCurrent else { throw .notLoopThread(loop: loop.description) }
        guard !modes.isEmpty else { throw .noModes }
        let context = context ?? g_main_context_default()!
        let driver = try GLibDriver.attach(loop: loop, context: context, modes: modes)
        return GLibBridge(loop: loop, modes: modes, context: context, driver: driver)
    }

    private init(loop: RunLoop, modes: [RunLoop.Mode], context: OpaquePointer, driver: GLibDriver) {
        self.loop = loop
        self.modes = modes
        self.context = context
        self.driver = driver
    }

    /// Detaches: the bridge stops driving the context, removes its items from the loop, closes
    /// its epoll descriptor and releases the context, so that `g_main_context_iteration` and
    /// GLib's own loops may run it again (on any thread). Idempotent.
    ///
    /// On the loop's thread (a GLib callback included) the release happens at once, or, inside the
    /// bridge's own dispatch, as soon as that dispatch returns. From another thread it happens on
    /// the loop's thread, at its next pass in one of the bridge's modes. In a child of `fork()` it
    /// only marks the bridge detached (GLib is not usable there).
    public func invalidate() { driver.invalidate() }

    /// Whether the bridge still drives its context (false after ``invalidate()``).
    public var isAttached: Bool { driver.isAttached }

    /// `<GLibBridge 0x… context 0x… modes [kCFRunLoopCommonModes] attached>`.
    public var description: String {
        "<GLibBridge \(ObjectIdentifier(self)) context \(context) modes \(modes.map(\.rawValue)) \(isAttached ? "attached" : "detached")>"
    }
}

/// Why ``GLibBridge/attach(to:context:modes:)`` refused.
public enum GLibBridgeError: Error, Sendable, Hashable, CustomStringConvertible {
    /// Not called on the loop's own thread (the context is acquired by the calling thread).
    case notLoopThread(loop: String)
    /// A bridge already drives this context (on this or another loop).
    case alreadyAttached
    /// Another thread owns the context (`g_main_context_acquire` failed): it runs a GLib loop on
    /// it, or acquired it.
    case contextOwnedElsewhere
    /// In a child of `fork()` (or on a loop made before the fork): GLib is not usable after
    /// `fork()` without `exec()`.
    case forkedChild
    /// No modes were given.
    case noModes
    /// The bridge's epoll descriptor could not be made (`errno`).
    case noDescriptor(errno: Int32)

    /// What went wrong, and what to do.
    public var description: String {
        switch self {
        case .notLoopThread(let loop):
            "GLibBridge.attach must be called on the loop's own thread (\(loop)): the context is acquired by the calling thread, and only the loop's thread may drive it"
        case .alreadyAttached:
            "a GLibBridge already drives this GMainContext; invalidate it first (one bridge per context)"
        case .contextOwnedElsewhere:
            "another thread owns this GMainContext (it runs a GLib loop on it or acquired it): g_main_context_acquire failed; a context is driven by one thread at a time"
        case .forkedChild:
            "GLibBridge cannot attach in a child of fork() (GLib is not usable after fork() without exec(), and a loop made before the fork belongs to the parent)"
        case .noModes:
            "GLibBridge.attach needs at least one mode (.common by default)"
        case .noDescriptor(let errno):
            "GLibBridge could not make its epoll descriptor: \(String(cString: strerror(errno))) (errno \(errno))"
        }
    }
}
#endif
