import DequeModule
import Synchronization

// NSThread's perform source, for `perform(inModes:waitUntilDone:_:)` and
// `perform(inModes:waitingAtMost:_:)`.
//
// On Darwin, `performSelector:onThread:withObject:waitUntilDone:modes:` appends the call to one
// per-thread queue and signals a version-0 source of that thread's loop, one per mode, made and
// added to its mode the first time a perform names the mode and kept there (its callout is
// `__NSThreadPerformPerform`, under `__CFRUNLOOP_IS_CALLING_OUT_TO_A_SOURCE0_PERFORM_FUNCTION__`).
// So the perform is a handled source: `runMode:beforeDate:` returns after it, which is what the
// keep-alive pattern `while (keepRunning) { [loop runMode:… beforeDate:distantFuture] }` relies
// on to notice a cleared flag. A block queued with `perform {}` (`CFRunLoopPerformBlock`) is not a
// source and does not end such a run.
//
// Here the same: one queue per loop, first in, first out across modes; one source per mode named
// in a perform (`.common`'s is in every common mode), kept in its mode once added. A source's
// callout runs, in order, the performs that may run in the loop's current mode, one at a time and
// at most as many as were queued when it began (those queued meanwhile run in a later pass; a
// run nested in a perform sees the older ones still queued, in order). When the loop's thread
// exits, its sources leave their modes and the performs still queued are dropped (a waiting
// caller is released with `threadExited`).

extension RunLoop {
    /// Queues `body` as a perform-source delivery in `modes` and wakes the loop. Throws
    /// ``PerformError/threadExited`` when the loop's thread has exited (nothing is queued; `body`
    /// is released at once, on this thread).
    func performAsSource(inModes modes: [Mode], _ body: @escaping @Sendable () -> Void) throws(PerformError) {
        preconditionNotForked("perform(inModes:waitUntilDone:_:)")
        guard !blocksClosed.load(ordering: .acquiring) else { throw .threadExited }
        let queue = attachments.object(ThreadPerformQueue.self) { ThreadPerformQueue() }
        guard queue.enqueue(body, modes: modes, on: self) else { throw .threadExited }
        wakeUp()
    }
}

/// A loop's queued performs and the version-0 sources that deliver them (a loop attachment).
final class ThreadPerformQueue: Sendable {
    private struct Entry {
        var body: (@Sendable () -> Void)?
        let modes: [RunLoop.Mode]
    }

    private struct State {
        var entries = Deque<Entry>()
        /// One source per mode a perform named, kept once added.
        var sources: [RunLoop.Mode: RunLoopSource] = [:]
        /// The loop's thread has exited: nothing is queued any more.
        var closed = false
    }

    private let state = Mutex(State())

    /// Queues `body` for `modes`; false when the loop's thread has exited (nothing queued).
    func enqueue(_ body: @escaping @Sendable () -> Void, modes: [RunLoop.Mode], on loop: RunLoop) -> Bool {
        let unique = PerformModes.unique(modes)
        let queued = state.locked { state -> (fresh: [(RunLoop.Mode, RunLoopSource)], all: [RunLoopSource])? in
            guard !state.closed else { return nil }
            state.entries.append(Entry(body: body, modes: unique))
            var fresh: [(RunLoop.Mode, RunLoopSource)] = []
            var all: [RunLoopSource] = []
            for mode in unique {
                if let source = state.sources[mode] {
                    all.append(source)
                } else {
                    let source = makeSource(for: loop)
                    state.sources[mode] = source
                    fresh.append((mode, source))
                    all.append(source)
                }
            }
            return (fresh, all)
        }
        guard let queued else { return false }
        for (mode, source) in queued.fresh where !loop.addIfAlive(source, forMode: mode) {
            // The thread exited after the caller's check: its teardown did not see this source,
            // so nothing would ever run or drop what is queued.
            dropAll()
            return false
        }
        for source in queued.all { source.signal() }
        return true
    }

    private func makeSource(for loop: RunLoop) -> RunLoopSource {
        let source = RunLoopSource(
            onCancel: { [weak self] _, _ in self?.dropAll() },
            perform: { [weak self, weak loop] in
                guard let self, let loop else { return }
                self.performQueued(on: loop)
            })
        source.label = "perform(inModes:waitUntilDone:)"
        return source
    }

    /// A source's callout, on the loop's thread: runs, first in, first out, the performs that may
    /// run in the current mode, one at a time (the queue's lock is not held while one runs), at
    /// most as many as there were when it began.
    private func performQueued(on loop: RunLoop) {
        guard let here = PerformModes(runningIn: loop) else { return }
        let mode = here.mode
        let isCommon = here.isCommon
        func runsHere(_ entry: Entry) -> Bool { here.admit(entry.modes) }
        var budget = state.locked { state in state.entries.count { runsHere($0) } }
        while budget > 0 {
            budget -= 1
            let (body, more) = state.locked { state -> ((@Sendable () -> Void)?, [RunLoopSource]) in
                guard let index = state.entries.firstIndex(where: runsHere) else { return (nil, []) }
                let body = state.entries.remove(at: index).body
                // More wait here: the mode's sources are signalled again, so that a run nested in
                // this perform runs them (in order), and else the next pass does.
                guard state.entries.contains(where: runsHere) else { return (body, []) }
                return (body, [state.sources[mode], isCommon ? state.sources[.common] : nil].compactMap { $0 })
            }
            guard let body else { return }
            for source in more { source.signal() }
            body()
        }
    }

    /// The loop's thread exited (its sources left their modes), or a perform was queued too late:
    /// closes the queue and releases the performs still queued, outside the lock (a waiting
    /// caller learns of the drop from its block's token).
    private func dropAll() {
        let dropped = state.locked { state -> Deque<Entry> in
            state.closed = true
            defer { state.entries = [] }
            return state.entries
        }
        withExtendedLifetime(dropped) {}
    }

    /// The source delivering performs queued for `mode`, if one was made (tests).
    func sourceForTesting(_ mode: RunLoop.Mode) -> RunLoopSource? { state.locked { $0.sources[mode] } }
}
