import DequeModule
import HeapModule
import RunLoopKit
import Synchronization

/// What an idle task says when it returns.
public enum IdleTaskResult: Sendable, Hashable {
    /// The task is finished.
    case done
    /// The task has more to do: it is queued again at the tail (after every task queued before
    /// it), and runs in a later idle period.
    case more
}

/// The time an idle task may take, and whether it should stop now.
///
/// Poll ``shouldYield`` between units of work: it turns true when the idle period's budget is
/// spent, when a timer of the loop's mode is due, or as soon as the loop has new input (a wakeup,
/// a block or message from another thread, a ready descriptor: `RunLoop.hasPendingInput`),
/// so that idle work never delays real work by more than one unit. requestIdleCallback and
/// React's scheduler can only look at the clock.
public struct IdleDeadline: Sendable {
    private let end: ContinuousClock.Instant
    private let loop: RunLoop?
    /// True when the task waited past its timeout and runs as an ordinary block (see
    /// ``IdleTaskQueue/enqueue(key:timeout:_:)``): it then runs to completion
    /// (``shouldYield`` stays false), as React runs expired tasks.
    public let didTimeout: Bool

    init(end: ContinuousClock.Instant, loop: RunLoop?, didTimeout: Bool) {
        self.end = end
        self.loop = loop
        self.didTimeout = didTimeout
    }

    /// What is left of the idle period: zero once it is spent.
    ///
    /// On virtual time (RunLoopTesting), a callout's work takes no time unless it says so
    /// (`VirtualTimeLoop.elapse(_:)`): polled a million times at one instant, the deadline reports
    /// itself spent and the test's `advance` throws `VirtualTimeError.clockStalled`, instead of a
    /// `while deadline.timeRemaining > .zero` loop spinning for ever.
    public var timeRemaining: Duration {
        let left = RunLoop.now.duration(to: end)
        if left > .zero, loop?.deadlineStalledOnVirtualTime() == true { return .zero }
        return left > .zero ? left : .zero
    }

    /// Whether the task should return now (with ``IdleTaskResult/more`` if it has more to do).
    ///
    /// On virtual time, as ``timeRemaining``: a million polls at one instant end the period and
    /// make the test's `advance` throw `VirtualTimeError.clockStalled`.
    public var shouldYield: Bool {
        if didTimeout { return false }
        return RunLoop.now >= end || (loop?.hasPendingInput ?? false) || (loop?.deadlineStalledOnVirtualTime() ?? false)
    }
}

/// Work that runs only when its loop would otherwise sleep: the seeds' "load one image per
/// iteration at `beforeWaiting`" (DWURunLoopWorkDistribution), done without a keep-alive timer.
///
/// The rules:
/// - **When.** An observer at `beforeWaiting` (order ``defaultOrder``: after Core Animation's
///   commit at 2,000,000, before the release pool's pop at `Int.max`) starts an *idle period*, in
///   the queue's modes only, when the loop has no input waiting (an iteration that has some is not
///   idle: it runs none). The period runs the tasks queued before it began, oldest first: at least
///   one, then more while ``IdleDeadline/shouldYield`` is false and what is left of the budget
///   holds another task of the queue's average length (a moving average of the tasks it ran).
///   Its budget ends at `now + budget` or the mode's next timer, whichever is first, so a timer
///   waits at most for the one task in progress.
/// - **Staying awake.** While tasks remain, the period ends with `wakeUp()`, so the loop takes
///   another pass instead of sleeping, unless the mode's next timer is due sooner than an average
///   task would take: then the loop sleeps until that timer, and the next period follows it. When
///   the queue is empty nothing keeps the loop awake: no keep-alive timer (DWU wakes its loop 10
///   times a second forever), no spin (a GLib idle that returns CONTINUE takes a core).
/// - **Runs stay alive.** Queued tasks keep the queue's modes from counting as empty
///   (`RunLoopPendingWork`), as CoreFoundation's pending blocks do: a run in a mode that holds
///   nothing else runs them instead of returning `.finished` at once, and ends `.finished` once
///   the last one ran. An empty queue keeps nothing alive, and neither do tasks queued during an
///   idle period for a run nested in one of its tasks (that run cannot start another period).
/// - **Keys.** A task with a key replaces the queued task with that key, in O(1) (Texture's
///   ASRunLoopQueue scans the queue).
/// - **Capacity.** Past `capacity` tasks the oldest is dropped and counted in ``droppedCount``.
/// - **Timeouts.** A task given a timeout that has not started within it runs as an ordinary block
///   of the loop (`RunLoop.perform(inModes:_:)`, in the queue's modes), with
///   ``IdleDeadline/didTimeout`` true: a loop that is never idle cannot starve it. A timed-out task
///   that returns ``IdleTaskResult/more`` is queued again with a fresh timeout.
///
/// The queue stays on its loop until ``invalidate()`` or the loop's thread exits; either drops
/// (and releases) every task. Any thread may enqueue and cancel; tasks run on the loop's thread,
/// with no lock held.
public final class IdleTaskQueue: Sendable {
    /// The observer order the idle period runs at, as DWURunLoopWorkDistribution's
    /// (`Int.max - 999`): after every commit, before the release pool drains.
    public static let defaultOrder = Int.max - 999

