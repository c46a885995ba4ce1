import Dispatch
import Synchronization

// The synchronous rendezvous behind `RunLoop.perform(inModes:waitUntilDone:_:)` and
// `PermanentThread.executeAndWait(_:)`: a thread queues a block on a loop and blocks until the
// block has run, or until the loop has dropped it (its thread exited), so that it never waits
// forever.
//
// A dropped block is noticed the way `LoopTaskExecutor` (Concurrency/RunLoop+AsyncPerform.swift)
// notices it: the block captures a token whose deinit reports the drop unless the block ran
// first. The async path keeps its own `JobHandoff`, which has to reroute a job rather than wake a
// thread; the two share the reasoning, not code.

/// A value handed once from one thread to any number of threads blocked waiting for it.
///
/// The first ``set(_:)`` wins; later ones do nothing. The value is written and read under a lock
/// (announced to ThreadSanitizer, see `Mutex.locked`), and a semaphore wakes the waiters.
package final class OneShot<Value: Sendable>: Sendable {
    private let slot = Mutex<Value?>(nil)
    private let ready = DispatchSemaphore(value: 0)

    /// An empty slot.
    package init() {}

    /// Stores `value` and wakes the waiters, unless a value was set already. Returns whether this
    /// call set it.
    @discardableResult
    package func set(_ value: Value) -> Bool {
        let first = slot.locked { slot -> Bool in
            guard slot == nil else { return false }
            slot = value
            return true
        }
        if first { ready.signal() }
        return first
    }

    /// Blocks the calling thread until a value is set, and returns it.
    package func wait() -> Value {
        ready.wait()
        ready.signal()  // passes the wakeup on to the next waiter
        return slot.locked { $0! }
    }

    /// Blocks the calling thread until a value is set or `timeout` passes; returns the value, or
    /// nil on timeout.
    package func wait(timeout: Duration) -> Value? {
        let nanoseconds = max(0, min(timeout.saturatedNanoseconds, Int64(Int.max)))
        guard ready.wait(timeout: .now() + .nanoseconds(Int(nanoseconds))) == .success else { return nil }
        ready.signal()
        return slot.locked { $0! }
    }
}

/// What became of a block a thread waits for.
package enum BlockOutcome<Value: Sendable>: Sendable {
    /// The block ran and produced this value.
    case ran(Value)
    /// The loop dropped the block without running it (its thread exited).
    case dropped
}

/// The outcome of one block queued on a loop, for a thread that waits for it.
///
/// <!-- snippet: skip (a package type: only RunLoopKit's own modules can use it) -->
/// ```swift
/// let completion = BlockCompletion<Int>()
/// loop.perform(inModes: modes, completion.block { 42 })
/// completion.noticeDrop(by: loop)
/// switch completion.wait() { case .ran(let value): ...; case .dropped: ... }
/// ```
package final class BlockCompletion<Value: Sendable>: Sendable {
    private let outcome = OneShot<BlockOutcome<Value>>()

    /// A completion not yet delivered.
    package init() {}

    /// Wraps `body` into the block to queue: running it delivers the body's value; destroying it
    /// without running it (the loop drops blocks once its thread has exited) delivers
    /// ``BlockOutcome/dropped``.
    package func block(_ body: @escaping @Sendable () -> Value) -> @Sendable () -> Void {
        let token = DropToken(self)
        return { token.completion.outcome.set(.ran(body())) }
    }

    /// Call after queueing the block on `loop`: if the loop's thread has exited, the block can never
    /// run, even if it is still held in the loop's queue (a push that raced with the thread's
    /// teardown), so the waiter is released.
    ///
    /// That push and the teardown's emptying of the queue are ordered by the queue's lock: either
    /// the teardown dropped the block (and its token reported it), or the push came later, after
    /// the teardown set `blocksClosed`, which this load then sees. A block that ran did so before
    /// the teardown, on the loop's thread, and its value was set first.
    package func noticeDrop(by loop: RunLoop) {
        if loop.blocksClosed.load(ordering: .acquiring) { outcome.set(.dropped) }
    }

    /// Blocks the calling thread until the block has run or has been dropped.
    package func wait() -> BlockOutcome<Value> { outcome.wait() }

    /// Blocks until the block ran or was dropped, or `timeout` passed (nil).
    package func wait(timeout: Duration) -> BlockOutcome<Value>? { outcome.wait(timeout: timeout) }

    /// Captured by the block and destroyed with it.
    private final class DropToken: Sendable {
        let completion: BlockCompletion<Value>
        init(_ completion: BlockCompletion<Value>) { self.completion = completion }
        deinit { completion.outcome.set(.dropped) }
    }
}
