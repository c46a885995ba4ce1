#if !SwiftNIO
public import RunLoopMonitor

// Without the package trait SwiftNIO this module compiles to nothing of NIO's (NIO is not even in
// the dependency graph), so a program that imports it would see an empty module and errors that
// never name the trait: "cannot find 'NIOEventLoopTicks' in scope", and for `watch(group, ticks:)`
// "incorrect argument labels in call (have '_:ticks:', expected 'threadID:name:')" (the one
// `watch` of RunLoopMonitor with two labels). These unavailable stand-ins are what such a program
// finds instead: their message says what to do. They name no NIO type (none is importable here);
// the calls resolve to them only where nothing available fits (the compiler prefers available
// declarations), so RunLoopMonitor's own `watch` overloads are unaffected.

/// Needs the package trait `SwiftNIO` (unavailable without it).
@available(
    *, unavailable,
    message: "RunLoopMonitorNIO needs the package trait SwiftNIO: .package(url: \"https://github.com/runloopkit/RunLoopKit\", from: \"0.1.0\", traits: [\"SwiftNIO\"])"
)
public final class NIOEventLoopTicks: Sendable {
    /// Needs the package trait `SwiftNIO`.
    public init(capacity: Int = 64) {}
}

/// Needs the package trait `SwiftNIO` (unavailable without it).
@available(
    *, unavailable,
    message: "RunLoopMonitorNIO needs the package trait SwiftNIO: .package(url: \"https://github.com/runloopkit/RunLoopKit\", from: \"0.1.0\", traits: [\"SwiftNIO\"])"
)
public final class NIOEventLoopStallSource: Sendable {}

extension StallMonitor {
    /// Watching a SwiftNIO event loop group or event loop needs the package trait `SwiftNIO`
    /// (unavailable without it).
    @available(
        *, unavailable,
        message: "watching a SwiftNIO event loop needs RunLoopMonitorNIO built with the package trait SwiftNIO: .package(url: \"https://github.com/runloopkit/RunLoopKit\", from: \"0.1.0\", traits: [\"SwiftNIO\"])"
    )
    @discardableResult
    public func watch<EventLoops>(_ loops: EventLoops, ticks: NIOEventLoopTicks? = nil, heartbeat: Duration = .milliseconds(100)) -> [any StallSource] {
        []
    }
}
#endif
