import CAllocationCounter
import CRunLoopKit
import Glibc
import Logging
import Synchronization
import Testing

import RunLoopKit

// Dedicated threads for tests, bounded waits, a condition-variable monitor, stress scaling, the
// sanitizer in use, and the process-wide swift-log recorder: what every test target shares.
//
// Run loops block their thread, so tests run them on the pthreads made here, never on the Swift
// concurrency pool's threads. Every wait has a timeout: a test that would hang fails instead.

// MARK: - Threads

/// The tests' one thread host: a dedicated, joinable pthread that runs one body, typically a run
/// loop the test hands work to.
///
/// The body is whatever the thread should do, so the same type hosts a RunLoopKit loop, a
/// CoreFoundation loop (the CF side of the differential tests runs `CFRunLoopRunInMode` in its
/// body), or plain work (a sender, an intruder):
///
/// ```swift
/// let thread = TestThread(name: "worker") { work() }
/// #expect(thread.join(timeout: .seconds(5)))
/// ```
///
/// For a RunLoopKit loop the test talks to, ``hostingLoop(name:stackSize:sourceLocation:setup:run:)``
/// makes `RunLoop.current` on the new thread, runs `setup`, publishes the loop as ``loop`` and
/// then calls `run`; it returns once the loop exists, so the test can hand it work at once:
///
/// ```swift
/// guard let host = TestThread.hostingLoop(name: "loop", run: { loop in loop.run(mode: .default, for: .seconds(10)) })
/// else { return }
/// host.loop.perform { ... }
/// host.loop.stop()
/// #expect(host.join(timeout: .seconds(10)))
/// ```
///
/// ``join(timeout:)`` returns only after the thread has fully exited, thread-local destructors
/// (and so a ``RunLoop``'s teardown) included. Every wait is bounded.
public final class TestThread: @unchecked Sendable {
    // `@unchecked Sendable` is safe: every stored property is a `let`; `started`, `exited` and
    // `hosted` are monitors (mutex-guarded), `joined` is atomic, and `handle` is a plain value
    // written once in init and never changed.

    /// The thread's kernel id, known once it has started (see ``tid(timeout:)``).
    public let started = TestMonitor<Int32?>(nil)
    private let exited = TestMonitor(false)
    private let handle: pthread_t
    private let joined = Atomic<Bool>(false)
    /// The loop published by a thread made with ``hostingLoop(name:stackSize:sourceLocation:setup:run:)``.
    private let hosted: TestMonitor<RunLoop?>

    /// Starts `body` on a new thread named `name` (the kernel keeps 15 characters).
    public convenience init(name: String, stackSize: Int = 512 * 1024, _ body: @escaping @Sendable () -> Void) {
        self.init(name: name, stackSize: stackSize, hosted: TestMonitor(nil), body)
    }

    private init(
        name: String, stackSize: Int, hosted: TestMonitor<RunLoop?>, _ body: @escaping @Sendable () -> Void
    ) {
        self.hosted = hosted
        let box = ThreadStart(name: name, body: body, started: started)
        var attributes = pthread_attr_t()
        pthread_attr_init(&attributes)
        defer { pthread_attr_destroy(&attributes) }
        pthread_attr_setstacksize(&attributes, stackSize)
        var thread = pthread_t()
        let status = pthread_create(
            &thread, &attributes,
            { raw in
                let box = Unmanaged<ThreadStart>.fromOpaque(raw!).takeRetainedValue()
                _ = crlk_set_thread_name(box.name)
                box.started.update { $0 = crlk_gettid() }
                box.body()
                return nil
            }, Unmanaged.passRetained(box).toOpaque())
        precondition(status == 0, "pthread_create failed: \(status)")
        handle = thread
        // A helper joins the thread so that a bounded wait can observe its full exit.
        let exited = self.exited
        var joiner = pthread_t()
        let joinBox = JoinStart(target: thread, exited: exited)
        let joinStatus = pthread_create(
            &joiner, nil,
            { raw in
                let box = Unmanaged<JoinStart>.fromOpaque(raw!).takeRetainedValue()
                pthread_join(box.target, nil)
                box.exited.update { $0 = true }
                return nil
            }, Unmanaged.passRetained(joinBox).toOpaque())
        precondition(joinStatus == 0, "pthread_create failed: \(joinStatus)")
        pthread_detach(joiner)
    }

