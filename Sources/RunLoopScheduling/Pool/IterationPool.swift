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
/// What the innermost level holds keeps the pool's modes from counting as empty
/// (`RunLoopPendingWork`), as CoreFoundation's pending blocks do: a run in a mode that holds
/// nothing else drains it instead of returning `.finished` at once. An outer level's work does not
/// keep a nested run alive (that run does not drain it), nor does work handed over during a drain.
///
/// A deferred closure or a `deinit` may run the loop nested: that run pushes its own level at
/// `entry` but cannot pop it at `exit` (the drain's observer is firing, and an observer is never
/// re-entered), so the drain folds what such runs left into the level below, for the next drain,
/// as popping an outer autorelease pool pops the inner ones; levels are kept by the loop's run
/// depth, so a level left behind is found by the next run at its depth too. The loop is woken for
/// the next drain even when such a run took the wakeup meant for it.
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

    private let core: Drainer

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
        let core = Drainer(loop: loop, modes: modes)
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
        core.observers.locked { $0 = [Weak(push), Weak(pop)] }
        loop.add(push, forModes: modes)
        loop.add(pop, forModes: modes)
    }

    /// Keeps `object` alive until the end of the current iteration of the loop.
    public func release(_ object: AnyObject) { core.hand(.object(ObjectBox(object))) }

    /// Runs `body` on the loop's thread at the end of the current iteration.
    public func `defer`(_ body: @escaping @Sendable () -> Void) { core.hand(.closure(body)) }

    /// How many objects and closures wait for the next drain, all levels together.
    public var pendingCount: Int { core.state.locked { $0.pendingCount } }

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

    /// What one run level holds: the run depth whose `entry` pushed it (1 for the outermost
    /// run's level, which also takes what is handed over while the loop does not run).
    struct Level: Sendable {
        let depth: Int
        var items: [Item] = []
    }

    struct State: ~Copyable {
        var valid = true
        /// One level per run in progress in the pool's modes, innermost last. Levels deeper than
        /// the run draining are stale: pushed by a run nested in a drain's callout, whose exit
        /// could not pop them (see `foldLevels(deeperThan:)`).
        var levels: [Level] = [Level(depth: 1)]
        var draining = false

        var pendingCount: Int { levels.reduce(0) { $0 + $1.items.count } }

        /// Moves what levels deeper than `depth` hold into the level below them, and drops them:
        /// the runs that pushed them are over, and the run at `depth` (or the enclosing one)
        /// drains what they left. The outermost level stays.
        mutating func foldLevels(deeperThan depth: Int) {
            while levels.count > 1, levels[levels.count - 1].depth > depth {
                let stale = levels.removeLast()
                levels[levels.count - 1].items.append(contentsOf: stale.items)
            }
        }
    }

    /// What the loop's observers hold: the pooled items and their release (LoopAttachment.swift).
    final class Drainer: Sendable {
        weak let loop: RunLoop?
        let running: LoopOnItsThread
        let state = Mutex(State())
        let observers = Mutex<[Weak<RunLoopObserver>]>([])
        /// Keeps the pool's modes from counting as empty while work waits (see `publish`).
        let pending: RunLoopPendingWork

        init(loop: RunLoop, modes: [RunLoop.Mode]) {
            self.loop = loop
            running = LoopOnItsThread(loop)
            pending = RunLoopPendingWork(loop: loop, modes: modes)
        }

        /// Says whether the innermost level holds work, under the state's lock after each change:
        /// it keeps the pool's modes alive, as pending blocks do. Not an outer level's (a nested
        /// run cannot drain it), and not during a drain (a run nested in a deferred closure or a
        /// deinit cannot drain: the observer is firing).
        func publish(_ state: borrowing State) {
            pending.isPending = state.valid && !state.draining && !state.levels[state.levels.count - 1].items.isEmpty
        }

        func hand(_ item: Item) {
            let (accepted, wake) = state.locked { state -> (Bool, Bool) in
                guard state.valid else { return (false, false) }
                state.levels[state.levels.count - 1].items.append(item)
                publish(state)
                return (true, state.draining)
            }
            if !accepted { withExtendedLifetime(item) {} }
            guard accepted, let loop else { return }
            // Off the loop's thread the loop may sleep with it; during a drain it waits for the
            // next one, which must come.
            if wake || !loop.isCurrent { loop.wakeUp() }
        }

        /// The `entry` observer: a level for the run starting, unless it is the outermost one.
        func push() {
            let depth = running.withLoop { $0.runDepthOnOwnThread }
            state.locked { state in
                // Levels as deep as this run's are stale (runs nested in a drain, now over).
                state.foldLevels(deeperThan: depth - 1)
                if depth > 1 { state.levels.append(Level(depth: depth)) }
                publish(state)
            }
        }

        /// The `beforeWaiting` and `exit` observer: lets go of what the innermost level holds
        /// (with what stale levels above it left), last in first out, one at a time; at `exit`
        /// the level of a nested run is popped first, so what its drain hands over goes to the
        /// enclosing run's level.
        func drain(popping: Bool) {
            let depth = running.withLoop { $0.runDepthOnOwnThread }
            var items = state.locked { state -> [Item] in
                state.foldLevels(deeperThan: depth)
                let top = state.levels.count - 1
                let items = state.levels[top].items
                if popping && top > 0 && state.levels[top].depth == depth {
                    state.levels.removeLast()
                } else {
                    state.levels[top].items = []
                }
                state.draining = true
                publish(state)
                return items
            }
            // Owned here alone: each item is let go as it is popped, so a deinit runs inside the
            // drain, in order, not when the array goes at the end.
            while let item = items.popLast() {
                if case .closure(let body) = item { body() }
                // an object is let go here, as `item` goes out of scope
            }
            let again = state.locked { state -> Bool in
                state.draining = false
                // Runs nested in a deferred closure or a deinit pushed levels their exits could not
                // pop (this observer was firing): what they left goes to this run's level.
                state.foldLevels(deeperThan: popping ? depth - 1 : depth)
                publish(state)
                return !popping && !state.levels[state.levels.count - 1].items.isEmpty
            }
            // Handed over during the drain: the next drain must come, and the wakeup `hand` asked
            // for may have been taken by a run nested in a callout.
            if again { running.withLoop { $0.wakeUp() } }
        }

        func invalidate() {
            let dropped = state.locked { state -> [Level] in
                state.valid = false
                defer { state.levels = [Level(depth: 1)] }
                return state.levels
            }
            pending.invalidate()
            for observer in observers.locked({ $0 }) { observer.value?.invalidate() }
            withExtendedLifetime(dropped) {}
        }

        func detached() { invalidate() }
    }
}
