import Synchronization

// NSRunLoop's ordered performers: `performSelector:target:argument:order:modes:`,
// `cancelPerformSelectorsWithTarget:` (Apple's Foundation and GNUstep).
//
// Apple's documentation: the message is sent "at the start of the next run loop iteration", by a
// timer set up in the given modes; "messages with a lower order value are sent before messages
// with a higher order value". Here: one queue of performers per loop, and one zero-delay one-shot
// timer per mode a performer names (``RunLoop/Mode/common``'s is in every common mode). When a
// mode's timer fires, the performers that may run in the loop's current mode run, lowest order
// first (the earliest added first among equal orders), one at a time, at most as many as were
// queued when it fired: those added meanwhile run in a later iteration.

extension RunLoop {
    /// Runs `block` on the loop's thread at the start of the loop's next iteration in one of
    /// `modes`, before the performers of higher `order`: NSRunLoop's
    /// `performSelector:target:argument:order:modes:` for closures.
    ///
    /// ```swift
    /// // Layout before display, whatever order they were asked in:
    /// loop.perform(order: 2, inModes: [.common]) { print("display") }
    /// loop.perform(order: 1, inModes: [.common]) { print("layout") }
    /// ```
    ///
    /// The performer is delivered by a timer due at the loop's now (on the loop's own clock, a
    /// virtual one included, from whatever thread this is called) in each of `modes`, so it runs
    /// in the timers phase of the next pass in one of them (and waits while the loop runs in other
    /// modes); it runs once, in the first of its modes the loop runs. Among the performers due
    /// then, lower orders run first, and equal orders in the order they were added. `target`
    /// (held strongly until the performer runs or is cancelled, as NSRunLoop retains its target)
    /// lets ``cancelOrderedPerforms(withTarget:)`` find it. Safe from any thread. An empty
    /// `modes` does nothing.
    public func perform(
        order: Int, inModes modes: [Mode] = RunLoop.defaultModeOnly, target: (AnyObject & Sendable)? = nil,
        _ block: @escaping @Sendable () -> Void
    ) {
        guard !modes.isEmpty else { return }
        attachments.object(OrderedPerformers.self) { OrderedPerformers() }
            .add(order: order, modes: modes, target: target, block, on: self)
    }

    /// Cancels the pending ordered performers made for `target` (compared by identity): none of
    /// them will run. NSRunLoop's `cancelPerformSelectorsWithTarget:`. Safe from any thread.
    ///
    /// - Returns: How many performers were cancelled.
    @discardableResult
    public func cancelOrderedPerforms(withTarget target: AnyObject) -> Int {
        attachments.existing(OrderedPerformers.self)?.cancel(target: target) ?? 0
    }
}

/// A loop's ordered performers (a loop attachment).
final class OrderedPerformers: Sendable {
    private struct Entry {
        let sequence: UInt64
        let modes: [RunLoop.Mode]
        let target: (AnyObject & Sendable)?
        let body: @Sendable () -> Void
    }

    private struct State {
        /// The pending performers by their sequence number (the order they were added in).
        var entries: [UInt64: Entry] = [:]
        /// Each order's sequence numbers, in the order added. Those of performers that ran or
        /// were cancelled stay until the next firing drops them.
        var queues: [Int: [UInt64]] = [:]
        var nextSequence: UInt64 = 0
        /// The pending zero-delay timer of each mode a performer names.
        var timers: [RunLoop.Mode: RunLoopTimer] = [:]
    }

    private let state = Mutex(State())

    func add(
        order: Int, modes: [RunLoop.Mode], target: (AnyObject & Sendable)?, _ body: @escaping @Sendable () -> Void,
        on loop: RunLoop
    ) {
        let unique = PerformModes.unique(modes)
        // Due at the loop's now, read on its own clock: from another thread, the caller's clock is
        // not the one of a loop on virtual time (whose now moves only when its test says so).
        let dueNs = LoopClock.nanoseconds(loop.now)
        let fresh = state.locked { state -> [(RunLoop.Mode, RunLoopTimer)] in
            let sequence = state.nextSequence
            state.entries[sequence] = Entry(sequence: sequence, modes: unique, target: target, body: body)
            state.queues[order, default: []].append(sequence)
            state.nextSequence += 1
            var fresh: [(RunLoop.Mode, RunLoopTimer)] = []
            for mode in unique where state.timers[mode] == nil {
                let timer = RunLoopTimer(fireNs: dueNs, intervalNs: 0, toleranceNs: 0) { [weak self, weak loop] _ in
                    guard let self, let loop else { return }
                    self.fire(mode, on: loop)
                }
                timer.label = "perform(order:inModes:)"
                state.timers[mode] = timer
                fresh.append((mode, timer))
            }
            return fresh
        }
        for (mode, timer) in fresh { loop.add(timer, forMode: mode) }
        // Added from another thread, the timers are armed; the loop sees them when it next looks
        // at its timers (a sleeping loop is re-armed for the earlier deadline).
    }

    /// The timer of `key` fired, on the loop's thread.
    private func fire(_ key: RunLoop.Mode, on loop: RunLoop) {
        guard let here = PerformModes(runningIn: loop) else { return }
        // The fired one-shot timer is spent: a performer added from here on makes a new one, and
        // runs in a later firing. This firing's batch is the performers queued now that may run
        // in this mode: lower orders first, then the order added. Only the distinct orders are
        // sorted; each order's queue is already in the order added.
        let batch = state.locked { state -> [UInt64] in
            state.timers[key] = nil
            var batch: [UInt64] = []
            for order in state.queues.keys.sorted() {
                var live: [UInt64] = []
                for sequence in state.queues[order] ?? [] {
                    guard let entry = state.entries[sequence] else { continue }
                    live.append(sequence)
                    if here.admit(entry.modes) { batch.append(sequence) }
                }
                state.queues[order] = live.isEmpty ? nil : live
            }
            return batch
        }
        for sequence in batch {
            // Taken out just before it runs: one cancelled meanwhile, or run by a firing nested in
            // an earlier performer (which ran the loop), is gone.
            guard let next = state.locked({ $0.entries.removeValue(forKey: sequence) }) else { continue }
            next.body()
        }
    }

    func cancel(target: AnyObject) -> Int {
        let removed = state.locked { state -> [Entry] in
            let removed = state.entries.values.filter { $0.target === target }
            for entry in removed { state.entries[entry.sequence] = nil }
            return removed
        }
        // Released here, with no lock held: a target's deinit may run any code.
        return removed.count
    }
}