    /// Starts a thread that hosts a RunLoopKit loop: on the new thread, `setup` runs with
    /// `RunLoop.current`, then the loop is published as ``loop``, then `run` runs (typically the
    /// loop's runs) until it returns, and the thread exits. Waits (bounded, 10 s) until the loop is
    /// published; nil, with an issue recorded, if it is not.
    public static func hostingLoop(
        name: String,
        stackSize: Int = 512 * 1024,
        sourceLocation: SourceLocation = #_sourceLocation,
        setup: @escaping @Sendable (RunLoop) -> Void = { _ in },
        run: @escaping @Sendable (RunLoop) -> Void
    ) -> TestThread? {
        _ = TestLog.recorder
        let hosted = TestMonitor<RunLoop?>(nil)
        let thread = TestThread(name: name, stackSize: stackSize, hosted: hosted) {
            let loop = RunLoop.current
            setup(loop)
            hosted.update { $0 = loop }
            run(loop)
        }
        guard hosted.wait(timeout: .seconds(10), until: { $0 != nil }) else {
            Issue.record("loop thread '\(name)' did not start", sourceLocation: sourceLocation)
            return nil
        }
        return thread
    }

    /// The loop of a thread made with ``hostingLoop(name:stackSize:sourceLocation:setup:run:)``.
    public var loop: RunLoop {
        guard let loop = hosted.read({ $0 }) else {
            preconditionFailure("TestThread.loop: this thread was not started with hostingLoop")
        }
        return loop
    }

    /// The thread's kernel id; waits (bounded) for the thread to start.
    public func tid(timeout: Duration = .seconds(10)) -> Int32? {
        guard started.wait(timeout: timeout, until: { $0 != nil }) else { return nil }
        return started.read { $0 }
    }

    /// Waits until the thread has exited (destructors included). Returns false on timeout.
    @discardableResult
    public func join(timeout: Duration) -> Bool {
        exited.wait(timeout: timeout) { $0 }
    }

    /// Waits, without blocking a concurrency-pool thread, until the thread has exited.
    public func joinAsync(timeout: Duration) async -> Bool {
        await exited.waitAsync(timeout: timeout) { $0 }
    }

    /// Whether the thread has exited.
    public var hasExited: Bool { exited.read { $0 } }
}

private final class ThreadStart: @unchecked Sendable {
    let name: String
    let body: @Sendable () -> Void
    let started: TestMonitor<Int32?>
    init(name: String, body: @escaping @Sendable () -> Void, started: TestMonitor<Int32?>) {
        self.name = name
        self.body = body
        self.started = started
    }
}

private final class JoinStart: @unchecked Sendable {
    let target: pthread_t
    let exited: TestMonitor<Bool>
    init(target: pthread_t, exited: TestMonitor<Bool>) {
        self.target = target
        self.exited = exited
    }
}

/// Runs closures on fresh dedicated threads and waits for them with a timeout that fails the test.
public enum TestThreads {
    /// Runs `body` on a fresh thread and waits (without blocking the concurrency pool) until the
    /// thread has exited; returns the body's value, or nil (recording an issue) on timeout.
    public static func run<T: Sendable>(
        name: String = "rlk-test",
        timeout: Duration = .seconds(30),
        sourceLocation: SourceLocation = #_sourceLocation,
        _ body: @escaping @Sendable () -> T
    ) async -> T? {
        _ = TestLog.recorder
        let result = Mutex<T?>(nil)
        let thread = TestThread(name: name) {
            let value = body()
            result.locked { $0 = value }
        }
        guard await thread.joinAsync(timeout: timeout) else {
            Issue.record("thread '\(name)' did not finish within \(timeout)", sourceLocation: sourceLocation)
            return nil
        }
        return result.locked { $0 }
    }

    /// The same, blocking the calling thread (for use on dedicated threads only).
    public static func runBlocking<T: Sendable>(
        name: String = "rlk-test",
        timeout: Duration = .seconds(30),
        stackSize: Int = 512 * 1024,
        _ body: @escaping @Sendable () -> T
    ) -> T? {
        let result = Mutex<T?>(nil)
        let thread = TestThread(name: name, stackSize: stackSize) {
            let value = body()
            result.locked { $0 = value }
        }
        guard thread.join(timeout: timeout) else { return nil }
        return result.locked { $0 }
    }

