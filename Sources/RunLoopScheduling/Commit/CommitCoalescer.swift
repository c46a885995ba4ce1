import RunLoopKit
import Synchronization

/// Coalesced commits: Core Animation's `CATransaction` commit and Texture's transaction group.
///
/// Any number of ``setNeedsCommit(key:_:)`` calls in one iteration run each key's *latest* work
/// once, in the order the keys were first set, when the loop is about to sleep (`beforeWaiting`)
/// and when a run of the loop ends (`exit`, nested runs included), at the observer order given
/// (2,000,000 by default, Core Animation's). Work set during a commit (by the commit itself, or
/// by another thread meanwhile) runs in the next iteration, and the loop is woken for it, so
/// nothing is stranded while the loop sleeps. Pending work keeps the coalescer's modes from
/// counting as empty (`RunLoopPendingWork`), as CoreFoundation's pending blocks do: a run in a mode
/// that holds nothing else commits it instead of returning `.finished` at once (work set during a
/// commit does not keep a run nested in it alive: that run cannot commit). Several coalescers at different orders compose as
/// the iOS main loop's observers do: a layout coalescer at 1,999,000 whose commit sets work on a
/// display coalescer at 2,000,000 has that work committed in the same iteration.
///
/// The coalescer stays on its loop until ``invalidate()`` or the loop's thread exits; either
/// drops (and releases) the pending work. Any thread may set work; it runs on the loop's thread,
/// with no lock held.
public final class CommitCoalescer: Sendable {
    /// Core Animation's commit order (`CA::Transaction::observer_callback`).
    public static let defaultOrder = 2_000_000

    /// The loop the commits run on.
    public let loop: RunLoop
    /// The observer order of the commit.
    public let order: Int

    private let core: Committer

    /// A coalescer committing on `loop` in `modes` at `order`.
    ///
    /// - Precondition: `modes` is not empty.
    public init(loop: RunLoop, modes: [RunLoop.Mode] = [.common], order: Int = CommitCoalescer.defaultOrder) {
        require(!modes.isEmpty, "CommitCoalescer needs at least one mode")
        self.loop = loop
        self.order = order
        let core = Committer(loop: loop, modes: modes)
        self.core = core
        let detach = DetachSignal { [core] in core.detached() }
        let observer = RunLoopObserver(activities: [.beforeWaiting, .exit], order: order) { [core] _, _ in
            detach.keepAlive()
            core.commit()
        }
        core.observer.locked { $0.value = observer }
        loop.add(observer, forModes: modes)
    }

    /// Sets `work` as what `key` commits: it replaces work set earlier for `key` and not yet
    /// committed, and keeps that key's place in the commit order.
    ///
    /// - Complexity: O(1) amortized.
    public func setNeedsCommit(key: AnyHashable, _ work: @escaping @Sendable () -> Void) {
        core.set(key: Key(key), work)
    }

    /// How many keys have work waiting for the next commit.
    public var pendingCount: Int { core.state.locked { $0.pending.keys.count } }

    /// How many commits ran some work.
    public var commitCount: Int { core.state.locked { $0.commits } }

    /// Whether the coalescer is still on its loop.
    public var isValid: Bool { core.state.locked { $0.valid } }

    /// Takes the coalescer off its loop and drops the pending work. Any thread, including from
    /// inside a commit (the rest of that commit still runs: it was taken before).
    public func invalidate() { core.invalidate() }
}

extension CommitCoalescer {
    typealias Work = @Sendable () -> Void

    /// A work in a struct: a closure stored straight into an array is reabstracted through a
    /// heap-allocated thunk, one allocation per `setNeedsCommit`; a struct field is not.
    struct Item: Sendable {
        let work: Work
    }

    /// One iteration's batch: each key once, in the order first set, with its latest work.
    struct Batch: Sendable {
        var keys: [Key] = []
        var items: [Item] = []
        var index: [Key: Int] = [:]

        var isEmpty: Bool { keys.isEmpty }

        /// Emptied, keeping its storage for a later batch; what it held is released here.
        mutating func clear() {
            keys.removeAll(keepingCapacity: true)
            items.removeAll(keepingCapacity: true)
            index.removeAll(keepingCapacity: true)
        }
    }

