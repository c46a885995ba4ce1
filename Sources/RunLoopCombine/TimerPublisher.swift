#if OpenCombine
public import OpenCombine
public import RunLoopKit
import Synchronization
#if canImport(FoundationEssentials)
public import FoundationEssentials
#else
public import Foundation
#endif

extension RunLoopTimer {
    /// A publisher of the date at every fire of a repeating timer on `runLoop`, in `mode`:
    /// Foundation's `Timer.publish(every:tolerance:on:in:options:)`. Nothing is sent until the
    /// publisher is connected (`connect()` or `autoconnect()`).
    ///
    /// Unlike Combine's, whose publisher drops the tolerance it is given, the timer here has it.
    public static func publish(
        every interval: TimeInterval, tolerance: TimeInterval? = nil, on runLoop: RunLoop, in mode: RunLoop.Mode,
        options: RunLoop.SchedulerOptions? = nil
    ) -> RunLoop.TimerPublisher {
        RunLoop.TimerPublisher(interval: interval, tolerance: tolerance, runLoop: runLoop, mode: mode, options: options)
    }
}

extension RunLoop {
    /// A connectable publisher of the current date at every fire of a repeating loop timer:
    /// Foundation's `Timer.TimerPublisher` on a RunLoopKit loop.
    ///
    /// Each `connect()` adds a repeating ``RunLoopTimer`` to the loop in ``mode``; at each fire,
    /// every subscriber with demand left receives the same date, on the loop's thread; a subscriber
    /// with none misses that tick (ticks are not buffered). Cancelling a connection stops delivery
    /// from every connection of the publisher, as in Combine (its timers are invalidated); a later
    /// `connect()` starts again. Subscribers may subscribe, request and cancel from any thread.
    public final class TimerPublisher: ConnectablePublisher, Sendable {
        /// The dates of the timer's fires.
        public typealias Output = Date
        /// A timer never fails.
        public typealias Failure = Never

        /// Seconds between fires (0.1 ms or less repeats every 0.1 ms, as Foundation's timers do).
        public let interval: TimeInterval
        /// How late the timer may fire to share a wakeup (none if nil).
        public let tolerance: TimeInterval?
        /// The loop whose timer drives the publisher.
        public let runLoop: RunLoop
        /// The mode the timer runs in.
        public let mode: RunLoop.Mode
        /// Kept for Foundation's shape; the timer runs in ``mode``.
        public let options: RunLoop.SchedulerOptions?

        private let state = Mutex(PublisherState())

        /// A publisher whose timer fires every `interval` seconds on `runLoop` in `mode` once
        /// connected.
        public init(
            interval: TimeInterval, tolerance: TimeInterval? = nil, runLoop: RunLoop, mode: RunLoop.Mode,
            options: RunLoop.SchedulerOptions? = nil
        ) {
            self.interval = interval
            self.tolerance = tolerance
            self.runLoop = runLoop
            self.mode = mode
            self.options = options
        }

        /// Attaches `subscriber`: it receives its subscription at once, on the calling thread, and
        /// then a date at each fire for which it has demand.
        public func receive<S: Subscriber>(subscriber: S) where S.Input == Date, S.Failure == Never {
            let subscription = TimerSubscription(AnySubscriber(subscriber), publisher: self)
            state.locked { $0.subscriptions.append(subscription) }
            subscriber.receive(subscription: subscription)
        }

        /// Starts a repeating timer on the loop; cancelling the result stops every timer of this
        /// publisher.
        ///
        /// On a loop whose thread has exited (before `connect()`, or while connected), the timer
        /// can never fire: the subscribers receive `.finished` (with a warning), instead of
        /// waiting forever.
        public func connect() -> any Cancellable {
            let ending = EndsWithLoop(self)
            let timer = RunLoopTimer(fire: Date(timeIntervalSinceNow: interval.isNaN ? 0 : interval), interval: interval, repeats: true) {
                _ in ending.publisher?.tick()
            }
            if let tolerance, tolerance > 0, tolerance.isFinite { timer.tolerance = .seconds(Swift.min(tolerance, 1e9)) }
            state.locked { state in
                state.timers.append(Weak(timer))
                state.endings.append(Weak(ending))
            }
            runLoop.add(timer, forMode: mode)
            return Connection(publisher: self)
        }

        fileprivate func disconnect() {
            let (timers, endings) = state.locked { state -> ([Weak<RunLoopTimer>], [Weak<EndsWithLoop>]) in
                defer {
                    state.timers.removeAll()
                    state.endings.removeAll()
                }
                return (state.timers, state.endings)
            }
            // Cancelled, not ended by the loop: the subscribers are not finished.
            for ending in endings { ending.value?.disarm() }
            for timer in timers { timer.value?.invalidate() }
        }

