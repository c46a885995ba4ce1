import RunLoopKit
import Synchronization

/// The autorelease-pool observers, for Swift on Linux: objects handed to ``release(_:)`` are kept
/// until the end of the loop's iteration, and closures handed to ``defer(_:)`` run then (closing
/// descriptors, returning buffers, dropping caches at a point the caller can reason about).
///
/// As UIKit's pools: a level is pushed when a run of the loop begins (`entry`, at ``pushOrder``);
/// it is drained when the loop is about to sleep (`beforeWaiting`) and drained and popped when the
/// run ends (`exit`), both at ``popOrder``, each run level on its own, so a nested run
/// lets go of only what was handed over inside it. A drain goes last in, first out. What is handed
/// over during a drain (by a deferred closure or a deinit) waits for the next drain, and the loop
/// is woken for it: a closure that defers itself forever runs once per iteration and cannot
/// starve timers or sources.
///
/// A deferred closure or a `deinit` may run the loop nested: that run pushes its own level at
/// `entry` but cannot pop it at `exit` (the drain's observer is firing, and an observer is never
/// re-entered), so the drain folds what such runs left into the level below, for the next drain,
/// as popping an outer autorelease pool pops the inner ones.
///
/// Any thread may hand objects and closures over; they are let go on the loop's thread. The pool
/// stays on its loop until ``invalidate()`` or the loop's thread exits; either lets go of
/// everything pending at once (on the calling or exiting thread).
public final class IterationPool: Sendable {
    /// The default order of the push at `entry`: before every other observer.
    public static let defaultPushOrder = Int.min + 1
    /// The default order of the drain at `beforeWaiting` and `exit`: after every other observer,
    /// an ``IdleTaskQueue``'s (`Int.max - 999`, DWURunLoopWorkDistribution's) included.
    public static let defaultPopOrder = Int.max
    /// UIKit's orders on the iOS main loop, `-2147483647` and `2147483647` (32-bit bounds, although
    /// `CFIndex` is 64-bit there): pass them to reproduce its observer list exactly. An observer
    /// ordered above `2147483647` (DWURunLoopWorkDistribution's `NSIntegerMax - 999`) then runs
    /// after the drain, and what it hands over waits for the next one.
    public static let uiKitOrders = (push: -2_147_483_647, pop: 2_147_483_647)

    /// The loop whose iterations drain the pool.
    public let loop: RunLoop
    /// The order of the `entry` observer that pushes a level.
    public let pushOrder: Int
    /// The order of the `beforeWaiting` and `exit` observer that drains (and at exit pops) it.
    public let popOrder: Int

    private let core: Core

    /// A pool drained by `loop`'s iterations in `modes` (the common modes by default): runs in
    /// other modes neither push a level nor drain. `pushOrder` and `popOrder` place its two
    /// observers among the loop's others (see ``uiKitOrders``).
    public init(
        loop: RunLoop, modes: [RunLoop.Mode] = [.common], pushOrder: Int = IterationPool.defaultPushOrder,
        popOrder: Int = IterationPool.defaultPopOrder
    ) {
        require(!modes.isEmpty, "IterationPool needs at least one mode")
        self.loop = loop
        self.pushOrder = pushOrder
        self.popOrder = popOrder
        let core = Core(loop: loop)
        self.core = core
        let detach = DetachSignal { [core] in core.detached() }
        let push = RunLoopObserver(activities: .entry, order: pushOrder) { [core] _, _ in
            detach.keepAlive()
            core.push()
        }
        let pop = RunLoopObserver(activities: [.beforeWaiting, .exit], order: popOrder) { [core] _, activity in
            detach.keepAlive()
            core.drain(popping: activity == .exit)
        }
        core.observers.locked { $0 = [Weak(value: push), Weak(value: pop)] }
        loop.add(push, forModes: modes)
        loop.add(pop, forModes: modes)
    }

    /// Keeps `object` alive until the end of the current iteration of the loop.
    public func release(_ object: AnyObject) { core.hand(.object(ObjectBox(object))) }