    struct State: ~Copyable {
        var valid = true
        var pending = Batch()
        /// The storage of the last batch committed, emptied, for the next one: a steady stream of
        /// batches allocates nothing.
        var spare = Batch()
        /// The loop's pass generation of the last commit: work set on the loop's thread after it,
        /// in the same pass, would wait for an unrelated wakeup.
        var committedInGeneration: UInt64 = .max
        var commits = 0
        /// Whether the loop's thread is inside a commit now.
        var committing = false

        /// The pending batch, replaced by the spare one.
        mutating func take() -> Batch {
            defer { spare = Batch() }
            swap(&pending, &spare)
            return spare
        }
    }

    /// What the loop's observer holds: the pending commits and their runs (LoopAttachment.swift).
    final class Committer: Sendable {
        weak let loop: RunLoop?
        let running: LoopOnItsThread
        let state = Mutex(State())
        let observer = Mutex(Weak<RunLoopObserver>())
        /// Keeps the coalescer's modes from counting as empty while work waits (see `publish`).
        let pending: RunLoopPendingWork

        init(loop: RunLoop, modes: [RunLoop.Mode]) {
            self.loop = loop
            running = LoopOnItsThread(loop)
            pending = RunLoopPendingWork(loop: loop, modes: modes)
        }

        /// Says whether work waits for a commit, under the state's lock after each change: it
        /// keeps the coalescer's modes alive, as pending blocks do, except during a commit (a run
        /// nested in a work item cannot commit: the observer is firing).
        func publish(_ state: borrowing State) {
            pending.isPending = state.valid && !state.committing && !state.pending.isEmpty
        }

        func set(key: Key, _ work: @escaping Work) {
            let (wasEmpty, lastCommit, accepted) = state.locked { state -> (Bool, UInt64, Bool) in
                guard state.valid else { return (false, 0, false) }
                let wasEmpty = state.pending.isEmpty
                if let position = state.pending.index[key] {
                    state.pending.items[position] = Item(work: work)
                } else {
                    state.pending.index[key] = state.pending.keys.count
                    state.pending.keys.append(key)
                    state.pending.items.append(Item(work: work))
                }
                if wasEmpty { publish(state) }
                return (wasEmpty, state.committedInGeneration, true)
            }
            // Only the first work of a batch may need a wakeup (the loop is loaded only then).
            guard accepted, wasEmpty, let loop else { return }
            // Off the loop's thread the loop may be asleep. On it, the commit of this pass may be
            // over already (work set by a commit, or by a later beforeWaiting observer): wake it.
            if !loop.isCurrent || loop.phaseSnapshot.generation == lastCommit { loop.wakeUp() }
        }

        /// The observer: runs the work set so far, each key's latest once, in key order.
        func commit() {
            let generation = running.withLoop { $0.phaseSnapshot.generation }
            var batch = state.locked { state -> Batch? in
                state.committedInGeneration = generation
                guard state.valid, !state.pending.isEmpty else { return nil }
                state.commits += 1
                state.committing = true
                defer { publish(state) }
                return state.take()
            }
            guard batch != nil else { return }
            for item in batch!.items { item.work() }
            batch!.clear()  // releases the works and keys with no lock held
            let setMeanwhile = state.locked { state -> Bool in
                if state.valid && state.spare.keys.capacity < batch!.keys.capacity { swap(&state.spare, &batch!) }
                state.committing = false
                publish(state)
                return state.valid && !state.pending.isEmpty
            }
            // Work set during the commit by a run nested in a work item: that run's passes had new
            // generations, so `set` did not wake the loop, and its beforeWaiting skipped this
            // observer (it was firing). The next pass must commit it.
            if setMeanwhile { running.withLoop { $0.wakeUp() } }
        }

        func invalidate() {
            let dropped = state.locked { state -> (Batch, Batch) in
                state.valid = false
                defer {
                    state.pending = Batch()
                    state.spare = Batch()
                }
                return (state.pending, state.spare)
            }
            pending.invalidate()
            observer.locked { $0.value }?.invalidate()
            withExtendedLifetime(dropped) {}
        }

        func detached() { invalidate() }
    }
}
