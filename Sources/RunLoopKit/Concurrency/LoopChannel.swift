import DequeModule
import Synchronization

// What RunLoopKit's async sequences share: a loop item (a timer, an observer, a descriptor
// source, a port) produces elements in its callouts on the loop's thread; one task consumes them
// with `for await`. The channel between them is bounded, with one of three policies, and it ends
// the item when the consumer goes away (its task cancelled, or its iterator and sequence gone).

/// What a channel does with an element that comes while `limit` wait unread.
enum LoopChannelPolicy: Sendable {
    /// Merge it into the last one (`merge`): timer ticks (a tick counts the ticks it replaces) and
    /// descriptor readiness (events are or-ed). The buffer never holds more than `limit`.
    case coalesce(limit: Int)
    /// Drop the oldest (counted): loop activities, which a slow consumer cannot slow down.
    case dropOldest(limit: Int)
    /// Keep it, and ask the producer to stop (`pause`) until the consumer has read below `limit`
    /// again (`resume`): port messages, whose senders then meet the port's own capacity. The
    /// buffer may exceed `limit` by what the producer hands over before it stops.
    case pause(limit: Int)

    var limit: Int {
        switch self {
        case .coalesce(let limit), .dropOldest(let limit), .pause(let limit): limit
        }
    }
}

/// A bounded single-consumer channel from a loop item's callouts to a task.
///
/// `@unchecked Sendable` is safe: the mutable state is behind `state`'s mutex; the hooks are
/// set once, before the channel is shared, and called outside the lock.
final class LoopChannel<Element: Sendable>: @unchecked Sendable {
    private struct State {
        var buffer = Deque<Element>()
        var waiter: UnsafeContinuation<Element?, Never>?
        var finished = false
        /// Whether the producer should be stopped: what push and next() decide.
        var paused = false
        /// What was last applied to the producer (`pauseProducer` or `resumeProducer` called).
        var appliedPaused = false
        /// A thread is bringing the producer in line with `paused` (see `settleProducer()`).
        var settling = false
        var dropped = 0
        var consumed = false
    }

    private enum PushOutcome { case none, resume(UnsafeContinuation<Element?, Never>), settle }
    private enum NextOutcome { case element(Element, settleProducer: Bool), end, wait, secondWaiter }

    let policy: LoopChannelPolicy
    private let merge: (@Sendable (inout Element, Element) -> Void)?
    private let state = Mutex(State())
    /// Stops the producer (the `.pause` policy); resumes it. Called outside the lock.
    var pauseProducer: (@Sendable () -> Void)?
    var resumeProducer: (@Sendable () -> Void)?
    /// Ends the item (the consumer went away). Called once, outside the lock.
    var endProducer: (@Sendable () -> Void)?
    private let ended = Atomic<Bool>(false)

    init(policy: LoopChannelPolicy, merge: (@Sendable (inout Element, Element) -> Void)? = nil) {
        fatalPrecondition(policy.limit >= 1, "a RunLoop async sequence's buffer limit must be at least 1 (got \(policy.limit))")
        self.policy = policy
        self.merge = merge
    }

    /// Elements dropped by the `.dropOldest` policy so far.
    var dropped: Int { state.locked { $0.dropped } }

    /// Hands `element` to the waiting consumer, or buffers it by the policy. The producer's side
    /// (a callout on the loop's thread).
    func push(_ element: Element) {
        let outcome = state.locked { state -> PushOutcome in
            guard !state.finished else { return .none }
            if let waiter = state.waiter {
                state.waiter = nil
                return .resume(waiter)
            }
            switch policy {
            case .coalesce(let limit):
                if state.buffer.count >= limit, let merge {
                    merge(&state.buffer[state.buffer.count - 1], element)
                } else {
                    state.buffer.append(element)
                }
                return .none
            case .dropOldest(let limit):
                if state.buffer.count >= limit {
                    state.buffer.removeFirst()
                    state.dropped += 1
                }
                state.buffer.append(element)
                return .none
            case .pause(let limit):
                state.buffer.append(element)
                if state.buffer.count >= limit && !state.paused {
                    state.paused = true
                    return .settle
                }
                return .none
            }
        }
        switch outcome {
        case .none: break
        case .resume(let waiter): waiter.resume(returning: element)
        case .settle: settleProducer()
        }
    }

