import Synchronization

// NSThread's perform source, for `perform(inModes:waitUntilDone:_:)` and
// `perform(inModes:waitingAtMost:_:)`.
//
// On Darwin, `performSelector:onThread:withObject:waitUntilDone:modes:` queues the call on the
// target thread and signals a version-0 source of that thread's loop (its callout is
// `__NSThreadPerformPerform`, under `__CFRUNLOOP_IS_CALLING_OUT_TO_A_SOURCE0_PERFORM_FUNCTION__`).
// So the perform is a handled source: `runMode:beforeDate:` returns after it, which is what the
// keep-alive pattern `while (keepRunning) { [loop runMode:… beforeDate:distantFuture] }` relies
// on to notice a cleared flag. A block queued with `perform {}` (`CFRunLoopPerformBlock`) is not a
// source and does not end such a run.
//
// Here: one version-0 source per mode named in a perform (`.common` is one of them: its source is
// in every common mode), with the performs queued for that mode, first in, first out. A perform for
// several modes is queued in each of their lanes and runs once, in whichever of them the loop runs
// first. A lane's source is in its mode only while performs are queued there, so a loop that has
// only run its performs is as empty as before (a keep-alive thread still needs its own source or
// port, as on Darwin).

extension RunLoop {
    /// Queues `body` as a perform-source delivery in `modes` and wakes the loop. Throws
    /// ``PerformError/threadExited`` when the loop's thread has exited (nothing is queued; `body`
    /// is released at once, on this thread).
    func performAsSource(inModes modes: [Mode], _ body: @escaping @Sendable () -> Void) throws(PerformError) {
        preconditionNotForked("perform(inModes:waitUntilDone:_:)")
        guard !blocksClosed.load(ordering: .acquiring) else { throw .threadExited }
        let item = ThreadPerformItem(body)
        let lanes = attachments.object(ThreadPerformLanes.self) { ThreadPerformLanes() }
        var queued = false
        var seen: [Mode] = []
        for mode in modes where !seen.contains(mode) {
            seen.append(mode)
            if lanes.lane(for: mode, of: self).enqueue(item, on: self) { queued = true }
        }
        guard queued else { throw .threadExited }
        wakeUp()
    }
}

/// A queued perform, shared by the lanes of the modes it was queued for: whichever runs first
/// takes the body; the others find it gone.
final class ThreadPerformItem: Sendable {
    private let body: Mutex<(@Sendable () -> Void)?>

    init(_ body: @escaping @Sendable () -> Void) { self.body = Mutex(body) }

    /// The body, once; nil after the first call.
    func take() -> (@Sendable () -> Void)? {
        body.locked { body in
            defer { body = nil }
            return body
        }
    }
}

/// A loop's perform lanes, one per mode (kept as a loop attachment).
final class ThreadPerformLanes: Sendable {
    private let lanes = Mutex<[RunLoop.Mode: ThreadPerformLane]>([:])

    /// The lane of `mode` on `loop`, made on first use.
    func lane(for mode: RunLoop.Mode, of loop: RunLoop) -> ThreadPerformLane {
        lanes.locked { lanes in
            if let lane = lanes[mode] { return lane }
            let lane = ThreadPerformLane(mode: mode, loop: loop)
            lanes[mode] = lane
            return lane
        }
    }
}

/// One mode's performs and the version-0 source that delivers them.
///
/// The source is in the mode only while performs are queued (`scheduled`). The lane's lock is
/// never held while the loop's lock is taken or a perform runs; adding an already-added source and
/// removing an absent one do nothing, so the add/remove races below are settled by re-checking the
/// queue after a removal.
final class ThreadPerformLane: Sendable {
    private struct State {
        var pending: [ThreadPerformItem] = []
        /// Whether the source is (being) added to the mode.
        var scheduled = false
        /// The loop's thread has exited: nothing is queued any more.
        var closed = false
    }

    let mode: RunLoop.Mode
    private let state = Mutex(State())
    /// Set on the loop's thread while the lane removes its own source, so that the source's cancel
    /// callback (which the removal calls) tells that apart from the thread's exit.
    private let removingItself = Atomic<Bool>(false)
    /// Set once, right after `init` (the source's callbacks need the lane).
    private let sourceSlot = Mutex<RunLoopSource?>(nil)

    init(mode: RunLoop.Mode, loop: RunLoop) {
        self.mode = mode
        // The callbacks hold the lane weakly: the lane holds the source.
        let source = RunLoopSource(
            onCancel: { [weak self] _, _ in self?.cancelled() },
            perform: { [weak self, weak loop] in
                guard let self, let loop else { return }
                self.performQueued(on: loop)
            })
        source.label = "perform(inModes:waitUntilDone:)"
        sourceSlot.locked { $0 = source }
    }

    private var source: RunLoopSource { sourceSlot.locked { $0! } }

    /// The lane's source (tests look at whether it is in its mode).
    var sourceForTesting: RunLoopSource { source }

    /// Queues `item`; false if the loop's thread has exited (nothing queued).
    func enqueue(_ item: ThreadPerformItem, on loop: RunLoop) -> Bool {
        let (accepted, add) = state.locked { state -> (Bool, Bool) in
            guard !state.closed else { return (false, false) }
            state.pending.append(item)
            defer { state.scheduled = true }
            return (true, !state.scheduled)
        }
        guard accepted else { return false }
        let source = self.source
        if add {
            // A thread that exited after the caller's check: its teardown did not see the source,
            // so nothing would ever run or drop this lane's performs.
            guard !loop.isTornDown else {
                dropAll()
                return true
            }
            loop.add(source, forMode: mode)
            if loop.isTornDown { dropAll() }
        }
        source.signal()
        return true
    }

    /// The source's callout, on the loop's thread: runs the performs queued so far, in order
    /// (those queued meanwhile signal the source again and run in a later pass), then takes the
    /// source out of the mode if nothing is left.
    private func performQueued(on loop: RunLoop) {
        let batch = state.locked { state -> [ThreadPerformItem] in
            defer { state.pending.removeAll(keepingCapacity: true) }
            return state.pending
        }
        for item in batch {
            guard let body = item.take() else { continue }
            body()
        }
        let remove = state.locked { state -> Bool in
            guard state.pending.isEmpty, !state.closed else { return false }
            state.scheduled = false
            return true
        }
        guard remove else { return }
        let source = self.source
        removingItself.store(true, ordering: .relaxed)
        loop.remove(source, forMode: mode)
        removingItself.store(false, ordering: .relaxed)
        // A perform queued between the check and the removal saw `scheduled == false` and added
        // the source, possibly before the removal took it out again: put it back.
        let readd = state.locked { state -> Bool in
            guard !state.pending.isEmpty, !state.closed else { return false }
            state.scheduled = true
            return true
        }
        if readd {
            loop.add(source, forMode: mode)
            source.signal()
        }
    }

    /// The source left its mode other than by the lane's own removal: the loop's thread exited.
    /// The queued performs can never run; they are released here, outside the lock (a waiting
    /// caller learns of the drop from its block's token).
    private func cancelled() {
        guard !removingItself.load(ordering: .relaxed) else { return }
        dropAll()
    }

    /// Closes the lane and releases its queued performs.
    private func dropAll() {
        let dropped = state.locked { state -> [ThreadPerformItem] in
            state.closed = true
            defer { state.pending = [] }
            return state.pending
        }
        for item in dropped { _ = item.take() }
    }
}
