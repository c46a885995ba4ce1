import DequeModule
import Synchronization

/// An in-process port: any thread sends typed messages, and the loop the port is scheduled on
/// wakes and hands them to the handler on its thread, first in, first out.
///
/// The stand-in for Mach ports (cross-thread messages to a run loop on iOS): a version-1 source that
/// another thread makes ready. Messages are handled after the loop wakes (after
/// ``RunLoop/Activity/afterWaiting`` and the due timers), in ascending ``order`` among the mode's
/// version-1 sources, only while the loop runs in one of the port's modes; handling counts as a
/// handled source (with `returnAfterSourceHandled`, one message is handled and the run returns).
///
/// Nothing accepted is lost: each message ``send(_:)`` accepts is either delivered or returned by
/// ``invalidate()``. A send that is refused throws, and the error carries the message back.
/// Messages sent before the port is added to a loop wait, and are delivered once it is.
///
/// A port belongs to one loop (any number of its modes).
public final class MessagePort<Message: Sendable>: Sendable, Hashable, CustomStringConvertible {
    /// Why ``MessagePort/send(_:)`` refused a message, with the message.
    public enum SendError: Error, CustomStringConvertible {
        /// The port holds ``MessagePort/capacity`` undelivered messages.
        case full(Message)
        /// The port was invalidated.
        case invalidated(Message)

        /// The message that was not sent.
        public var message: Message {
            switch self {
            case .full(let message), .invalidated(let message): message
            }
        }

        /// What went wrong.
        public var description: String {
            switch self {
            case .full: "MessagePort is full"
            case .invalidated: "MessagePort is invalidated"
            }
        }
    }

    /// The most undelivered messages the port holds; nil for no limit.
    public let capacity: Int?
    /// The position among a mode's version-1 sources: lower orders are handled first.
    public let order: Int

    let id: UInt64
    /// Its name in traces (see `label`).
    let itemLabel = ItemLabel()
    @usableFromInline let handler: @Sendable (Message) -> Void
    let registration = Mutex(Source1Registration())
    @usableFromInline let queue = SpinLocked(PortQueue<Message>())
    /// Messages are queued and the loop has not taken them yet (read without the lock).
    @usableFromInline let hasQueued = Atomic<Bool>(false)
    /// The batch the loop is delivering, loop thread only.
    @usableFromInline let inFlight = InFlightMessages<Message>()
    /// Delivers a batch (``deliverBatch(on:)``), made where the message type is known: the
    /// per-message work runs specialized, not through the generic code the loop calls.
    private let deliver: @Sendable (MessagePort<Message>, RunLoop) -> Bool
    /// Called once, by the first ``invalidate()`` (a port read as an async sequence ends it).
    private let invalidationHook = Mutex<(@Sendable () -> Void)?>(nil)

    /// Creates a port.
    ///
    /// - Parameters:
    ///   - capacity: The most undelivered messages it holds (at least 1); nil for no limit.
    ///   - order: The position among a mode's version-1 sources.
    ///   - handler: Called on the loop's thread with each message, in the order they were sent.
    @inlinable
    public convenience init(capacity: Int? = nil, order: Int = 0, handler: @escaping @Sendable (Message) -> Void) {
        // Inlinable, so that this closure is compiled where `Message` is known: a port's
        // messages are delivered by specialized code (2-3x faster than the generic path).
        self.init(capacity: capacity, order: order, handler: handler, deliver: { port, loop in port.deliverBatch(on: loop) })
    }

    @usableFromInline
    init(
        capacity: Int?, order: Int, handler: @escaping @Sendable (Message) -> Void,
        deliver: @escaping @Sendable (MessagePort<Message>, RunLoop) -> Bool
    ) {
        if let capacity { fatalPrecondition(capacity >= 1, "MessagePort capacity must be at least 1, got \(capacity)") }
        self.capacity = capacity
        self.order = order
        self.handler = handler
        self.deliver = deliver
        self.id = Source1IDs.make()
    }

