#if OpenCombine
import Foundation
import OpenCombine
import Synchronization

// What the ported OpenCombine tests need from their suite's helpers (TrackingSubscriber.swift,
// ExecuteOnBackgroundThread.swift), written again for Swift 6.

/// A value shared between a test and the actions it schedules.
///
/// `@unchecked Sendable`: the value is read and written only under the lock.
final class Locked<Value>: @unchecked Sendable {
    private let lock = NSLock()
    private var stored: Value
    init(_ value: Value) { stored = value }
    var value: Value {
        get { lock.lock(); defer { lock.unlock() }; return stored }
        _modify { lock.lock(); defer { lock.unlock() }; yield &stored }
    }
}

/// A cancellable made on a background thread and handed to the test.
///
/// `@unchecked Sendable`: the cancellables here (a timer connection, a scheduler's repeating
/// schedule) may be cancelled from any thread.
struct CancellableBox: @unchecked Sendable {
    let cancellable: any Cancellable
    init(_ cancellable: any Cancellable) { self.cancellable = cancellable }
}

/// Runs `body` on a new thread and returns its result once the thread is done.
@discardableResult
func executeOnBackgroundThread<Result: Sendable>(_ body: @escaping @Sendable () -> Result) -> Result {
    let result = Locked<Result?>(nil)
    let done = DispatchSemaphore(value: 0)
    let thread = Thread {
        result.value = body()
        done.signal()
    }
    thread.start()
    done.wait()
    return result.value!
}

/// Records what a subscriber receives (the shape of OpenCombine's TrackingSubscriberBase):
/// `receiveSubscription` and `receiveValue` decide the demand, the history is kept in order.
///
/// `@unchecked Sendable`: the history is under a lock; the callbacks are the test's and run on
/// the thread the publisher calls from.
final class TrackingSubscriberBase<Value, Failure: Error>: Subscriber, @unchecked Sendable {
    typealias Input = Value

    enum Event: CustomStringConvertible {
        case subscription(String)
        case value(Value)
        case completion(Subscribers.Completion<Failure>)

        var description: String {
            switch self {
            case .subscription(let subscription): return ".subscription(\"\(subscription)\")"
            case .value(let value): return ".value(\(value))"
            case .completion(.finished): return ".completion(.finished)"
            case .completion(.failure(let error)): return ".completion(.failure(\(error)))"
            }
        }
    }

    private let onSubscription: ((any Subscription) -> Void)?
    private let onValue: ((Value) -> Subscribers.Demand)?
    private let lock = NSLock()
    private var events: [Event] = []
    private var subscriptionObjects: [any Subscription] = []

    init(receiveSubscription: ((any Subscription) -> Void)? = nil,
         receiveValue: ((Value) -> Subscribers.Demand)? = nil) {
        onSubscription = receiveSubscription
        onValue = receiveValue
    }

    var history: [Event] { lock.lock(); defer { lock.unlock() }; return events }
    var subscriptions: [any Subscription] { lock.lock(); defer { lock.unlock() }; return subscriptionObjects }

    func receive(subscription: any Subscription) {
        lock.lock()
        events.append(.subscription(String(describing: type(of: subscription))))
        subscriptionObjects.append(subscription)
        lock.unlock()
        onSubscription?(subscription)
    }

    func receive(_ input: Value) -> Subscribers.Demand {
        lock.lock()
        events.append(.value(input))
        lock.unlock()
        return onValue?(input) ?? .none
    }

    func receive(completion: Subscribers.Completion<Failure>) {
        lock.lock()
        events.append(.completion(completion))
        lock.unlock()
    }
}

extension TrackingSubscriberBase.Event: Equatable where Value: Equatable {
    static func == (lhs: Self, rhs: Self) -> Bool {
        switch (lhs, rhs) {
        case let (.subscription(a), .subscription(b)): return a == b
        case let (.value(a), .value(b)): return a == b
        case (.completion(.finished), .completion(.finished)): return true
        case let (.completion(.failure(a)), .completion(.failure(b))):
            return String(describing: a) == String(describing: b)
        default: return false
        }
    }
}
#endif
