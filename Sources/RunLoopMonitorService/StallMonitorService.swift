#if ServiceLifecycle
import Foundation
public import RunLoopMonitor
public import ServiceLifecycle

/// A `StallMonitor` as a swift-service-lifecycle `Service`: it runs while the
/// application's `ServiceGroup` runs, and stops when the group shuts down.
///
/// ``run()`` starts the monitor with the handler, waits for the group's graceful shutdown (or the
/// task's cancellation), then stops the monitor: a stall in progress gets its `.ended` report,
/// cut short, and the monitor's threads have exited when ``run()`` returns.
///
/// <!-- snippet: prelude
/// import Logging
/// import RunLoopMonitor
/// import ServiceLifecycle
/// let logger = Logger(label: "app")
/// -->
/// ```swift
/// let monitor = StallMonitor(loops: [], threshold: .milliseconds(100), sampleInterval: .milliseconds(20))
/// // monitor.watch(group): the loops to watch (RunLoopMonitorNIO for SwiftNIO's event loops).
/// let stalls = StallMonitorService(monitor: monitor) { event in
///     if case .began(let report) = event { print(report.text) }
/// }
/// let group = ServiceGroup(services: [stalls], logger: logger)
/// // try await group.run(): runs until SIGTERM or the group's graceful shutdown
/// ```
///
/// A monitor starts once: give each service a monitor of its own, and run the service once.
public struct StallMonitorService: Service {
    /// The monitor this service starts and stops; watch sources with it before or while it runs.
    public let monitor: StallMonitor
    private let handler: @Sendable (StallEvent) -> Void

    /// A service that runs `monitor` with `handler`.
    ///
    /// - Parameters:
    ///   - monitor: a monitor not started yet (``run()`` starts it).
    ///   - handler: called on the monitor's reporting thread (`rlk.stallrep`) for each event, in
    ///     order, as `StallMonitor.start(_:)` does; by default nothing beyond the
    ///     monitor's own logging, store and metrics.
    public init(monitor: StallMonitor, handler: @escaping @Sendable (StallEvent) -> Void = { _ in }) {
        self.monitor = monitor
        self.handler = handler
    }

    /// Starts the monitor, waits for graceful shutdown or cancellation, then stops the monitor
    /// and returns (normally in both cases: a monitor that stopped has nothing left to report).
    ///
    /// Outside a `ServiceGroup` it runs until its task is cancelled. The monitor's threads are
    /// joined off Swift's cooperative pool, so a handler still running at the shutdown delays this
    /// call, never another task's thread.
    public func run() async throws {
        monitor.start(handler)
        // Thrown only when the task is cancelled before graceful shutdown: both end the service.
        try? await gracefulShutdown()
        let monitor = self.monitor
        // stop() joins the monitor's threads, which may be busy for a while (a capture, a name
        // lookup): on a thread of its own, not a dispatch worker, whose pool the application's
        // blocked work may have used up (it then waited seconds for a worker, under load).
        await withCheckedContinuation { (done: CheckedContinuation<Void, Never>) in
            let stopper = Thread {
                monitor.stop()
                done.resume()
            }
            stopper.name = "rlk.stallmon-stop"
            stopper.start()
        }
    }
}

extension StallMonitorService: CustomStringConvertible {
    /// `StallMonitorService`: the name `ServiceGroup` logs for it.
    public var description: String { "StallMonitorService" }
}
#else
public import RunLoopMonitor

// Without the package trait ServiceLifecycle this module has no swift-service-lifecycle code (the
// package is not even in the dependency graph); a program that uses the service finds this
// unavailable stand-in, whose message says what to do, rather than "cannot find in scope".

/// Needs the package trait `ServiceLifecycle` (unavailable without it).
@available(
    *, unavailable,
    message: "RunLoopMonitorService needs the package trait ServiceLifecycle: .package(url: \"https://github.com/runloopkit/RunLoopKit\", from: \"0.1.0\", traits: [\"ServiceLifecycle\"])"
)
public struct StallMonitorService: Sendable {
    /// Needs the package trait `ServiceLifecycle`.
    public init(monitor: StallMonitor, handler: @escaping @Sendable (StallEvent) -> Void = { _ in }) {}
}
#endif
