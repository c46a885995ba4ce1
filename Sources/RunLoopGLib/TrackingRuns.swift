#if GLib
public import RunLoopKit
import Synchronization

/// Runs a loop in a tracking mode while a gesture lasts, the run entered at the top of the loop
/// after the event handler that began the gesture has returned: UIKit's "push the tracking mode"
/// for a toolkit that has no nested loop of its own during a drag, such as GTK 4.
///
/// GTK 4 scrolls a dragged scroll view from its ordinary event dispatch: no nested main loop runs
/// while the finger or the pointer is down (`value-changed` comes at `g_main_depth() == 1`). So
/// something has to put the loop in `.tracking` for the gesture's duration, and it must not be the
/// gesture's own `begin` handler: a run nested there holds the event that began the gesture, and
/// GTK delivers it to the scroll bar only after the handler returns (measured: the scroll bar never
/// got its press and the view did not move). ``begin(_:)`` therefore only asks; a block of the
/// loop, in one of the modes given at `init` (the common modes by default), enters the tracking
/// run once the current callout (GLib's dispatch of the event) has returned, and ``end(_:)`` stops
/// it at its next pass.
///
/// ```swift
/// let tracking = TrackingRuns()   // RunLoop.current, .tracking
/// tracking.begin()                // in a GtkGestureDrag's "drag-begin" handler
/// tracking.end()                  // in its "drag-end" handler
/// ```
///
/// While the tracking run lasts, only items of the tracking mode run: a timer added for
/// `.default` waits (the seeds' NSTimer), one added for `.common` fires, and a `GLibBridge`
/// attached in `.common` keeps GTK's events and frames going, which is what ends the gesture. The
/// tracking mode is made one of the loop's common modes first, as UIKit does.
///
/// Several gestures may overlap: each calls ``begin(_:)`` and ``end(_:)`` with its own
/// `requester`, and the run lasts while any has begun and not ended. An ``end(_:)`` for a
/// requester that has not begun, or a second one, does nothing. A gesture whose end never comes
/// (a lost `drag-end`) ends the run after `limit`.
///
/// Safe from any thread; the tracking run itself runs on the loop's thread.
public final class TrackingRuns: Sendable {
    /// The loop that runs in ``mode``.
    public let loop: RunLoop
    /// The mode of the tracking runs (`RunLoop.Mode.tracking` by default).
    public let mode: RunLoop.Mode
    /// The modes in which the loop may enter a tracking run: a block queued in them enters it.
    public let entryModes: [RunLoop.Mode]
    /// The longest a tracking run lasts when its gestures never end.
    public let limit: Duration

    private struct State {
        var requesters: Set<UInt> = []
        /// A block that enters the run is queued and has not run yet.
        var entryQueued = false
        /// The tracking run is in progress.
        var running = false
        var entered = 0
        var cutShort = 0
    }

    private let state = Mutex(State())

    /// A tracking controller for `loop`.
    ///
    /// - Parameters:
    ///   - loop: The loop to run in `mode` (the calling thread's by default).
    ///   - mode: The tracking mode; made one of the loop's common modes when a run is entered.
    ///   - entryModes: Where the loop enters the run from: `RunLoop.Mode.common` (the default)
    ///     is every common mode, so the loop enters it from `.default` and not from a private
    ///     mode of a modal run.
    ///   - limit: The longest one tracking run lasts if its gestures never end (60 s by default).
    public init(
        loop: RunLoop = .current, mode: RunLoop.Mode = .tracking, entryModes: [RunLoop.Mode] = [.common],
        limit: Duration = .seconds(60)
    ) {
        self.loop = loop
        self.mode = mode
        self.entryModes = entryModes
        self.limit = limit
    }

    /// A gesture began: the loop enters a tracking run at its next pass in one of ``entryModes``,
    /// after the callout in progress returns, unless one is already in progress. A second
    /// `begin` for the same `requester` does nothing.
    ///
    /// - Parameter requester: Which gesture: any number unique among the gestures that may
    ///   overlap (a GTK gesture's address, for instance); 0 by default.
    public func begin(_ requester: UInt = 0) {
        let queue = state.locked { state -> Bool in
            state.requesters.insert(requester)
            guard !state.running, !state.entryQueued else { return false }
            state.entryQueued = true
            return true
        }
        guard queue else { return }
        loop.perform(inModes: entryModes) { [self] in enter() }
    }

    /// A gesture ended: once no gesture is left, the tracking run ends at its next pass (a run not
    /// yet entered is not entered). An `end` without its `begin`, or a second one, does nothing.
    ///
    /// - Parameter requester: The number its ``begin(_:)`` was given.
    public func end(_ requester: UInt = 0) {
        let stop = state.locked { state -> Bool in
            guard state.requesters.remove(requester) != nil else { return false }
            return state.requesters.isEmpty && state.running
        }
        guard stop else { return }
        // Stopped from inside the tracking run, at its next pass: `stop()` now would end whatever
        // run is innermost when this is called from another thread, or from a run nested in a
        // callout of the tracking run.
        loop.perform(inModes: [mode]) { [self] in
            if state.locked({ $0.requesters.isEmpty && $0.running }) { loop.stop() }
        }
    }

    /// Ends every gesture (as ``end(_:)`` for each requester that has begun).
    public func endAll() {
        let requesters = state.locked { $0.requesters }
        for requester in requesters { end(requester) }
    }

    /// Whether a tracking run is in progress.
    public var isTracking: Bool { state.locked { $0.running } }

    /// How many tracking runs were entered so far.
    public var runsEntered: Int { state.locked { $0.entered } }

    /// How many tracking runs ended because their gestures did not end within ``limit``.
    public var runsCutShort: Int { state.locked { $0.cutShort } }

    /// The queued block: runs the loop in ``mode`` until every gesture has ended or ``limit``
    /// passes.
    private func enter() {
        let go = state.locked { state -> Bool in
            state.entryQueued = false
            guard !state.requesters.isEmpty, !state.running else { return false }
            state.running = true
            state.entered += 1
            return true
        }
        guard go else { return }
        loop.addCommonMode(mode)
        // The gesture's events come through a source of another mode (a GLib bridge in the common
        // modes); this one keeps the tracking mode from being empty if there is none, as UIKit's
        // event source is in its tracking mode.
        let gesture = RunLoopSource {}
        gesture.label = "TrackingRuns gesture"
        loop.add(gesture, forMode: mode)
        let deadline = ContinuousClock.now + limit
        while state.locked({ !$0.requesters.isEmpty }) && ContinuousClock.now < deadline {
            if loop.run(mode: mode, for: deadline - .now) == .finished { break }
        }
        gesture.invalidate()
        state.locked { state in
            state.running = false
            if !state.requesters.isEmpty {
                state.cutShort += 1
                state.requesters.removeAll()
            }
        }
    }
}
#endif