    /// Queues `message` and wakes the loop the port is on. Any thread.
    ///
    /// Inlinable: the queueing is specialized for the message type in the sender's module.
    ///
    /// - Throws: ``SendError/full(_:)`` when ``capacity`` messages wait,
    ///   ``SendError/invalidated(_:)`` after ``invalidate()``; either way with the message.
    /// - Complexity: O(1) amortized.
    @inlinable
    public func send(_ message: Message) throws(SendError) {
        let refusal: SendError? = queue.locked { queue in
            guard queue.valid else { return .invalidated(message) }
            if let capacity, queue.messages.count >= capacity { return .full(message) }
            queue.messages.append(message)
            return nil
        }
        if let refusal { throw refusal }
        // Only the first message of a batch tells the loop; the flag stays set until the loop
        // takes the batch.
        if hasQueued.load(ordering: .relaxed) || hasQueued.exchange(true, ordering: .acquiringAndReleasing) { return }
        tellLoop()
    }

    /// Tells the port's loop (if it is on one) that messages wait.
    @usableFromInline
    func tellLoop() {
        registration.locked { registration in registration.loop?.loop.source1NeedsAttention() }
    }

    /// Takes the queued batch and hands each message to the handler, each a callout of its own (a
    /// stall monitor tells them apart). Loop thread. Returns whether it delivered any.
    @inlinable
    func deliverBatch(on loop: RunLoop) -> Bool {
        // Clear the flag before taking the batch: a message sent after the take sets it again.
        hasQueued.store(false, ordering: .releasing)
        // The queue is exchanged for the emptied storage of the last batch: no allocation in
        // steady state.
        var batch = inFlight.takeSpare()
        queue.locked { queue in swap(&queue.messages, &batch) }
        guard !batch.isEmpty else {
            inFlight.keepSpare(batch)
            return false
        }
        // Consumed: the in-flight batch is then the storage's only owner, so taking messages from
        // it never copies it.
        inFlight.begin(consume batch)
        var first = true
        while let message = inFlight.next() {
            if !first { loop.portCalloutBegins(label: calloutLabel) }
            first = false
            handler(message)
            loop.portCalloutEnds()
        }
        return true
    }

    /// How many messages wait for delivery.
    public var queuedCount: Int { queue.locked { $0.messages.count } }

    /// Whether the port still accepts messages.
    public var isValid: Bool { queue.locked { $0.valid } }

    /// Stops the port for good: later sends throw, the port leaves its loop, and the messages not
    /// yet delivered are returned, oldest first. Called from the handler, it also returns the rest
    /// of the batch being delivered; called from another thread while the loop delivers a batch,
    /// that batch is still delivered. Safe from any thread.
    @discardableResult
    public func invalidate() -> [Message] {
        var undelivered: [Message] = []
        let loop: RunLoop? = registration.locked { registration in
            let loop = registration.loop?.loop
            registration.valid = false
            return loop
        }
        let queued: Deque<Message>? = queue.locked { queue in
            guard queue.valid else { return nil }
            queue.valid = false
            let messages = queue.messages
            queue.messages = []
            return messages
        }
        guard let queued else { return [] }
        if let hook = invalidationHook.locked({ hook in defer { hook = nil }; return hook }) { hook() }
        if let loop {
            if loop.isCurrent { undelivered.append(contentsOf: inFlight.takeRest()) }
            loop.detachSource1(self)
        }
        // Not for an empty deque: the standard library's Array-from-Deque of zero elements writes
        // a zero count into the shared empty-array singleton, which ThreadSanitizer reports as a
        // race with every other thread reading an empty array.
        if !queued.isEmpty { undelivered.append(contentsOf: queued) }
        return undelivered
    }

    /// Called once when the port is invalidated (RunLoop+AsyncSequences.swift). Any thread.
    package var onInvalidate: (@Sendable () -> Void)? {
        get { invalidationHook.locked { $0 } }
        set { invalidationHook.locked { $0 = newValue } }
    }

    /// Ports are equal only to themselves.
    public static func == (lhs: MessagePort, rhs: MessagePort) -> Bool { lhs === rhs }

    /// Hashes the port's identity.
    public func hash(into hasher: inout Hasher) { hasher.combine(ObjectIdentifier(self)) }

    /// `<MessagePort<Int> 0x… "label" queued 3 capacity 100 order 0 valid>` (the label if it has one).
    public var description: String {
        let (count, valid) = queue.locked { ($0.messages.count, $0.valid) }
        let limit = capacity.map { " capacity \($0)" } ?? ""
        return
            "<MessagePort<\(Message.self)> \(objectAddress(self))\(label.map { " \"\($0)\"" } ?? "") queued \(count)\(limit) order \(order) \(valid ? "valid" : "invalid")>"
    }
}

