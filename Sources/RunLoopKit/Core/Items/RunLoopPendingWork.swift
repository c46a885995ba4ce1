import Synchronization

/// Work for some modes of a loop that waits outside the loop's own lists (tasks queued for an
/// observer, commits set for the next `beforeWaiting`): while it is pending, those modes do not
/// count as empty, as CoreFoundation counts a mode's pending blocks (`CFRunLoopPerformBlock`).
///
/// A run in a mode with no sources, timers or blocks returns ``RunLoop/RunResult/finished`` at
/// once, without calling observers. Work an observer would do (an idle task, a commit, a release
/// pool's drain) would be stranded there until some later run. Make one `RunLoopPendingWork` for
/// such an object, and set ``isPending`` whenever what it holds changes, under the object's own
/// lock; the run goes on while it is true:
///
/// ```swift
/// let pending = RunLoopPendingWork(loop: loop, modes: [.default])
/// pending.isPending = true      // a task was queued; the beforeWaiting observer will run it
/// // … the observer ran the last one:
/// pending.isPending = false
/// ```
///
/// The rules:
/// - While ``isPending`` is true, a run in one of `modes` (any common mode for
///   ``RunLoop/Mode/common``) does not end ``RunLoop/RunResult/finished``, and
///   ``RunLoop/run(mode:before:)-(_,ContinuousClock.Instant)`` runs instead of returning false.
/// - It does not wake the loop, as `CFRunLoopPerformBlock` does not: work set from another thread
///   is followed by ``RunLoop/wakeUp()`` when the loop may sleep, as for a version-0 source.
/// - A pass does not sleep with its mode empty once pending work of the mode was done during the
///   run (``isPending`` went false, say in a `beforeWaiting` observer, and nothing else is in the
///   mode): the run ends ``RunLoop/RunResult/finished`` there instead of sleeping to its timeout.
///   CoreFoundation sleeps after the last pending block with its mode empty; here the work runs at
///   `beforeWaiting`, just before that sleep, and a run that waited for it should return.
/// - Set it false while the work cannot be done by a run nested in the object's own callout (the
///   observer that would do it is firing, and an observer is never re-entered): true there would
///   keep that nested run alive to its timeout for work it can never do.
/// - ``invalidate()`` (or the last reference going) lets go of the modes for good.
///
/// - Complexity: Setting ``isPending`` is an atomic load when nothing changes, a
///   compare-and-exchange and one or two atomic additions per mode when it does. A pass pays for it only when its mode has no sources,
///   timers or version-1 sources: then two atomic loads when it asks whether the mode is empty.
public final class RunLoopPendingWork: Sendable {
    /// The counters of the modes it holds: one per mode, the loop's common counter for
    /// ``RunLoop/Mode/common``.
    private let counters: [PendingWorkCount]
    /// `idle`, `pending` or `invalidated` (a compare-and-exchange moves it, so that two threads
    /// setting it at once count it once).
    private let status = Atomic<UInt8>(RunLoopPendingWork.idle)
    private static let idle: UInt8 = 0
    private static let pending: UInt8 = 1
    private static let invalidated: UInt8 = 2

    /// Pending work for `modes` of `loop` (``RunLoop/Mode/common``: every common mode, now and
    /// later), none pending yet. A mode named here is made if the loop lacks it, as adding an
    /// item makes it.
    public init(loop: RunLoop, modes: [RunLoop.Mode]) {
        counters = loop.pendingWorkCounters(for: modes)
    }

    deinit { invalidate() }

    /// Whether work is pending: while true, the modes are not empty. Any thread.
    public var isPending: Bool {
        get { status.load(ordering: .acquiring) == Self.pending }
        set {
            let wanted = newValue ? Self.pending : Self.idle
            var current = status.load(ordering: .relaxed)
            while current != wanted && current != Self.invalidated {
                let (exchanged, found) = status.compareExchange(
                    expected: current, desired: wanted, ordering: .acquiringAndReleasing)
                if exchanged {
                    for counter in counters { counter.add(newValue ? 1 : -1) }
                    return
                }
                current = found
            }
        }
    }

    /// Lets go of the modes for good: ``isPending`` stays false. Any thread.
    public func invalidate() {
        if status.exchange(Self.invalidated, ordering: .acquiringAndReleasing) == Self.pending {
            for counter in counters { counter.add(-1) }
        }
    }
}

/// How many ``RunLoopPendingWork`` objects have work pending for one mode (or for the common
/// modes): what the run algorithm's emptiness rule reads.
final class PendingWorkCount: Sendable {
    private let count = Atomic<Int>(0)
    /// How many times an object's work stopped being pending: a run that sees it move knows that
    /// work it may have been waiting for is done (see `RunLoop.pendingWorkWasDone`).
    private let lettings = Atomic<UInt64>(0)

    @inline(__always)
    var isHeld: Bool { count.load(ordering: .acquiring) > 0 }

    @inline(__always)
    var letGo: UInt64 { lettings.load(ordering: .acquiring) }

    func add(_ delta: Int) {
        // The letting go first: a run that finds the count down finds it counted.
        if delta < 0 { lettings.add(1, ordering: .releasing) }
        count.add(delta, ordering: .releasing)
    }
}

extension RunLoop {
    /// The counters `modes` stand for (the mode made if missing).
    func pendingWorkCounters(for modes: [Mode]) -> [PendingWorkCount] {
        state.locked { state in
            modes.map { mode in
                mode == .common ? commonPendingWork : state.modes[state.index(of: mode)].pendingWork
            }
        }
    }
}