    /// The loop the tasks run on.
    public let loop: RunLoop
    /// The modes whose idle periods run tasks.
    public let modes: [RunLoop.Mode]
    /// The most an idle period lasts.
    public let budget: Duration
    /// The most tasks queued; past it the oldest is dropped.
    public let capacity: Int

    private let core: Runner

    /// A queue of idle tasks for `loop`'s `modes`.
    ///
    /// - Precondition: `budget` and `capacity` are positive; `modes` is not empty.
    public init(
        loop: RunLoop, modes: [RunLoop.Mode] = [.default], budget: Duration = .milliseconds(4),
        capacity: Int = 1_000, order: Int = IdleTaskQueue.defaultOrder
    ) {
        requirePositive(budget, "IdleTaskQueue budget")
        requirePositive(capacity, "IdleTaskQueue capacity")
        require(!modes.isEmpty, "IdleTaskQueue needs at least one mode")
        self.loop = loop
        self.modes = modes
        self.budget = budget
        self.capacity = capacity
        let core = Runner(loop: loop, modes: modes, budget: budget, capacity: capacity)
        self.core = core
        // Only the loop holds the observer: when it lets go (invalidate, thread exit), the
        // observer's closure and its DetachSignal go, and the signal drops the queued tasks.
        let detach = DetachSignal { [core] in core.detached() }
        let observer = RunLoopObserver(activities: .beforeWaiting, order: order) { [core] _, _ in
            detach.keepAlive()
            core.runIdlePeriod()
        }
        core.observer.locked { $0.value = observer }
        loop.add(observer, forModes: modes)
    }

    /// Queues `task` to run in a later idle period of the loop.
    ///
    /// - Parameters:
    ///   - key: when given, replaces the queued task with this key (which then never runs).
    ///   - timeout: when given, the task runs as an ordinary block if no idle period has started
    ///     it within this time (see the type's rules).
    ///   - task: one unit of work, run on the loop's thread; it returns ``IdleTaskResult/more`` to
    ///     be queued again.
    /// - Returns: false when the queue was invalidated or its loop's thread exited (the task is
    ///   dropped).
    /// - Complexity: O(1) amortized (O(log n) with a timeout).
    @discardableResult
    public func enqueue(
        key: AnyHashable? = nil, timeout: Duration? = nil,
        _ task: @escaping @Sendable (IdleDeadline) -> IdleTaskResult
    ) -> Bool {
        if let timeout { requirePositive(timeout, "IdleTaskQueue task timeout") }
        return core.enqueue(key: key.map(Key.init), timeout: timeout, task)
    }

    /// Removes the queued task with `key`, if any.
    public func cancel(key: AnyHashable) { core.cancel(key: Key(key)) }

    /// How many tasks are queued.
    public var count: Int { core.state.locked { $0.live.count } }

    /// How many tasks were dropped because the queue was full.
    public var droppedCount: Int { core.state.locked { $0.dropped } }

    /// How many tasks ran as ordinary blocks after their timeout.
    public var timedOutCount: Int { core.state.locked { $0.timedOut } }

    /// Whether the queue is still on its loop (false after ``invalidate()`` or its thread's exit).
    public var isValid: Bool { core.state.locked { $0.valid } }

    /// Takes the queue off its loop and drops every queued task. Any thread, including from
    /// inside a task (the period stops after it).
    public func invalidate() { core.invalidate() }
}

extension IdleTaskQueue {
    /// A queued task: what `enqueue` takes.
    typealias Work = @Sendable (IdleDeadline) -> IdleTaskResult

    struct Entry: Sendable {
        let key: Key?
        let timeout: Duration?
        let task: Work
    }

    struct State: ~Copyable {
        var valid = true
        /// Live tasks by sequence number; `order` may hold numbers no longer here (replaced,
        /// cancelled, timed out), skipped when met.
        var live: [UInt64: Entry] = [:]
        var order = Deque<UInt64>()
        var byKey: [Key: UInt64] = [:]
        var next: UInt64 = 1
        var dropped = 0
        var timedOut = 0
        /// Deadlines of tasks with a timeout (lazily pruned like `order`).
        var deadlines = Heap<Deadline>()
        var timerArmedFor: ContinuousClock.Instant?
        /// Whether the loop's thread is inside this queue's idle period now.
        var inPeriod = false
        /// A moving average (weight 1/8) of how long the tasks take, zero before the first.
        var averageTask: Duration = .zero

