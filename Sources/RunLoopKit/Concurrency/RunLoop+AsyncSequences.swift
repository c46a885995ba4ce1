import Synchronization
import SystemPackage

// A loop's items as async sequences: timer ticks, descriptor readiness, port messages and the
// loop's activities, each consumed by one task with `for await`. Each sequence owns its item:
// cancelling the consuming task, or dropping the sequence and its iterator, removes the item from
// the loop. Each has a bounded buffer with a stated policy, and a slow consumer never makes the
// loop spin.

/// A tick of ``RunLoop/ticks(every:tolerance:modes:)``.
public struct RunLoopTick: Sendable, Hashable {
    /// The loop's clock when the loop handled the tick (its timer's callout).
    public var date: ContinuousClock.Instant
    /// Ticks that fired while the consumer was busy and were folded into this one.
    public var skipped: Int
}

/// One consumer's view of a loop item's output: the shared shape of RunLoopKit's async sequences.
/// Read it with `for await`; it has one consumer (a second iterator stops the process).
public struct RunLoopAsyncSequence<Element: Sendable>: AsyncSequence, Sendable {
    public typealias Failure = Never
    let lifetime: LoopChannelLifetime<Element>

    /// Elements dropped because the consumer was slow (activities only; the other sequences
    /// coalesce or push back instead).
    public var dropped: Int { lifetime.channel.dropped }

    public func makeAsyncIterator() -> Iterator {
        lifetime.channel.claimConsumer()
        return Iterator(lifetime: lifetime)
    }

    /// The iterator: ``next()`` waits for the next element; nil once the sequence ended or the
    /// consuming task was cancelled.
    public struct Iterator: AsyncIteratorProtocol {
        let lifetime: LoopChannelLifetime<Element>

        public mutating func next() async -> Element? { await lifetime.channel.next() }

        public mutating func next(isolation actor: isolated (any Actor)?) async -> Element? {
            await lifetime.channel.next()
        }
    }
}

extension RunLoop {
    /// A timer's ticks as an async sequence: a repeating ``RunLoopTimer`` on this loop, first due
    /// `interval` from now, in `modes` (common modes by default, so ticks go on during a
    /// `.tracking` run).
    ///
    /// <!-- snippet: prelude
    /// func draw(at date: ContinuousClock.Instant) {}
    /// -->
    /// ```swift
    /// for await tick in loop.ticks(every: .milliseconds(16)) {
    ///     draw(at: tick.date)
    /// }
    /// ```
    ///
    /// - **A slow consumer** gets one tick per call of the iterator's `next()`: ticks
    ///   that fire while it is busy are folded into the next one it reads (its ``RunLoopTick/skipped``
    ///   counts them), as a timer that missed its fire dates fires once. Nothing accumulates.
    /// - **Ending.** Cancelling the consuming task, or dropping the sequence and its iterator,
    ///   invalidates the timer.
    /// - **Where the timer is made.** On this loop's thread (a block is queued when called
    ///   elsewhere), so its first fire date is on this loop's clock, virtual time included.
    public func ticks(
        every interval: Duration, tolerance: Duration = .zero, modes: [Mode] = [.common]
    ) -> RunLoopAsyncSequence<RunLoopTick> {
        fatalPrecondition(interval > .zero, "RunLoop.ticks(every:): the interval must be positive (got \(interval))")
        let channel = LoopChannel<RunLoopTick>(policy: .coalesce(limit: 1)) { last, new in
            last = RunLoopTick(date: new.date, skipped: last.skipped + 1 + new.skipped)
        }
        let timerBox = TimerBox()
        channel.endProducer = { timerBox.invalidate() }
        // Made here, not in the block: a loop whose thread has exited drops the block, and with
        // it the producer, which finishes the channel.
        let producer = LoopChannelProducer(channel)
        let make: @Sendable () -> Void = { [self] in
            let timer = RunLoopTimer(fireAt: now + interval, interval: interval, tolerance: tolerance) { _ in
                producer.push(RunLoopTick(date: RunLoop.now, skipped: 0))
            }
            guard timerBox.set(timer) else { return }
            for mode in modes { add(timer, forMode: mode) }
        }
        // A loop whose thread has exited refuses the block, or its teardown drops it: either way
        // the block, and the producer with it, is released, which finishes the channel.
        if isCurrent { make() } else { perform(inModes: modes, make) }
        return RunLoopAsyncSequence(lifetime: LoopChannelLifetime(channel))
    }

    /// The loop's activities (``Activity``) as an async sequence: an observer of `activities` in
    /// `modes`.
    ///
    /// - **A slow consumer** misses activities: the sequence keeps the newest `bufferLimit`
    ///   (``RunLoopAsyncSequence/dropped`` counts the rest). Observing must never slow the loop.
    /// - **Ending.** Cancelling the consuming task, or dropping the sequence and its iterator,
    ///   removes the observer.
    public func activities(
        _ activities: Activity = .allActivities, modes: [Mode] = [.common], bufferLimit: Int = 64
    ) -> RunLoopAsyncSequence<Activity> {
        let channel = LoopChannel<Activity>(policy: .dropOldest(limit: bufferLimit))
        let producer = LoopChannelProducer(channel)
        let observer = RunLoopObserver(activities: activities) { _, activity in producer.push(activity) }
        // Weak: the loop keeps the observer while it is added; when the loop lets go (its thread
        // exited), the handler goes with it and finishes the channel.
        channel.endProducer = { [weak observer] in observer?.invalidate() }
        for mode in modes { add(observer, forMode: mode) }
        return RunLoopAsyncSequence(lifetime: LoopChannelLifetime(channel))
    }

