import CBenchSupport
import RunLoopKit

import class RunLoopKit.RunLoop

/// The `iterate` work on RunLoopKit, for the workloads that measure what something costs it (a
/// StallMonitor, a TraceRecorder): a Source0 on the calling thread's loop that re-signals itself
/// until a pass count is reached, each ``pass(_:counting:)`` one run of the loop.
///
/// `@unchecked Sendable` (this and ``State``): the state is touched only on the loop's thread, by
/// the source's callback and by ``pass(_:counting:)``, which runs the loop on that same thread
/// (the thread that made it).
final class SpinningSource: @unchecked Sendable {
    /// What the callback reads and writes; captured strongly, as the `iterate` workload's own
    /// source does, so that the measured pass is the same.
    private final class State: @unchecked Sendable {
        var count = 0
        var target = 0
        var counting = false
        var allocations = 0
    }

    private let state = State()
    private let me = Box<RunLoopSource?>(nil)
    private let loop: RunLoop

    /// Mallocs on the loop's thread during the last counted pass.
    var allocations: Int { state.allocations }

    /// Adds the source to the calling thread's loop, in `.default`.
    init() {
        loop = RunLoop.current
        let (state, me) = (state, me)
        let source = RunLoopSource {
            state.count += 1
            if state.counting && state.count == 1 { cbench_alloc_counter_start() }
            if state.count < state.target {
                me.value!.signal()
            } else {
                if state.counting { state.allocations = cbench_alloc_counter_stop() }
                RunLoop.current.stop()
            }
        }
        me.value = source
        loop.add(source, forMode: .default)
    }

    /// Runs the loop for exactly `n` passes; with `counting`, counts their mallocs.
    func pass(_ n: Int, counting: Bool = false) {
        state.count = 0
        state.target = n
        state.counting = counting
        me.value!.signal()
        loop.run(mode: .default, for: .seconds(600))
        precondition(state.count == n, "RunLoopKit stopped after \(state.count) of \(n) iterations")
    }

    /// Removes the source from the loop (and lets go of it: the source and this hold each other).
    func invalidate() {
        me.value?.invalidate()
        me.value = nil
    }
}
