import CBenchSupport
import Clocks
import Dispatch
import RunLoopKit
import RunLoopTesting
import Synchronization

import class RunLoopKit.RunLoop

/// 23. The same debouncer, written the same way (plain `Task {}` inside), tested on virtual time
/// two ways, under load: RunLoopKit's `withVirtualTime` (the scope runs the tasks its thread starts
/// on the virtual loop) and swift-clocks' `TestClock` (its tasks on the global pool;
/// `advance(by:)` yields with `Task.megaYield`).
struct ClockDeterminismWorkload: Workload {
    var runs = 200
    var name: String { "clocktest" }
    var title: String { "A debouncer tested on virtual time, under load: RunLoopClock vs swift-clocks' TestClock" }
    var summary: String {
        "Calls at 0, 100, 200, 600, 700, 800 ms with a 300 ms debounce; the test advances 499 ms, 1 ms, 600 ms and reads what fired: [], [2], [2, 5] is right. \(runs) runs each while two other threads spin (a loaded CI machine): how many runs give the right answer. The debouncer and its driver start plain Task {} in both. RunLoopKit: withVirtualTime, which runs the tasks its thread starts on the virtual loop. swift-clocks 1.1.1: TestClock, the tasks on the global pool."
    }
    var metrics: [Metric] {
        [
            Metric("runloopkit_right", "RunLoopClock: runs right (of \(runs))", .count, .higherIsBetter),
            Metric("testclock_right", "TestClock: runs right (of \(runs))", .count, .higherIsBetter),
            Metric("runloopkit_ms_per_run", "RunLoopClock: ms per run", .count, .lowerIsBetter),
            Metric("testclock_ms_per_run", "TestClock: ms per run", .count, .lowerIsBetter),
        ]
    }
    var implementations: [Impl] { [.runLoopKit] }

    static let expected = "[] [2] [2, 5]"

    func runRunLoopKit() -> Measurement {
        let load = Spinners(count: 2)
        defer { load.stop() }
        let runs = self.runs
        let ours = BenchThread.run { () -> (Int, Double) in
            let start = cbench_now_ns()
            let right = (0..<runs).filter { _ in Self.onVirtualLoop() == Self.expected }.count
            return (right, Double(cbench_now_ns() - start) / 1e6 / Double(runs))
        }
        let theirs = Self.blocking { () async -> (Int, Double) in
            let start = cbench_now_ns()
            var right = 0
            for _ in 0..<runs where await Self.onTestClock() == Self.expected { right += 1 }
            return (right, Double(cbench_now_ns() - start) / 1e6 / Double(runs))
        }
        return [
            "runloopkit_right": Double(ours.0), "testclock_right": Double(theirs.0),
            "runloopkit_ms_per_run": ours.1, "testclock_ms_per_run": theirs.1,
        ]
    }

    func runCF() -> Measurement { fatalError("clocktest has no CF variant") }
    func targets(_ r: WorkloadResults) -> [TargetCheck] {
        let ours = r.median(.runLoopKit, "runloopkit_right") ?? 0
        return [TargetCheck(target: "RunLoopClock right in every run", met: ours == Double(runs), measured: "\(Int(ours))/\(runs)")]
    }

    /// Runs an async body from this synchronous harness and waits for it.
    static func blocking<T: Sendable>(_ body: @escaping @Sendable () async -> T) -> T {
        let done = DispatchSemaphore(value: 0)
        let result = Box<T?>(nil)
        Task {
            result.value = await body()
            done.signal()
        }
        done.wait()
        return result.value!
    }

    static func onVirtualLoop() -> String {
        (try? withVirtualTime { virtual -> String in
            let fired = Mutex<[Int]>([])
            // Written as for TestClock: plain unstructured tasks, no executor named; the scope
            // runs them on the virtual loop.
            let debouncer = Debouncer(clock: virtual.clock, preferring: nil) { value in fired.withLock { $0.append(value) } }
            let driver = Task { try await Self.drive(debouncer, clock: virtual.clock) }
            try virtual.advance(by: .milliseconds(499))
            let early = fired.withLock { $0 }
            try virtual.advance(by: .milliseconds(1))
            let atDeadline = fired.withLock { $0 }
            try virtual.advance(by: .milliseconds(600))
            driver.cancel()
            debouncer.cancel()
            try virtual.runUntilIdle()
            return "\(early) \(atDeadline) \(fired.withLock { $0 })"
        }) ?? "threw"
    }

    static func onTestClock() async -> String {
        let clock = TestClock()
        let fired = Mutex<[Int]>([])
        let debouncer = Debouncer(clock: clock, preferring: nil) { value in fired.withLock { $0.append(value) } }
        let driver = Task { try await Self.drive(debouncer, clock: clock) }
        await clock.advance(by: .milliseconds(499))
        let early = fired.withLock { $0 }
        await clock.advance(by: .milliseconds(1))
        let atDeadline = fired.withLock { $0 }
        await clock.advance(by: .milliseconds(600))
        driver.cancel()
        debouncer.cancel()
        return "\(early) \(atDeadline) \(fired.withLock { $0 })"
    }

    static func drive<C: Clock<Duration>>(_ debouncer: Debouncer<C>, clock: C) async throws {
        for value in 0..<3 {
            debouncer.call(value)
            try await clock.sleep(for: .milliseconds(100))
        }
        try await clock.sleep(for: .milliseconds(300))
        for value in 3..<6 {
            debouncer.call(value)
            try await clock.sleep(for: .milliseconds(100))
        }
    }
}

/// Each call replaces the pending one, which fires `300 ms` after the last call.
final class Debouncer<C: Clock<Duration>>: Sendable {
    let clock: C
    let loop: RunLoop?
    let action: @Sendable (Int) -> Void
    private let pending = Mutex<Task<Void, Never>?>(nil)

    init(clock: C, preferring loop: RunLoop?, action: @escaping @Sendable (Int) -> Void) {
        (self.clock, self.loop, self.action) = (clock, loop, action)
    }

    func call(_ value: Int) {
        let (clock, action) = (clock, action)
        let body: @Sendable () async -> Void = {
            do {
                try await clock.sleep(for: .milliseconds(300))
                action(value)
            } catch {}
        }
        let task = loop.map { Task(executorPreference: $0, operation: body) } ?? Task(operation: body)
        pending.withLock { $0?.cancel(); $0 = task }
    }

    func cancel() { pending.withLock { $0?.cancel() } }
}

/// Threads that spin until stopped: a loaded machine.
final class Spinners: Sendable {
    private let threads: [BenchThread]

    init(count: Int) {
        let state = SpinState()
        self.state = state
        threads = (0..<count).map { _ in BenchThread { while state.running.load(ordering: .relaxed) {} } }
    }

    private let state: SpinState

    private final class SpinState: Sendable { let running = Atomic<Bool>(true) }

    /// Stops the spinning threads and joins them.
    func stop() {
        state.running.store(false, ordering: .relaxed)
        for thread in threads { thread.join() }
    }
}
