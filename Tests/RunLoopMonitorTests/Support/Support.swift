import CRunLoopMonitor
import Dispatch
import Foundation
import Glibc
import RunLoopKit
import RunLoopMonitor
import SharedTestSupport
import Synchronization
import Testing

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
    private let events = TestMonitor<[Event]>([])

    func append(_ event: Event) { events.update { $0.append(event) } }

    var all: [Event] { events.read { $0 } }

    /// Waits until `count` events arrived or `timeout` passed (10 s; 180 s under a sanitizer, where
    /// the other suites can starve the monitor's thread: a bound on a hang); returns them.
    func wait(for count: Int, timeout: Duration = Sanitizers.any ? .seconds(180) : .seconds(10)) -> [Event] {
        _ = events.wait(timeout: timeout) { $0.count >= count }
        return all
    }
}

/// A named thread that runs `body` and can be captured (SharedTestSupport's ``TestThread``, with
/// the capture signal unblocked first: threads made from the test runner's libdispatch threads
/// start with every signal blocked). Joined by ``join()``.
final class NamedThread: Sendable {
    private let thread: TestThread
    /// The thread's kernel id (known once the initializer returns).
    let threadID: Int32

    init(name: String, _ body: @escaping @Sendable () -> Void) {
        thread = TestThread(name: name) {
            ThreadStack.prepareCurrentThread()
            body()
        }
        threadID = thread.tid() ?? 0
    }

    /// Waits until the thread has exited (at most two minutes, then records an issue).
    func join() {
        if !thread.join(timeout: .seconds(120)) { Issue.record("thread \(threadID) did not end") }
    }
}

/// The names in a stack sample's frames.
func symbols(_ frames: [StackFrame]) -> [String] { frames.compactMap(\.symbol) }

func milliseconds(_ duration: Duration) -> Double { Double(duration.components.seconds) * 1000 + Double(duration.components.attoseconds) / 1e15 }

/// Runs MonitorProbe with `arguments` (see SharedTestSupport's `runProbe`).
func runMonitorProbe(_ arguments: [String], timeout: Duration = .seconds(60)) throws -> (status: Int32, stdout: String, stderr: String) {
    try runProbe("MonitorProbe", arguments, timeout: timeout)
}

/// Whether the tests run under ThreadSanitizer or AddressSanitizer.
var sanitized: Bool { Sanitizers.any }
/// Whether the tests run under ThreadSanitizer.
var underThreadSanitizer: Bool { Sanitizers.thread }
/// Whether the tests run under AddressSanitizer.
var underASan: Bool { Sanitizers.address }

/// Returns once `calls` has moved on from its value now (at most 5 s): the thread that counts
/// has run since. Samples of a spinning thread taken this way land at independent instructions;
/// taken back to back while a loaded machine has the spinner descheduled, they all see the one
/// instruction it was stopped at (seen: 10 identical samples of 50).
func awaitProgress(_ calls: borrowing Atomic<Int>) {
    let seen = calls.load(ordering: .acquiring)
    _ = waitUntil(timeout: .seconds(5)) { calls.load(ordering: .acquiring) != seen }
}
