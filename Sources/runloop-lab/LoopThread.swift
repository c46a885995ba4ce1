import CRunLoopLab
import Foundation
import RunLoopKit
import Synchronization

import class RunLoopKit.RunLoop

/// A Foundation `Thread` started for one experiment, whose body gets the thread's own run loop.
///
/// Other threads reach the loop through ``loop`` (which waits until the thread has created it)
/// and wait for the body to return with ``join()``.
final class LoopThread: Sendable {
    private let published = Mutex<RunLoop?>(nil)
    private let loopReady = DispatchSemaphore(value: 0)
    private let finished = DispatchSemaphore(value: 0)

    /// Starts a thread named `name` that runs `body` with `RunLoop.current`.
    init(name: String, _ body: @escaping @Sendable (RunLoop) -> Void) {
        // Foundation names the kernel thread only after the body has started, too late for the
        // loop (which keeps the name its thread had when it was made) and for traces.
        let thread = Thread {
            _ = crll_set_thread_name(name)
            self.main(body)
        }
        thread.name = name
        thread.start()
    }

    /// The thread's body: publishes the loop, runs `body`, signals the end.
    private func main(_ body: @Sendable (RunLoop) -> Void) {
        let loop = RunLoop.current
        LabTrace.recordIfTracing(loop)
        published.locked { $0 = loop }
        loopReady.signal()
        body(loop)
        finished.signal()
    }

    /// The thread's loop, once the thread has created it.
    var loop: RunLoop {
        if let loop = published.locked({ $0 }) { return loop }
        loopReady.wait()
        loopReady.signal()
        return published.locked { $0! }
    }

    /// Waits until the thread's body has returned.
    func join() {
        finished.wait()
        finished.signal()
    }

    /// Runs `body` on a new thread and returns its result once the thread is done.
    static func run<T: Sendable>(name: String, _ body: @escaping @Sendable (RunLoop) -> T) -> T {
        let result = Mutex<T?>(nil)
        let thread = LoopThread(name: name) { loop in
            let value = body(loop)
            result.locked { $0 = value }
        }
        thread.join()
        return result.locked { $0! }
    }
}

extension RunLoop {
    /// Waits (polling every 0.1 ms) until this loop sleeps in the kernel inside a run, so that a
    /// `stop()` sent now reaches a run in progress (a stop while no run is in progress is dropped,
    /// as in CoreFoundation).
    func waitUntilAsleep() {
        while !(isWaiting && currentMode != nil) { usleep(100) }
    }
}

/// A flag shared between threads, like the seed's `static BOOL shouldKeepRunning`.
final class SharedFlag: Sendable {
    private let value: Atomic<Bool>

    /// Creates the flag with `initial`.
    init(_ initial: Bool) { value = Atomic(initial) }

    /// The current value.
    var isSet: Bool { value.load(ordering: .acquiring) }

    /// Sets the flag to `newValue`.
    func set(_ newValue: Bool) { value.store(newValue, ordering: .releasing) }
}

/// A counter shared between threads.
final class SharedCounter: Sendable {
    private let value = Atomic<Int>(0)

    /// Adds one and returns the new value.
    @discardableResult
    func increment() -> Int { value.add(1, ordering: .relaxed).newValue }

    /// The current value.
    var count: Int { value.load(ordering: .relaxed) }

    /// Sets the counter back to zero.
    func reset() { value.store(0, ordering: .relaxed) }
}

/// A value one thread publishes for others (a loop item made on a loop thread, say).
final class SharedSlot<Value: Sendable>: Sendable {
    private let value = Mutex<Value?>(nil)

    /// Creates an empty slot.
    init() {}

    /// The value, once published; nil before.
    var current: Value? { value.locked { $0 } }

    /// Publishes `newValue`.
    func set(_ newValue: Value) { value.locked { $0 = newValue } }
}