        /// Forgets task `sequence` (its number stays in `order` until met).
        mutating func remove(_ sequence: UInt64) -> Entry? {
            guard let entry = live.removeValue(forKey: sequence) else { return nil }
            if let key = entry.key, byKey[key] == sequence { byKey[key] = nil }
            return entry
        }

        /// The oldest live task queued before `limit`, taken out.
        mutating func popOldest(before limit: UInt64) -> Entry? {
            while let first = order.first {
                if live[first] == nil {
                    order.removeFirst()
                    continue
                }
                guard first < limit else { return nil }
                order.removeFirst()
                return remove(first)
            }
            return nil
        }

        /// Numbers left behind in `order` by replaced or cancelled tasks, dropped when they
        /// outnumber the live ones (keeps `order` O(live)).
        mutating func compactIfNeeded() {
            guard order.count > 2 * live.count + 64 else { return }
            order = Deque(order.filter { live[$0] != nil })
        }
    }

    struct Deadline: Comparable {
        let at: ContinuousClock.Instant
        let sequence: UInt64
        static func < (a: Deadline, b: Deadline) -> Bool { (a.at, a.sequence) < (b.at, b.sequence) }
    }

    /// What the loop's observer and timer hold: the queued tasks and their budget.
    final class Runner: Sendable {
        weak let loop: RunLoop?
        let modes: [RunLoop.Mode]
        let budget: Duration
        let capacity: Int
        let state = Mutex(State())
        let observer = Mutex(Weak<RunLoopObserver>())
        let timer = Mutex<RunLoopTimer?>(nil)
        /// Keeps the queue's modes from counting as empty while tasks are queued (see `publish`).
        let pending: RunLoopPendingWork

        init(loop: RunLoop, modes: [RunLoop.Mode], budget: Duration, capacity: Int) {
            self.loop = loop
            self.modes = modes
            self.budget = budget
            self.capacity = capacity
            pending = RunLoopPendingWork(loop: loop, modes: modes)
        }

        /// Says whether tasks wait for an idle period, under the state's lock after each change:
        /// they keep the queue's modes alive, as pending blocks do, except during a period (a run
        /// nested in a task cannot start another period: the observer is firing).
        func publish(_ state: borrowing State) {
            pending.isPending = state.valid && !state.inPeriod && !state.live.isEmpty
        }

        func enqueue(key: Key?, timeout: Duration?, _ task: @escaping Work) -> Bool {
            guard let loop, !loop.hasThreadExited else { return false }
            var released: [Entry] = []
            let (accepted, wake, rearm) = state.locked { state -> (Bool, Bool, Bool) in
                guard state.valid else { return (false, false, false) }
                let sequence = state.next
                state.next += 1
                if let key, let older = state.byKey[key], let replaced = state.remove(older) {
                    released.append(replaced)
                }
                state.live[sequence] = Entry(key: key, timeout: timeout, task: task)
                state.order.append(sequence)
                if let key { state.byKey[key] = sequence }
                while state.live.count > capacity, let oldest = state.popOldest(before: UInt64.max) {
                    released.append(oldest)
                    state.dropped += 1
                }
                state.compactIfNeeded()
                var rearm = false
                if let timeout {
                    let at = deadline(after: timeout)
                    state.deadlines.insert(Deadline(at: at, sequence: sequence))
                    rearm = state.timerArmedFor.map { at < $0 } ?? true
                }
                publish(state)
                // Inside its own period the loop stays awake if tasks remain; anywhere else the
                // loop may be asleep, or past this observer in its pass.
                return (true, !(state.inPeriod && loop.isCurrent), rearm)
            }
            released.removeAll()  // the dropped tasks are released here, with no lock held
            if rearm { armTimeoutTimer() }
            if wake { loop.wakeUp() }
            return accepted
        }

        func cancel(key: Key) {
            let removed = state.locked { state -> Entry? in
                guard let sequence = state.byKey[key] else { return nil }
                defer { publish(state) }
                return state.remove(sequence)
            }
            withExtendedLifetime(removed) {}
        }