extension MessagePort: Source1Item {
    func invalidateItem() {
        let dropped = invalidate().count
        if dropped > 0 { Diagnostics.warning("\(self) invalidated with its loop's thread gone; \(dropped) undelivered messages dropped") }
    }

    func withRegistration<R>(_ body: (inout Source1Registration) -> R) -> R {
        registration.locked { registration in body(&registration) }
    }

    var needsAttention: Bool { hasQueued.load(ordering: .acquiring) }

    var descriptorSource: FileDescriptorSource? { nil }

    var calloutKind: RunLoop.CalloutKind { .port }

    @usableFromInline
    var calloutLabel: UInt32 { itemLabel.calloutLabel.load(ordering: .relaxed) }

    func perform(events: FileDescriptorSource.Events, onlyOne: Bool, on loop: RunLoop) -> Bool {
        guard hasQueued.load(ordering: .acquiring) else { return false }
        if onlyOne {
            let (message, more): (Message?, Bool) = queue.locked { queue in
                let message = queue.messages.popFirst()
                return (message, !queue.messages.isEmpty)
            }
            if !more {
                hasQueued.store(false, ordering: .releasing)
                // A send between the pop and the store saw the flag set and did not tell the loop.
                if queue.locked({ !$0.messages.isEmpty }) { hasQueued.store(true, ordering: .releasing) }
            }
            if more || hasQueued.load(ordering: .relaxed) { loop.source1NeedsAttention() }
            guard let message else { return false }
            handler(message)
            return true
        }
        return deliver(self, loop)
    }
}

/// A port's queue, under its lock.
@usableFromInline
struct PortQueue<Message: Sendable>: Sendable {
    @usableFromInline var messages = Deque<Message>()
    @usableFromInline var valid = true

    @usableFromInline init() {}
}

/// The batch a loop is delivering; touched only on that loop's thread (``MessagePort/perform``
/// and ``MessagePort/invalidate()`` when called there), hence `@unchecked Sendable`: it is
/// never read or written from two threads.
@usableFromInline
final class InFlightMessages<Message: Sendable>: @unchecked Sendable {
    @usableFromInline var batch = Deque<Message>()
    /// Empty storage for the port's queue to be exchanged for at the next take: the last batch's,
    /// once delivered.
    @usableFromInline var spare = Deque<Message>()
    /// The most messages `batch` has held since it was taken: a burst's storage is not kept.
    @usableFromInline var largestCount = 0

    /// A batch larger than this gives its storage back once delivered, rather than keeping it as
    /// the spare.
    @usableFromInline static var largestKept: Int { 1 << 16 }

    @usableFromInline init() {}

    /// Starts delivering `messages`; a delivery nested in a handler of the batch in flight (the
    /// handler ran the loop) delivers what is left of it first, then these, in order: nothing
    /// accepted is dropped.
    @inlinable func begin(_ messages: consuming Deque<Message>) {
        if batch.isEmpty {
            // The delivered batch's storage becomes the spare for the next take.
            keepSpare(batch)
            largestCount = messages.count
            batch = messages
        } else {
            batch.append(contentsOf: messages)
            largestCount = max(largestCount, batch.count)
        }
    }

    /// Keeps `storage` (empty) as the next take's spare, unless a burst made it large.
    @inlinable func keepSpare(_ storage: Deque<Message>) {
        assert(storage.isEmpty, "a port's spare storage must be empty")
        spare = largestCount <= Self.largestKept ? storage : Deque()
    }

    /// The spare storage, empty, for the port's queue; the spare is left empty of storage.
    @inlinable func takeSpare() -> Deque<Message> {
        var storage = Deque<Message>()
        swap(&storage, &spare)
        return storage
    }

    @inlinable func next() -> Message? { batch.popFirst() }

    /// Removes and returns what is left of the batch.
    func takeRest() -> [Message] {
        guard !batch.isEmpty else { return [] }  // see MessagePort.invalidate()
        let rest = Array(batch)
        batch.removeAll()
        return rest
    }
}
