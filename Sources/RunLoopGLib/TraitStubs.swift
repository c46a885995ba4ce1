#if !GLib
public import RunLoopKit

// Without the package trait GLib this module compiles to nothing of GLib's (GLib's headers and
// library are not even looked for), so a program that imports it would see an empty module and
// "cannot find 'GLibBridge' in scope". These unavailable stand-ins are what such a program finds
// instead: their message says what to do.

/// Needs the package trait `GLib` (unavailable without it).
@available(
    *, unavailable,
    message: "RunLoopGLib needs the package trait GLib (and glib-2.0's development files, Debian: libglib2.0-dev): .package(url: \"https://github.com/runloopkit/RunLoopKit\", from: \"0.1.0\", traits: [\"GLib\"])"
)
public final class GLibBridge: Sendable {
    /// Needs the package trait `GLib`.
    public static func attach(
        to loop: RunLoop = .current, context: OpaquePointer? = nil, modes: [RunLoop.Mode] = [.common]
    ) throws -> GLibBridge {
        fatalError("RunLoopGLib needs the package trait GLib")
    }

    /// Needs the package trait `GLib`.
    public func invalidate() {}

    /// Needs the package trait `GLib`.
    public var isAttached: Bool { false }
}

/// Needs the package trait `GLib` (unavailable without it).
@available(
    *, unavailable,
    message: "RunLoopGLib needs the package trait GLib (and glib-2.0's development files, Debian: libglib2.0-dev): .package(url: \"https://github.com/runloopkit/RunLoopKit\", from: \"0.1.0\", traits: [\"GLib\"])"
)
public enum GLibBridgeError: Error, Sendable {}
#endif
