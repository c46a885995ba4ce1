import RunLoopKit
import Synchronization

// `locked` is RunLoopKit's `withLock` that ThreadSanitizer sees (Synchronization's Mutex parks on raw futex
// calls it does not intercept); application code would write `withLock`.

// A debouncer and a throttler written the way application code writes them, not for the tests:
// an unstructured `Task` inside, sleeping on an injected clock. The tests run them unchanged on
// virtual time (RunLoopTesting) and on swift-clocks' TestClock.

/// Calls `action` with the last value sent, once `delay` has passed with no newer value.
final class Debouncer<Value: Sendable>: Sendable {
    private let clock: any Clock<Duration>
    private let delay: Duration
    private let action: @Sendable (Value) -> Void
    private let pending = Mutex<Task<Void, Never>?>(nil)

    init(clock: any Clock<Duration>, delay: Duration, action: @escaping @Sendable (Value) -> Void) {
        self.clock = clock
        self.delay = delay
        self.action = action
    }

    func send(_ value: Value) {
        let task = Task { [clock, delay, action] in
            do {
                try await clock.sleep(for: delay)
            } catch {
                return
            }
            action(value)
        }
        pending.locked { $0 }?.cancel()
        pending.locked { $0 = task }
    }

    /// Drops the value waiting, if any.
    func cancel() {
        pending.locked { $0 }?.cancel()
    }
}

/// Calls `action` with the first value sent, then at most once per `interval` with the latest
/// value sent meanwhile (leading and trailing edges).
final class Throttler<Value: Sendable>: Sendable {
    private struct State {
        var latest: Value?
        var window: Task<Void, Never>?
    }

    private let clock: any Clock<Duration>
    private let interval: Duration
    private let action: @Sendable (Value) -> Void
    private let state = Mutex(State())

    init(clock: any Clock<Duration>, interval: Duration, action: @escaping @Sendable (Value) -> Void) {
        self.clock = clock
        self.interval = interval
        self.action = action
    }

    func send(_ value: Value) {
        let leading = state.locked { state -> Bool in
            if state.window != nil {
                state.latest = value
                return false
            }
            state.window = Task { await self.closeWindow() }
            return true
        }
        if leading { action(value) }
    }

    private func closeWindow() async {
        while true {
            try? await clock.sleep(for: interval)
            let trailing = state.locked { state -> Value? in
                defer { state.latest = nil }
                if state.latest == nil { state.window = nil }
                return state.latest
            }
            guard let trailing else { return }
            action(trailing)
        }
    }
}