    /// Whether the process runs under ThreadSanitizer or AddressSanitizer.
    public static var sanitized: Bool { Sanitizers.any }

    /// Whether the process runs under ThreadSanitizer.
    public static var underTSan: Bool { Sanitizers.thread }

    /// Scales iteration counts: `RUNLOOPKIT_STRESS_SCALE` if set, else 1 (0.1 under a sanitizer).
    public static let stressScale: Double = {
        if let raw = getenv("RUNLOOPKIT_STRESS_SCALE"), let value = Double(String(cString: raw)), value > 0 {
            return value
        }
        return sanitized ? 0.1 : 1
    }()

    /// `count` scaled by ``stressScale``, at least `minimum`.
    public static func scaled(_ count: Int, minimum: Int = 1) -> Int {
        max(minimum, Int((Double(count) * stressScale).rounded()))
    }

    /// How long time-boxed stress phases run: `RUNLOOPKIT_STRESS_SECONDS` if set, else `fallback`.
    public static func stressDuration(_ fallback: Duration) -> Duration {
        if let raw = getenv("RUNLOOPKIT_STRESS_SECONDS"), let value = Double(String(cString: raw)), value > 0 {
            return .milliseconds(Int64(value * 1000))
        }
        return fallback
    }

    /// The number of open file descriptors of the process.
    public static func openFileDescriptors() -> Int { Int(test_count_open_fds()) }
}

// MARK: - Waiting for a condition

/// Waits until `condition` holds: checks it, and between checks gives the CPU away for 100 µs
/// (the other thread, whose progress the condition watches, may need this core). Returns whether
/// it held; false only once `timeout` has passed, so a broken library fails the test instead of
/// hanging it. The default is generous for a loaded 2-core CI machine; pass a shorter timeout
/// only where the test means it as a bound.
///
/// For a condition another thread signals, wait on a ``TestMonitor`` or ``TestEvent`` instead:
/// this is for state nothing signals (`isWaiting`, `/proc`, a counter).
public func waitUntil(timeout: Duration = .seconds(10), _ condition: () -> Bool) -> Bool {
    let deadline = ContinuousClock.now + timeout
    while !condition() {
        if ContinuousClock.now >= deadline { return condition() }
        usleep(100)
    }
    return true
}

/// ``waitUntil(timeout:_:)`` for async tests: checks `condition` every millisecond without
/// blocking a thread of the concurrency pool (a blocked pool thread can starve the very task
/// whose progress the condition watches: the pool has one thread per core). The default timeout
/// is 10 s, 180 s under a sanitizer, where the synchronous suites can hold the pool's threads for
/// long stretches: a bound on a hang, not a timing assertion.
public func waitUntilAsync(timeout: Duration = Sanitizers.any ? .seconds(180) : .seconds(10), _ condition: @Sendable () -> Bool) async -> Bool {
    let deadline = ContinuousClock.now + timeout
    while !condition() {
        if ContinuousClock.now >= deadline { return condition() }
        try? await Task.sleep(for: .milliseconds(1))
    }
    return true
}

// MARK: - Monitor

/// A value guarded by a pthread mutex, with a condition variable (on `CLOCK_MONOTONIC`) for
/// bounded waits on a predicate. Every ``update(_:)`` wakes the waiters.
public final class TestMonitor<State>: @unchecked Sendable {
    private let mutex: UnsafeMutablePointer<pthread_mutex_t>
    private let condition: UnsafeMutablePointer<pthread_cond_t>
    private var state: State

    public init(_ initial: State) {
        state = initial
        mutex = .allocate(capacity: 1)
        mutex.initialize(to: pthread_mutex_t())
        pthread_mutex_init(mutex, nil)
        condition = .allocate(capacity: 1)
        condition.initialize(to: pthread_cond_t())
        var attributes = pthread_condattr_t()
        pthread_condattr_init(&attributes)
        pthread_condattr_setclock(&attributes, CLOCK_MONOTONIC)
        pthread_cond_init(condition, &attributes)
        pthread_condattr_destroy(&attributes)
    }

    deinit {
        pthread_cond_destroy(condition)
        pthread_mutex_destroy(mutex)
        condition.deallocate()
        mutex.deallocate()
    }

    /// Changes the state and wakes every waiter.
    @discardableResult
    public func update<R>(_ body: (inout State) throws -> R) rethrows -> R {
        pthread_mutex_lock(mutex)
        defer {
            pthread_cond_broadcast(condition)
            pthread_mutex_unlock(mutex)
        }
        return try body(&state)
    }

