import RunLoopKit
import Synchronization

/// Coalesced commits: Core Animation's `CATransaction` commit and Texture's transaction group.
///
/// Any number of ``setNeedsCommit(key:_:)`` calls in one iteration run each key's *latest* work
/// once, in the order the keys were first set, when the loop is about to sleep (`beforeWaiting`)
/// and when a run of the loop ends (`exit`, nested runs included), at the observer order given
/// (2,000,000 by default, Core Animation's). Work set during a commit (by the commit itself, or
/// by another thread meanwhile) runs in the next iteration, and the loop is woken for it, so
/// nothing is stranded while the loop sleeps. Several coalescers at different orders compose as
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

    private let core: Core

    /// A coalescer committing on `loop` in `modes` at `order`.
    ///
    /// - Precondition: `modes` is not empty.
    public init(loop: RunLoop, modes: [RunLoop.Mode] = [.common], order: Int = CommitCoalescer.defaultOrder) {
        require(!modes.isEmpty, "CommitCoalescer needs at least one mode")
        self.loop = loop
        self.order = order
        let core = Core(loop: loop)
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
    public var pendingCount: Int { core.state.locked { $0.keys.count } }

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

    struct State: ~Copyable {
        var valid = true
        var keys: [Key] = []
        var works: [Work] = []
        var index: [Key: Int] = [:]
        /// The loop's pass generation of the last commit: work set on the loop's thread after it,
        /// in the same pass, would wait for an unrelated wakeup.
        var committedInGeneration: UInt64 = .max
        var commits = 0

        mutating func take() -> (keys: [Key], works: [Work]) {
            defer {
                keys = []
                works = []
                index = [:]
            }
            return (keys, works)
        }
    }

    final class Core: Sendable {
        weak let loop: RunLoop?
        let state = Mutex(State())
        let observer = Mutex(Weak<RunLoopObserver>())

        init(loop: RunLoop) { self.loop = loop }

        func set(key: Key, _ work: @escaping Work) {
            guard let loop else { return }
            let (wasEmpty, lastCommit, accepted) = state.locked { state -> (Bool, UInt64, Bool) in
                guard state.valid else { return (false, 0, false) }
                let wasEmpty = state.keys.isEmpty
                if let position = state.index[key] {
                    state.works[position] = work
                } else {
                    state.index[key] = state.keys.count
                    state.keys.append(key)
                    state.works.append(work)
                }
                return (wasEmpty, state.committedInGeneration, true)
            }
            guard accepted, wasEmpty else { return }
            // Off the loop's thread the loop may be asleep. On it, the commit of this pass may be
            // over already (work set by a commit, or by a later beforeWaiting observer): wake it.
            if !loop.isCurrent || loop.phaseSnapshot.generation == lastCommit { loop.wakeUp() }
        }

        /// The observer: runs the work set so far, each key's latest once, in key order.
        func commit() {
            guard let loop else { return }
            let generation = loop.phaseSnapshot.generation
            let batch = state.locked { state -> (keys: [Key], works: [Work]) in
                state.committedInGeneration = generation
                guard state.valid, !state.keys.isEmpty else { return ([], []) }
                state.commits += 1
                return state.take()
            }
            for work in batch.works { work() }
        }

        func invalidate() {
            let dropped = state.locked { state -> [Work] in
                state.valid = false
                return state.take().works
            }
            observer.locked { $0.value }?.invalidate()
            withExtendedLifetime(dropped) {}
        }

        func detached() { invalidate() }
    }
}
