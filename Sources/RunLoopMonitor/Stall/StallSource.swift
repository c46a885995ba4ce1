import CRunLoopMonitor
import Dispatch
import Glibc
import RunLoopKit
import Synchronization

// What a StallMonitor watches: one thread that alternates between units of work and waiting.
// RunLoopKit's loops publish that in two words the monitor reads (their phase and callout);
// other loops publish it through a conformer of their own: SwiftNIO's event loops
// (RunLoopMonitorNIO, from NIO's tick reports), a libdispatch queue (a heartbeat block), a thread
// the application runs itself (ThreadStallSource, a hook it calls).

/// Something a ``StallMonitor`` can watch: a thread that runs units of work (callouts, ticks,
/// tasks) and waits between them.
///
/// The monitor calls ``stallSnapshot()`` on its sampling thread at every look (once per sample
/// interval): it must be cheap, must not block, and must never wait for the watched thread. A
/// stall is one unit of work (the same ``StallSnapshot/work`` and ``StallSnapshot/step``) seen
/// busy for longer than the threshold; the monitor then samples the stack of
/// ``StallSnapshot/threadID`` as it does for a RunLoopKit loop.
public protocol StallSource: AnyObject, Sendable {
    /// The name in reports, logs and metrics (the `loop` label) unless ``StallMonitor/watch(_:name:)``
    /// gives one.
    var stallSourceName: String { get }

    /// What the watched thread is doing now. Sampling thread; cheap; never waits.
    func stallSnapshot() -> StallSnapshot

    /// Arranges for `ThreadStack.prepareCurrentThread()` to run on the watched thread, if the
    /// source can run code there (a block, a task): a thread that inherited a mask blocking every
    /// signal can then be sampled while it runs. Called once when watching starts.
    func prepareForStallMonitoring()

    /// The mode the thread runs in, for a stall's report (RunLoopKit loops); nil where there is
    /// none. Called once when a stall begins.
    func currentStallMode() -> String?
}

extension StallSource {
    /// No modes.
    public func currentStallMode() -> String? { nil }
}

/// What a watched thread is doing, as a ``StallSource`` sees it.
public struct StallSnapshot: Sendable, Hashable {
    /// Whether the thread is in a unit of work.
    public enum Activity: Sendable, Hashable {
        /// The loop is not running (a RunLoopKit loop between runs): not watched.
        case notRunning
        /// Waiting for work (asleep in the kernel, or between units).
        case idle
        /// In a unit of work.
        case busy
    }

    /// Whether the thread is in a unit of work.
    public var activity: Activity
    /// The thread's kernel id; 0 while it is not known (a heartbeat never answered).
    public var threadID: Int32
    /// Changes whenever a new unit of work begins (a pass, a tick, a heartbeat answered).
    public var work: UInt64
    /// Changes between units of work inside one ``work`` (a callout of a pass); 0 if unused.
    public var step: UInt32
    /// When the current unit of work began, if the source stamps it.
    public var busySince: ContinuousClock.Instant?
    /// Whether ``busySince`` is exactly when the work began (a heartbeat's send time), not only a
    /// stamp the monitor may improve on from its own looks.
    public var busySinceIsExact: Bool
    /// When the thread began to wait, if the source stamps it.
    public var idleSince: ContinuousClock.Instant?
    /// The phase of the work, for reports and the `phase` metric label (`tick`, `heartbeat`,
    /// `timers`…).
    public var phase: String
    /// What runs, for ``StallReport/item``.
    public var item: String
    /// The thread's name when it is known to the source (otherwise read from the kernel).
    public var threadName: String?
    /// Whether the thread has exited (or its loop was shut down): the monitor forgets the source.
    public var threadExited: Bool

    /// A snapshot; see each property.
    public init(
        activity: Activity, threadID: Int32, work: UInt64, step: UInt32 = 0, busySince: ContinuousClock.Instant? = nil,
        busySinceIsExact: Bool = false, idleSince: ContinuousClock.Instant? = nil, phase: String, item: String,
        threadName: String? = nil, threadExited: Bool = false
    ) {
        self.activity = activity
        self.threadID = threadID
        self.work = work
        self.step = step
        self.busySince = busySince
        self.busySinceIsExact = busySinceIsExact
        self.idleSince = idleSince
        self.phase = phase
        self.item = item
        self.threadName = threadName
        self.threadExited = threadExited
    }
}

// MARK: - RunLoopKit loops

extension RunLoop: StallSource {
    /// The loop's thread name.
    public var stallSourceName: String { threadName }

    /// The loop's phase and callout words (what it publishes anyway; reading them costs the loop
    /// nothing).
    public func stallSnapshot() -> StallSnapshot {
        let snapshot = phaseSnapshot
        let callout = calloutSnapshot
        let activity: StallSnapshot.Activity =
            switch snapshot.phase {
            case .notRunning: .notRunning
            case .waiting: .idle
            default: .busy
            }
        // A callout that runs another loop's work (RunLoopGLib's dispatch) may say which: asked
        // only while the loop is busy (one relaxed load when the loop has no describer).
        let item = activity == .busy ? calloutDetail(of: callout) ?? callout.description : callout.description
        return StallSnapshot(
            activity: activity, threadID: threadID, work: snapshot.generation, step: callout.sequence,
            busySince: snapshot.busySince, idleSince: snapshot.phase == .waiting ? snapshot.since : nil,
            phase: snapshot.phase.description, item: item, threadName: nil,
            threadExited: hasThreadExited)
    }

    /// Performs `ThreadStack.prepareCurrentThread()` on the loop's thread at its next pass in a
    /// common mode (before blocks performed after this call).
    public func prepareForStallMonitoring() {
        perform(inModes: [.common]) { ThreadStack.prepareCurrentThread() }
    }

    /// The loop's current mode.
    public func currentStallMode() -> String? { currentMode?.rawValue }
}
