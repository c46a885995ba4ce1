import SharedTestSupport
import CRunLoopMonitor
import Testing
import Dispatch
import Foundation
import Glibc
import RunLoopKit
import RunLoopMonitor
import Synchronization

func currentThreadID() -> Int32 { crlm_gettid() }

/// Keeps the CPU busy until `deadline`: the function reports must name.
@inline(never)
func monitorTestCrunch(until deadline: ContinuousClock.Instant) -> Double {
    var x = 1.0
    while ContinuousClock.now < deadline {
        for i in 0..<1000 { x = x * 1.000001 + Double(i & 7) }
    }
    return x
}

/// Blocks in the kernel until `deadline` (nanosleep; an EINTR goes round again).
@inline(never)
func monitorTestBlockingWait(until deadline: ContinuousClock.Instant) {
    while ContinuousClock.now < deadline {
        var request = timespec(tv_sec: 0, tv_nsec: 10_000_000)
        nanosleep(&request, nil)
    }
}

/// Events a monitor handed to its handler, and a way to wait for the next ones.
final class EventLog<Event: Sendable>: Sendable {
    private let events = Mutex<[Event]>([])
    private let arrived = DispatchSemaphore(value: 0)

    func append(_ event: Event) {
        events.locked { $0.append(event) }
        arrived.signal()
    }

    var all: [Event] { events.locked { $0 } }

    /// Waits until `count` events arrived or `timeout` passed; returns them.
    func wait(for count: Int, timeout: Duration = .seconds(10)) -> [Event] {
        let deadline = ContinuousClock.now + timeout
        while all.count < count {
            let left = ContinuousClock.now.duration(to: deadline)
            guard left > .zero else { break }
            _ = arrived.wait(timeout: .now() + .milliseconds(Int(left.components.seconds * 1000 + left.components.attoseconds / 1_000_000_000_000_000)))
        }
        return all
    }
}

/// A thread that runs `body` (a pthread with a name), joined by ``join()``.
final class NamedThread: @unchecked Sendable {
    // @unchecked: `thread` is written once in init (before any other thread sees the object) and
    // read by join() only; `id` is an atomic.
    private var thread = pthread_t()
    private let idCell = IDCell()
    var threadID: Int32 { idCell.value.load(ordering: .acquiring) }

    private final class IDCell: Sendable { let value = Atomic<Int32>(0) }
    private final class Body: Sendable {
        let name: String
        let run: @Sendable () -> Void
        let cell: IDCell
        init(_ name: String, _ cell: IDCell, _ run: @escaping @Sendable () -> Void) { self.name = name; self.cell = cell; self.run = run }
    }

    init(name: String, _ body: @escaping @Sendable () -> Void) {
        let box = Unmanaged.passRetained(Body(name, idCell, body)).toOpaque()
        pthread_create(&thread, nil, { raw in
            let body = Unmanaged<Body>.fromOpaque(raw!).takeRetainedValue()
            crlm_set_thread_name(body.name)
            // Threads made from the test runner's (libdispatch) threads start with every signal
            // blocked; a thread that wants to be captured says so.
            ThreadStack.prepareCurrentThread()
            body.cell.value.store(crlm_gettid(), ordering: .releasing)
            body.run()
            return nil
        }, box)
        while threadID == 0 { sched_yield() }
    }

    func join() { pthread_join(thread, nil) }
}

/// The names in a stack sample's frames.
func symbols(_ frames: [StackFrame]) -> [String] { frames.compactMap(\.symbol) }

func milliseconds(_ duration: Duration) -> Double { Double(duration.components.seconds) * 1000 + Double(duration.components.attoseconds) / 1e15 }

/// Runs MonitorProbe with `arguments` (see SharedTestSupport's `runProbe`).
func runMonitorProbe(_ arguments: [String], timeout: Duration = .seconds(60)) throws -> (status: Int32, stdout: String, stderr: String) {
    try runProbe("MonitorProbe", arguments, timeout: timeout)
}

/// Every RunLoopMonitor suite, one test at a time: captures are serialized process-wide (a stress
/// test's 10,000 captures would starve a monitor's sampling), and the timing bounds assume the
/// monitor's thread gets a core.
@Suite(.serialized) enum RunLoopMonitorSuites {}

/// Whether the tests run under ThreadSanitizer or AddressSanitizer.
let sanitized: Bool = dlsym(nil, "__tsan_init") != nil || dlsym(nil, "__asan_init") != nil
/// Whether the tests run under ThreadSanitizer.
let underThreadSanitizer: Bool = dlsym(nil, "__tsan_init") != nil

/// Whether the tests run under AddressSanitizer.
let underASan: Bool = dlsym(nil, "__asan_init") != nil

/// Returns once `calls` has moved on from its value now (at most 5 s): the thread that counts
/// has run since. Samples of a spinning thread taken this way land at independent instructions;
/// taken back to back while a loaded machine has the spinner descheduled, they all see the one
/// instruction it was stopped at (seen: 10 identical samples of 50).
func awaitProgress(_ calls: borrowing Atomic<Int>) {
    let seen = calls.load(ordering: .acquiring)
    let giveUp = ContinuousClock.now + .seconds(5)
    while calls.load(ordering: .acquiring) == seen && ContinuousClock.now < giveUp { usleep(200) }
}