    /// Runs `body` on the loop's thread at the end of the current iteration.
    public func `defer`(_ body: @escaping @Sendable () -> Void) { core.hand(.closure(body)) }

    /// How many objects and closures wait for the next drain, all levels together.
    public var pendingCount: Int { core.state.locked { $0.levels.reduce(0) { $0 + $1.count } } }

    /// Whether the pool is still on its loop.
    public var isValid: Bool { core.state.locked { $0.valid } }

    /// Takes the pool off its loop and lets go of everything pending now (deferred closures are
    /// dropped, not run). Any thread, including from inside a deferred closure.
    public func invalidate() { core.invalidate() }
}

extension IterationPool {
    /// A reference handed to the pool.
    ///
    /// `@unchecked Sendable`: the pool never reads, calls or copies the object; it holds one
    /// reference and drops it on the loop's thread. Dropping a reference is thread-safe (atomic
    /// reference counts), and the object's `deinit` runs where its last reference goes, as it
    /// would without the pool: handing an object over is the caller's statement that this is fine.
    struct ObjectBox: @unchecked Sendable {
        let object: AnyObject
        init(_ object: AnyObject) { self.object = object }
    }

    enum Item: Sendable {
        case object(ObjectBox)
        case closure(@Sendable () -> Void)
    }

    struct State: ~Copyable {
        var valid = true
        /// One list per run level in progress, innermost last; the outermost run's list also
        /// holds what is handed over while the loop does not run.
        var levels: [[Item]] = [[]]
        /// Runs in progress (nested included).
        var depth = 0
        var draining = false
    }

    final class Core: Sendable {
        weak let loop: RunLoop?
        let state = Mutex(State())
        let observers = Mutex<[Weak<RunLoopObserver>]>([])

        init(loop: RunLoop) { self.loop = loop }

        func hand(_ item: Item) {
            let (accepted, wake) = state.locked { state -> (Bool, Bool) in
                guard state.valid else { return (false, false) }
                state.levels[state.levels.count - 1].append(item)
                return (true, state.draining)
            }
            if !accepted { withExtendedLifetime(item) {} }
            guard accepted, let loop else { return }
            // Off the loop's thread the loop may sleep with it; during a drain it waits for the
            // next one, which must come.
            if wake || !loop.isCurrent { loop.wakeUp() }
        }

        func push() {
            state.locked { state in
                state.depth += 1
                if state.depth > 1 { state.levels.append([]) }
            }
        }

        func drain(popping: Bool) {
            let (items, height, depth) = state.locked { state -> ([Item], Int, Int) in
                let items = state.levels[state.levels.count - 1]
                state.levels[state.levels.count - 1] = []
                if popping {
                    if state.levels.count > 1 && state.depth > 1 { state.levels.removeLast() }
                    state.depth = max(0, state.depth - 1)
                }
                state.draining = true
                return (items, state.levels.count, state.depth)
            }
            var pending = items
            while let item = pending.popLast() {
                if case .closure(let body) = item { body() }
                // an object is let go here, as `item` goes out of scope
            }
            let orphans = state.locked { state -> Bool in
                state.draining = false
                // A run nested in a deferred closure or a deinit pushed a level at its entry, but
                // its exit could not pop it: this observer was firing (an observer is never
                // re-entered). Those runs are over; what they left goes to the level below, for
                // the next drain.
                guard state.levels.count > height else { return false }
                let left = state.levels[height...].joined()
                state.levels.removeSubrange(height...)
                state.levels[height - 1].append(contentsOf: left)
                state.depth = depth
                return !left.isEmpty
            }
            if orphans { loop?.wakeUp() }
        }

        func invalidate() {
            let dropped = state.locked { state -> [[Item]] in
                state.valid = false
                defer { state.levels = [[]] }
                return state.levels
            }
            for observer in observers.locked({ $0 }) { observer.value?.invalidate() }
            withExtendedLifetime(dropped) {}
        }

        func detached() { invalidate() }
    }
}