    /// A descriptor's readiness as an async sequence: a ``FileDescriptorSource`` watching
    /// `descriptor` for `events` in `modes` of this loop. Each element is what happened since the
    /// consumer last read (``FileDescriptorSource/Events``, or-ed together).
    ///
    /// <!-- snippet: prelude
    /// let socket: Int32 = 0
    /// func drain(_ descriptor: Int32) {}
    /// -->
    /// ```swift
    /// for await events in try loop.events(of: socket) where events.contains(.readable) {
    ///     drain(socket)
    /// }
    /// ```
    ///
    /// - **A slow consumer**: readiness is a state, not a queue. Once an element waits unread,
    ///   the source stops watching until the consumer asks for the next one, so a descriptor
    ///   that stays ready does not make the loop spin; what happened meanwhile is reported then
    ///   (epoll reports a ready descriptor again when the watch resumes).
    /// - **Hang-up and error** (``FileDescriptorSource/Events/hangUp``,
    ///   ``FileDescriptorSource/Events/error``) end the sequence after the element that reports
    ///   them.
    /// - **Ending.** Cancelling the consuming task, or dropping the sequence and its iterator,
    ///   invalidates the source (and closes the descriptor if `ownsDescriptor`).
    ///
    /// - Throws: what ``FileDescriptorSource/init(descriptor:watching:ownsDescriptor:order:handler:)``
    ///   throws for a descriptor epoll cannot watch.
    public func events(
        of descriptor: Int32, watching events: FileDescriptorSource.Events = .readable, ownsDescriptor: Bool = false,
        modes: [Mode] = [.common]
    ) throws(Errno) -> RunLoopAsyncSequence<FileDescriptorSource.Events> {
        let channel = LoopChannel<FileDescriptorSource.Events>(policy: .pause(limit: 1)) { last, new in
            last.formUnion(new)
        }
        let watched = events.intersection([.readable, .writable])
        let producer = LoopChannelProducer(channel)
        let source = try FileDescriptorSource(descriptor: descriptor, watching: watched, ownsDescriptor: ownsDescriptor) {
            [channel] source, happened in
            producer.push(happened)
            if !happened.isDisjoint(with: [.hangUp, .error, .closed]) {
                channel.finish()
                source.invalidate()
            }
        }
        channel.pauseProducer = { [weak source] in source?.watchedEvents = [] }
        channel.resumeProducer = { [weak source] in source?.watchedEvents = watched }
        channel.endProducer = { [weak source] in source?.invalidate() }
        for mode in modes { add(source, forMode: mode) }
        return RunLoopAsyncSequence(lifetime: LoopChannelLifetime(channel))
    }

    /// A port whose messages are read with `for await`: a ``MessagePort`` of `capacity`, on this
    /// loop in `modes`, and the sequence of its messages, in the order they were sent.
    ///
    /// <!-- snippet: prelude
    /// enum Command: Sendable { case reload }
    /// func handle(_ command: Command) {}
    /// -->
    /// ```swift
    /// let (port, messages) = loop.messageStream(of: Command.self, capacity: 1024)
    /// // any thread: try port.send(.reload)
    /// for await command in messages { handle(command) }
    /// ```
    ///
    /// - **A slow consumer** pushes back, and nothing is dropped: once `bufferLimit` messages wait
    ///   unread, the port is taken out of its modes until the consumer has read below the limit,
    ///   so messages stay in the port, and once `capacity` wait there `send` throws
    ///   ``MessagePort/SendError/full(_:)``. At most `bufferLimit` + `capacity` messages wait
    ///   (plus the batch the loop was delivering when it stopped).
    /// - **Ending.** Invalidating the port ends the sequence once the consumer has read what was
    ///   delivered; cancelling the consuming task, or dropping the sequence and its iterator,
    ///   invalidates the port (later sends throw ``MessagePort/SendError/invalidated(_:)``).
    public func messageStream<Message: Sendable>(
        of type: Message.Type = Message.self, capacity: Int? = nil, bufferLimit: Int = 64,
        modes: [Mode] = [.common]
    ) -> (port: MessagePort<Message>, messages: RunLoopAsyncSequence<Message>) {
        let channel = LoopChannel<Message>(policy: .pause(limit: bufferLimit))
        let port = MessagePort<Message>(capacity: capacity) { [channel] message in channel.push(message) }
        port.onInvalidate = { [channel] in channel.finish() }
        channel.pauseProducer = { [self, weak port] in
            guard let port else { return }
            for mode in modes { remove(port, forMode: mode) }
        }
        channel.resumeProducer = { [self, weak port] in
            guard let port, port.isValid else { return }
            for mode in modes { add(port, forMode: mode) }
        }
        channel.endProducer = { [weak port] in _ = port?.invalidate() }
        for mode in modes { add(port, forMode: mode) }
        return (port, RunLoopAsyncSequence(lifetime: LoopChannelLifetime(channel)))
    }
}

/// The timer of a ``RunLoop/ticks(every:tolerance:modes:)`` sequence, set on the loop's thread;
/// invalidated from any thread, before or after it is set.
///
/// `@unchecked Sendable` is safe: its state is behind the mutex.
final class TimerBox: @unchecked Sendable {
    /// Weak: only the loop keeps the timer alive, so that when the loop lets go of it (its thread
    /// exited) its handler goes and finishes the sequence.
    private struct State {
        weak var timer: RunLoopTimer?
        var ended = false
    }
    private let state = Mutex(State())

    /// Keeps `timer`; false if the sequence already ended (then the timer must not be added).
    func set(_ timer: RunLoopTimer) -> Bool {
        state.locked { state in
            guard !state.ended else { return false }
            state.timer = timer
            return true
        }
    }

    func invalidate() {
        let timer = state.locked { state -> RunLoopTimer? in
            state.ended = true
            return state.timer
        }
        timer?.invalidate()
    }
}