        /// The loop let go of a connection's timer without its being cancelled: its thread exited.
        /// Every subscriber receives `.finished`.
        fileprivate func loopEnded() {
            let subscriptions = state.locked { state -> [TimerSubscription] in
                defer { state.subscriptions.removeAll() }
                return state.subscriptions
            }
            guard !subscriptions.isEmpty else { return }
            Swift.print(
                "RunLoopCombine: warning: a timer publisher's loop \(runLoop.shortDescription) has no thread any more; its subscribers are finished"
            )
            for subscription in subscriptions { subscription.finish() }
        }

        fileprivate func remove(_ subscription: TimerSubscription) {
            state.locked { $0.subscriptions.removeAll { $0 === subscription } }
        }

        private func tick() {
            let date = Date()
            let subscriptions = state.locked { $0.subscriptions }
            for subscription in subscriptions { subscription.deliver(date) }
        }

        deinit {
            for timer in state.locked({ $0.timers }) { timer.value?.invalidate() }
        }
    }
}

private struct PublisherState: ~Copyable {
    var subscriptions: [TimerSubscription] = []
    /// Weak: only the loop keeps a connection's timer, so that when the loop lets go of it (its
    /// thread exited, or had exited when it was added), its handler and the ``EndsWithLoop`` in
    /// it go, and the subscribers are finished.
    var timers: [Weak<RunLoopTimer>] = []
    /// Weak too: the timer's handler is what keeps each alive.
    var endings: [Weak<EndsWithLoop>] = []
}

/// Lives in a connection's timer handler: when the loop lets go of the handler while the
/// connection is still armed (the loop's thread exited, or had exited when the timer was added),
/// the publisher's subscribers are finished. Disarmed by a cancellation first.
private final class EndsWithLoop: Sendable {
    weak let publisher: RunLoop.TimerPublisher?
    private let armed = Atomic<Bool>(true)

    init(_ publisher: RunLoop.TimerPublisher) { self.publisher = publisher }

    func disarm() { armed.store(false, ordering: .releasing) }

    deinit {
        guard armed.load(ordering: .acquiring) else { return }
        publisher?.loopEnded()
    }
}

/// A connection of a ``RunLoop/TimerPublisher``: cancelling it stops the publisher's timers.
private final class Connection: Cancellable, Sendable {
    private let publisher = Mutex<RunLoop.TimerPublisher?>(nil)
    init(publisher: RunLoop.TimerPublisher) { self.publisher.locked { $0 = publisher } }
    func cancel() {
        let publisher = self.publisher.locked { slot -> RunLoop.TimerPublisher? in
            defer { slot = nil }
            return slot
        }
        publisher?.disconnect()
    }
}

/// One subscriber of a timer publisher and its demand.
///
/// `@unchecked Sendable`: its mutable state (the demand, the subscriber while attached) is behind
/// its mutex; the subscriber is called outside the lock, with dates only from the timer's fires,
/// which the loop makes one at a time on its own thread.
private final class TimerSubscription: Subscription, @unchecked Sendable {
    // `@unchecked Sendable` so the mutex can hold it: the subscriber in it is read and written only
    // under that mutex, and called only as described above.
    private struct State: @unchecked Sendable {
        var subscriber: AnySubscriber<Date, Never>?
        var demand = Subscribers.Demand.none
    }
    private let state: Mutex<State>
    private weak let publisher: RunLoop.TimerPublisher?

    init(_ subscriber: AnySubscriber<Date, Never>, publisher: RunLoop.TimerPublisher) {
        state = Mutex(State(subscriber: subscriber))
        self.publisher = publisher
    }

    func request(_ demand: Subscribers.Demand) {
        state.locked { state in
            guard state.subscriber != nil else { return }
            state.demand += demand
        }
    }

    func cancel() {
        let subscriber = state.locked { state -> AnySubscriber<Date, Never>? in
            defer { state.subscriber = nil }
            return state.subscriber
        }
        guard subscriber != nil else { return }
        publisher?.remove(self)
        // Released here, outside the lock: its deinit may run any code.
        withExtendedLifetime(subscriber) {}
    }

    /// Sends `.finished` and detaches the subscriber (the publisher's loop is gone).
    func finish() {
        let subscriber = state.locked { state -> AnySubscriber<Date, Never>? in
            defer { state.subscriber = nil }
            return state.subscriber
        }
        subscriber?.receive(completion: .finished)
    }

    func deliver(_ date: Date) {
        let subscriber = state.locked { state -> AnySubscriber<Date, Never>? in
            guard state.demand > 0, let subscriber = state.subscriber else { return nil }
            state.demand -= 1
            return subscriber
        }
        guard let subscriber else { return }
        let more = subscriber.receive(date)
        request(more)
    }
}
#endif