    /// Applies `paused` to the producer, outside the lock: a pause decided here and a resume
    /// decided by the consumer meanwhile may reach this point in either order, and the producer
    /// must end in the state decided last (a late pause after the resume would stop the sequence
    /// for good). One thread applies at a time, and it re-reads `paused` after each call until
    /// what it applied is current; a thread that finds another applying leaves it to that one,
    /// which will see its decision, made under the same lock.
    private func settleProducer() {
        var first = true
        while true {
            let apply = state.locked { state -> Bool? in
                if first {
                    guard !state.settling else { return nil }
                    state.settling = true
                }
                guard state.paused != state.appliedPaused else {
                    state.settling = false
                    return nil
                }
                state.appliedPaused = state.paused
                return state.paused
            }
            first = false
            guard let pause = apply else { return }
            if pause { pauseProducer?() } else { resumeProducer?() }
        }
    }

    /// No more elements: the consumer reads what is buffered, then `nil`.
    func finish() {
        let waiter = state.locked { state -> UnsafeContinuation<Element?, Never>? in
            state.finished = true
            defer { state.waiter = nil }
            return state.buffer.isEmpty ? state.waiter : nil
        }
        waiter?.resume(returning: nil)
    }

    /// The consumer went away: the buffer is dropped, the producer ended, a waiting `next()`
    /// returns nil. Any thread; idempotent.
    func cancel() {
        let waiter = state.locked { state -> UnsafeContinuation<Element?, Never>? in
            state.finished = true
            state.buffer.removeAll()
            defer { state.waiter = nil }
            return state.waiter
        }
        waiter?.resume(returning: nil)
        endProducerOnce()
    }

    func endProducerOnce() {
        guard !ended.exchange(true, ordering: .acquiringAndReleasing) else { return }
        endProducer?()
    }

    /// Marks the channel's one consumer; a second one is a programming error.
    func claimConsumer() {
        let first = state.locked { state -> Bool in
            defer { state.consumed = true }
            return !state.consumed
        }
        fatalPrecondition(first, "a RunLoop async sequence has one consumer: makeAsyncIterator() was called twice")
    }

    /// The next element, waiting for one; nil once the channel is finished (and drained) or the
    /// task is cancelled.
    func next() async -> Element? {
        await withTaskCancellationHandler {
            await withUnsafeContinuation { (continuation: UnsafeContinuation<Element?, Never>) in
                let outcome = state.locked { state -> NextOutcome in
                    if let element = state.buffer.popFirst() {
                        let resume = state.paused && state.buffer.count < policy.limit
                        if resume { state.paused = false }
                        return .element(element, settleProducer: resume)
                    }
                    if state.finished { return .end }
                    // The one consumer waits at most once at a time; another waiter is a copy
                    // of its iterator in another task, and would take the first one's place.
                    guard state.waiter == nil else { return .secondWaiter }
                    state.waiter = continuation
                    return .wait
                }
                switch outcome {
                case .element(let element, let settle):
                    if settle { settleProducer() }
                    continuation.resume(returning: element)
                case .end:
                    continuation.resume(returning: nil)
                case .wait:
                    break
                case .secondWaiter:
                    fatalPrecondition(
                        false,
                        "a RunLoop async sequence has one consumer: next() was called by a task while another "
                            + "waited in it (the iterator copied into two tasks)")
                }
            }
        } onCancel: {
            cancel()
        }
    }
}

/// Keeps a channel's producer alive while its sequence or iterator exists: when the last of them
/// goes, the item is ended (a timer invalidated, an observer removed, a source or port closed).
final class LoopChannelLifetime<Element: Sendable>: Sendable {
    let channel: LoopChannel<Element>
    init(_ channel: LoopChannel<Element>) { self.channel = channel }
    deinit { channel.cancel() }
}

/// Finishes a channel when the loop lets go of its item's handler (the item invalidated, or the
/// loop's thread exited and tore it down): capture one in the handler closure. The consumer then
/// reads what is buffered and the sequence ends, instead of waiting on a loop that is gone.
final class LoopChannelProducer<Element: Sendable>: Sendable {
    let channel: LoopChannel<Element>
    init(_ channel: LoopChannel<Element>) { self.channel = channel }

    @inline(__always)
    func push(_ element: Element) { channel.push(element) }

    deinit { channel.finish() }
}
