import CRunLoopKit
import Glibc
import SharedTestSupport
import Synchronization
import Testing

@testable import RunLoopKit

// Support for the Hostile suites: regression tests for the findings of a hostile review (timers
// whose handlers reschedule them, dates far in the past or not finite, descriptors closed behind
// a source's back or exhausted, re-entry during thread-exit teardown, fork, release of captured
// state, dead loops, and a few quadratic paths).
//
// Scenarios that change process-wide state (the descriptor limit, fork), count the process's
// descriptors exactly, or may hang or trap on a broken library run in `HostileProbe`
// (Tests/HostileProbe/main.swift), a child process launched here with a timeout. The others run
// in this process on dedicated threads, every wait bounded.

// MARK: - The probe

/// What a `HostileProbe` run printed and how it ended.
struct HostileProbeResult: Sendable {
    typealias Ending = ChildEnding

    let command: String
    let stdout: String
    let stderr: String
    let ending: Ending

    /// Standard output's lines.
    var lines: [String] {
        var lines = stdout.split(separator: "\n", omittingEmptySubsequences: false).map(String.init)
        if lines.last == "" { lines.removeLast() }
        return lines
    }

    /// Whether the scenario ran to its end (printed `done` and exited 0).
    var completed: Bool { ending == .exited(0) && lines.last == "done" }

    /// The value of the first `key: value` line for `key`.
    func value(_ key: String) -> String? {
        let prefix = key + ": "
        return lines.first { $0.hasPrefix(prefix) }.map { String($0.dropFirst(prefix.count)) }
    }

    func bool(_ key: String) -> Bool? { value(key).flatMap(Bool.init) }

    func int(_ key: String) -> Int? {
        // "12 of 400" reads as 12.
        value(key).flatMap { Int($0.split(separator: " ").first ?? "") }
    }

    func double(_ key: String) -> Double? { value(key).flatMap(Double.init) }

    /// Everything, for failure messages.
    var report: String {
        "\(command): \(ending)\nstdout:\n\(stdout)stderr (first 3000 characters):\n\(stderr.prefix(3000))"
    }
}

/// Runs `HostileProbe <arguments>` (built next to the test binary by `swift build --build-tests`),
/// waits at most `timeout`, kills it after that, and returns what it printed and how it ended.
/// Returns nil (recording an issue) only when the probe cannot be launched.
///
/// Through `runTestExecutable` (Support/ChildProcess.swift), crashing quietly: a probe that traps
/// (the expected failure of several scenarios on a broken library) dies at once with its message.
/// A probe's stderr may hold the library's log messages, so it is not required to be empty.
func runHostileProbe(
    _ arguments: String..., timeout: Duration = .seconds(60), sourceLocation: SourceLocation = #_sourceLocation
) -> HostileProbeResult? {
    guard
        let child = runTestExecutable(
            "HostileProbe", arguments, timeout: timeout, crashQuietly: true, sourceLocation: sourceLocation)
    else { return nil }
    return HostileProbeResult(command: child.command, stdout: child.stdout, stderr: child.stderr, ending: child.ending)
}

// MARK: - In-process helpers

/// CPU time the calling thread has used, in milliseconds.
func threadCPUMilliseconds() -> Double {
    var time = timespec()
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &time)
    return Double(time.tv_sec) * 1000 + Double(time.tv_nsec) / 1e6
}

/// Milliseconds from `start` to now.
func millisecondsSince(_ start: ContinuousClock.Instant) -> Double {
    let (seconds, attoseconds) = (ContinuousClock.now - start).components
    return Double(seconds) * 1000 + Double(attoseconds) / 1e15
}

/// A weak reference the test holds to an object it no longer owns.
final class WeakBox<Object: AnyObject>: @unchecked Sendable {
    // `@unchecked Sendable` is safe: the only stored property is a `weak let`, which the runtime
    // reads and clears atomically (weak references are thread-safe in Swift), and it is never
    // written after init.
    weak let object: Object?
    init(_ object: Object) { self.object = object }
}

/// An object a handler captures, counting the live instances of its tally.
final class Captured: Sendable {
    let tally: LiveTally
    init(_ tally: LiveTally) {
        self.tally = tally
        tally.live.add(1, ordering: .relaxed)
    }
    deinit { tally.live.subtract(1, ordering: .relaxed) }
}

final class LiveTally: Sendable {
    let live = Atomic<Int>(0)
    var count: Int { live.load(ordering: .relaxed) }
}

/// A new descriptor number at or above `minimum` naming the same file as `fd` (which stays open),
/// close-on-exec.
///
/// Descriptor numbers are shared by every test in the process, and the Hostile descriptor tests
/// close numbers behind a source's back and reuse them: they take them from 600 up, a range
/// nothing else uses (numbers are handed out lowest first; the Ports suites take theirs from 900).
func duplicate(_ fd: Int32, atLeast minimum: Int32) -> Int32 {
    let high = fcntl(fd, F_DUPFD_CLOEXEC, minimum)
    precondition(high >= minimum, "F_DUPFD_CLOEXEC failed: errno \(errno)")
    return high
}

/// A pipe whose read end is numbered 600 or above: (read end, write end).
func hostilePipe() -> (read: Int32, write: Int32) {
    var fds: [Int32] = [-1, -1]
    precondition(pipe(&fds) == 0, "pipe failed: errno \(errno)")
    _ = fcntl(fds[1], F_SETFD, FD_CLOEXEC)
    let high = duplicate(fds[0], atLeast: 600)
    close(fds[0])
    return (high, fds[1])
}

/// Writes `text` to `fd`.
func writeAll(_ fd: Int32, _ text: String) {
    let bytes = Array(text.utf8)
    let written = write(fd, bytes, bytes.count)
    precondition(written == bytes.count, "write failed: errno \(errno)")
}

/// Reads what `fd` has without blocking (it must be non-blocking or known to have data).
func readAvailable(_ fd: Int32) -> [UInt8] {
    var buffer = [UInt8](repeating: 0, count: 256)
    let count = read(fd, &buffer, buffer.count)
    return count > 0 ? Array(buffer[0..<count]) : []
}

/// `0x…`, as the library's descriptions print an object's address.
func hexAddress(_ object: AnyObject) -> String {
    "0x" + String(UInt(bitPattern: ObjectIdentifier(object)), radix: 16)
}