        /// One idle period (the `beforeWaiting` observer).
        func runIdlePeriod() {
            // An empty queue costs one uncontended lock per pass: no clock read, no system call
            // (hasPendingInput polls epoll), no reference count touched.
            guard state.locked({ $0.valid && !$0.live.isEmpty }) else { return }
            guard let loop else { return }
            if loop.hasPendingInput { return }  // not idle: the input wakes the loop anyway
            var end = deadline(after: budget)
            let timer = loop.currentMode.flatMap { loop.nextTimerFireDate(forMode: $0) }
            if let timer, timer < end { end = timer }
            let (limit, estimate) = state.locked { state -> (UInt64, Duration) in
                state.inPeriod = true
                publish(state)
                return (state.next, state.averageTask)
            }
            var average = estimate
            var ran = false
            while true {
                // After the first task, another starts only if an average one fits.
                if ran && RunLoop.now.advanced(by: average) > end { break }
                guard let entry = state.locked({ state in state.valid ? state.popOldest(before: limit) : nil }) else { break }
                let deadline = IdleDeadline(end: end, loop: loop, didTimeout: false)
                let started = RunLoop.now
                let result = entry.task(deadline)
                let took = started.duration(to: RunLoop.now)
                average = average == .zero ? took : (average * 7 + took) / 8
                ran = true
                if result == .more { requeue(entry) }
                if deadline.shouldYield { break }
            }
            let remaining = state.locked { state -> Bool in
                state.inPeriod = false
                state.averageTask = average
                publish(state)
                return state.valid && !state.live.isEmpty
            }
            guard remaining else { return }
            // A timer due before another task could finish wakes the loop anyway: sleep until it
            // (asked again: a task may have moved or removed the timer).
            let next = loop.currentMode.flatMap { loop.nextTimerFireDate(forMode: $0) }
            if let next, RunLoop.now.advanced(by: average) > next { return }
            loop.wakeUp()
        }

        /// Queues a task that asked for more again, at the tail, unless a newer task took its key
        /// meanwhile (the newer one wins) or the queue was invalidated.
        private func requeue(_ entry: Entry) {
            let rearm = state.locked { state -> Bool in
                guard state.valid else { return false }
                if let key = entry.key, state.byKey[key] != nil { return false }
                let sequence = state.next
                state.next += 1
                state.live[sequence] = entry
                state.order.append(sequence)
                if let key = entry.key { state.byKey[key] = sequence }
                publish(state)
                guard let timeout = entry.timeout else { return false }
                let at = deadline(after: timeout)
                state.deadlines.insert(Deadline(at: at, sequence: sequence))
                return state.timerArmedFor.map { at < $0 } ?? true
            }
            if rearm { armTimeoutTimer() }
        }

        /// Puts the timeout timer on the loop for the earliest deadline, or takes it off when no
        /// task has one (a timer would keep `run(mode:)` from returning `.finished`).
        func armTimeoutTimer() {
            guard let loop else { return }
            let next = state.locked { state -> ContinuousClock.Instant? in
                while let first = state.deadlines.min, state.live[first.sequence] == nil || !state.valid {
                    _ = state.deadlines.removeMin()
                }
                state.timerArmedFor = state.valid ? state.deadlines.min?.at : nil
                return state.timerArmedFor
            }
            let existing = timer.locked { $0 }
            guard let next else {
                existing?.invalidate()
                timer.locked { $0 = nil }
                return
            }
            if let existing, existing.isValid {
                existing.fireDate = next
                return
            }
            let fresh = RunLoopTimer(fireAt: next) { [weak self] _ in self?.runTimedOutTasks() }
            timer.locked { $0 = fresh }
            for mode in modes { loop.add(fresh, forMode: mode) }
        }

        /// The timeout timer fired: every task past its deadline runs as an ordinary block.
        private func runTimedOutTasks() {
            guard let loop else { return }
            timer.locked { $0 = nil }  // one-shot: it is off the loop now
            let now = RunLoop.now
            let expired = state.locked { state -> [Entry] in
                var expired: [Entry] = []
                while let first = state.deadlines.min, first.at <= now {
                    _ = state.deadlines.removeMin()
                    if let entry = state.remove(first.sequence) {
                        expired.append(entry)
                        state.timedOut += 1
                    }
                }
                state.timerArmedFor = nil
                publish(state)
                return expired
            }
            for entry in expired {
                loop.perform(inModes: modes) { [weak self] in
                    let result = entry.task(IdleDeadline(end: RunLoop.now, loop: nil, didTimeout: true))
                    if result == .more { self?.requeue(entry) }
                }
            }
            armTimeoutTimer()
        }

        func invalidate() {
            let dropped = state.locked { state -> [Entry] in
                state.valid = false
                let all = Array(state.live.values)
                state.live.removeAll()
                state.order.removeAll()
                state.byKey.removeAll()
                state.deadlines = Heap()
                return all
            }
            pending.invalidate()
            observer.locked { $0.value }?.invalidate()
            let pending = timer.locked { timer -> RunLoopTimer? in
                defer { timer = nil }
                return timer
            }
            pending?.invalidate()
            withExtendedLifetime(dropped) {}
        }

        /// The loop let go of the observer: invalidated, or its thread exited.
        func detached() { invalidate() }
    }
}
