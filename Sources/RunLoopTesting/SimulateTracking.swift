import RunLoopKit

import class RunLoopKit.RunLoop

extension RunLoop {
    /// Runs the loop in `RunLoop.Mode.tracking` for `duration`, as UIKit runs the main loop
    /// while a finger drags a scroll view: a simulated scroll, for a test of what scrolling does to
    /// the code's timers, observers and blocks.
    ///
    /// The plain recipe, `loop.run(mode: .tracking, for: duration)`, tests nothing when nothing is
    /// in `.tracking`: a run in an empty mode returns `.finished` at once (CoreFoundation's rule),
    /// and the "scroll" lasts microseconds. During a real scroll UIKit's event source is in the
    /// mode; here a source that is never signalled stands for it, so the run lasts `duration`,
    /// and the items of `.tracking` (those added for `.common` included) run as
    /// they would while scrolling. As UIKit does on the main loop, `.tracking` is made one of the
    /// loop's common modes first (modes stay common once made so, as in CoreFoundation).
    ///
    /// Call it where the scroll starts: from a callout of the loop (a timer or block standing for
    /// the touch), which makes it a nested run as in UIKit, or directly on the loop's thread. On a
    /// loop on virtual time (``withVirtualTime(_:)``) the clock moves by `duration`, exactly.
    ///
    /// <!-- snippet: prelude
    /// import Synchronization
    /// -->
    /// ```swift
    /// let common = Atomic(0)
    /// let defaultOnly = Atomic(0)
    /// let a = RunLoopTimer(after: .milliseconds(10), repeating: .milliseconds(10)) { _ in
    ///     common.add(1, ordering: .relaxed)
    /// }
    /// let b = RunLoopTimer(after: .milliseconds(10), repeating: .milliseconds(10)) { _ in
    ///     defaultOnly.add(1, ordering: .relaxed)
    /// }
    /// loop.add(a, forMode: .common)
    /// loop.add(b, forMode: .default)
    /// loop.simulateTracking(for: .milliseconds(200))
    /// // common: about 20 ticks; defaultOnly: 0 (it waits for the end of the scroll)
    /// ```
    ///
    /// - Returns: What the run returned: `.timedOut` when the scroll lasted
    ///   `duration`, `.stopped` when `stop()` ended it first.
    /// - Precondition: Called on the loop's own thread.
    @discardableResult
    public func simulateTracking(for duration: Duration) -> RunResult {
        precondition(isCurrent, "simulateTracking(for:) runs the loop: call it on \(self)'s own thread")
        addCommonMode(.tracking)
        let touches = RunLoopSource {}
        touches.label = "simulated tracking"
        add(touches, forMode: .tracking)
        defer { touches.invalidate() }
        return run(mode: .tracking, for: duration)
    }
}