    /// Reads the state.
    public func read<R>(_ body: (State) throws -> R) rethrows -> R {
        pthread_mutex_lock(mutex)
        defer { pthread_mutex_unlock(mutex) }
        return try body(state)
    }

    /// Blocks until `predicate` holds or `timeout` passes; returns whether it holds.
    public func wait(timeout: Duration, until predicate: (State) -> Bool) -> Bool {
        var deadline = timespec()
        clock_gettime(CLOCK_MONOTONIC, &deadline)
        let (seconds, attoseconds) = max(timeout, .zero).components
        let nanoseconds = Int(deadline.tv_nsec) + Int(attoseconds / 1_000_000_000)
        deadline.tv_sec += Int(seconds) + nanoseconds / 1_000_000_000
        deadline.tv_nsec = nanoseconds % 1_000_000_000
        pthread_mutex_lock(mutex)
        defer { pthread_mutex_unlock(mutex) }
        while !predicate(state) {
            if pthread_cond_timedwait(condition, mutex, &deadline) == ETIMEDOUT { return predicate(state) }
        }
        return true
    }

    /// Waits on a helper thread, so that the caller's concurrency-pool thread is not blocked.
    public func waitAsync(timeout: Duration, until predicate: @escaping @Sendable (State) -> Bool) async -> Bool {
        await withCheckedContinuation { (continuation: CheckedContinuation<Bool, Never>) in
            let box = WaitStart { [self] in
                continuation.resume(returning: self.wait(timeout: timeout, until: predicate))
            }
            var thread = pthread_t()
            let status = pthread_create(
                &thread, nil,
                { raw in
                    Unmanaged<WaitStart>.fromOpaque(raw!).takeRetainedValue().body()
                    return nil
                }, Unmanaged.passRetained(box).toOpaque())
            precondition(status == 0, "pthread_create failed: \(status)")
            pthread_detach(thread)
        }
    }
}

private final class WaitStart: @unchecked Sendable {
    let body: () -> Void
    init(_ body: @escaping () -> Void) { self.body = body }
}

/// A one-shot event with bounded waits.
public typealias TestEvent = TestMonitor<Bool>

extension TestMonitor where State == Bool {
    public convenience init() { self.init(false) }

    /// Sets the event.
    public func fire() { update { $0 = true } }

    /// Waits until the event is set; false on timeout.
    public func wait(timeout: Duration) -> Bool { wait(timeout: timeout) { $0 } }
}

// MARK: - Recording logs

/// The process's swift-log backend for tests: records every message (and forwards nothing).
///
/// `LoggingSystem.bootstrap` may run only once per process, so every test that inspects
/// RunLoopKit's messages goes through ``TestLog/recorder``, whose initialiser bootstraps.
public enum TestLog {
    public struct Entry: Sendable {
        public let label: String
        public let level: Logger.Level
        public let message: String
    }

    /// The recorder; the first use bootstraps `LoggingSystem`.
    public static let recorder: LogRecorder = {
        let recorder = LogRecorder()
        LoggingSystem.bootstrap { label in RecordingLogHandler(label: label, recorder: recorder) }
        return recorder
    }()

    /// The recorded messages that contain every string of `needles`.
    public static func messages(containing needles: String...) -> [Entry] {
        recorder.entries.locked { entries in
            entries.filter { entry in needles.allSatisfy { entry.message.contains($0) } }
        }
    }
}

public final class LogRecorder: Sendable {
    /// The last 100,000 messages.
    public let entries = Mutex<[Entry]>([])
    public typealias Entry = TestLog.Entry

    func record(_ entry: Entry) {
        entries.locked { entries in
            if entries.count >= 100_000 { entries.removeFirst(entries.count / 2) }
            entries.append(entry)
        }
    }
}

struct RecordingLogHandler: LogHandler {
    let label: String
    let recorder: LogRecorder
    var metadata: Logger.Metadata = [:]
    var logLevel: Logger.Level = .trace

    subscript(metadataKey key: String) -> Logger.Metadata.Value? {
        get { metadata[key] }
        set { metadata[key] = newValue }
    }

    func log(event: LogEvent) {
        recorder.record(.init(label: label, level: event.level, message: "\(event.message)"))
    }
}
