import Glibc
import Testing

@testable import RunLoopKit

/// `RunLoop.main` serves `DispatchQueue.main` (and so `@MainActor` jobs) while it runs on the main
/// thread in a common mode, and not in other modes, as CFRunLoop does; checked against
/// CoreFoundation's main loop.
///
/// A test never has the main thread (Swift Testing runs tests on worker threads, and its runner
/// has called `dispatch_main()`, in exit-test children too), so each scenario runs in a child
/// process, `MainQueueProbe` (Tests/MainQueueProbe), whose top-level code owns its main thread:
/// once on CoreFoundation, once on RunLoopKit, in separate processes, and once with both in one
/// process. The probe's runs are bounded (5 s each) and end on the events they wait for; the
/// child has 60 s before it is killed and the test fails.
@Suite struct MainQueueTests {
    /// CoreFoundation's trace of `MainQueueProbe cf modes` (see `modes` in the probe): RunLoopKit
    /// must print the same.
    static let modesTrace = [
        "timer in Private fired",
        "run(Private, 5 s) -> finished",
        "A ran on the main thread",
        "main-actor task ran on the main thread",
        "run(default, 5 s, returnAfterSourceHandled) -> handledSource",
        "run(default, 50 ms), nothing queued -> timedOut",
        "B ran on the main thread",
        "run(Tracking, 5 s, returnAfterSourceHandled) -> handledSource",
        "C ran on the main thread",
        "  run(default, 100 ms) nested in C -> finished",
        "run(default, 5 s, returnAfterSourceHandled) -> handledSource",
        "D ran on the main thread",
        "run(default, 5 s, returnAfterSourceHandled) -> handledSource",
        "main-actor task resumed after Task.sleep",
        "asyncAfter block ran; stop()",
        "run() returned",
    ]

    /// On the main thread, work queued on `DispatchQueue.main` and a main-actor task wait through
    /// a run in a private mode and run in the first run in `.default`; a mode made common serves
    /// them too; an idle `.default` is not empty; a run nested in a main-queue block serves nothing
    /// (and, its mode otherwise empty, finishes at once); `run()` keeps running on main-queue work
    /// alone (a main actor's `Task.sleep`, `asyncAfter`) until stopped. CoreFoundation first, then
    /// RunLoopKit, each in its own process: same trace.
    @Test func mainQueueIsServedInCommonModesOnlyAsInCoreFoundation() throws {
        let cf = try #require(runMainQueueProbe("cf", "modes"))
        let rlk = try #require(runMainQueueProbe("rlk", "modes"))
        #expect(cf.lines == Self.modesTrace, "CoreFoundation's trace changed:\n\(cf.report)")
        #expect(rlk.lines == cf.lines, "RunLoopKit differs from CoreFoundation:\n\(rlk.report)\nCF:\n\(cf.report)")
    }

    /// Both loops in one process: CoreFoundation's main loop run inside a RunLoopKit timer, and
    /// RunLoopKit's inside a CoreFoundation timer. Whichever runs serves the main queue; every
    /// block runs once, on the main thread, and each run returns after serving it.
    @Test func coreFoundationAndRunLoopKitServeTheMainQueueInOneProcess() throws {
        let both = try #require(runMainQueueProbe("rlk", "coexist"))
        #expect(
            both.lines == [
                "RunLoop.main serves the main queue: true",
                "X ran on the main thread",
                "  CF run(default) nested in a RunLoopKit timer -> handledSource",
                "Y ran on the main thread",
                "RunLoopKit run(default) -> handledSource",
                "Z ran on the main thread",
                "  RunLoopKit run(default) nested in a CF timer -> handledSource",
                "W ran on the main thread",
                "CF run(default) -> handledSource",
            ], "\(both.report)")
    }

    /// Only the main loop serves the main queue, not while it runs the queue's blocks; the main
    /// queue's source does not show in the main loop's description.
    @Test func onlyTheMainLoopServesTheMainQueue() throws {
        let identity = try #require(runMainQueueProbe("rlk", "identity"))
        #expect(
            identity.lines == [
                "RunLoop.main serves the main queue: true",
                "RunLoop.current is RunLoop.main on the main thread: true",
                "a thread's loop serves the main queue: false",
                "inside a main-queue block, RunLoop.main serves the main queue: false",
                "run(default, 5 s, returnAfterSourceHandled) -> handledSource",
                "after it, RunLoop.main serves the main queue: true",
                "description mentions a descriptor source: false",
            ], "\(identity.report)")
    }

    /// In this process a thread's loop does not serve the main queue, and an empty default mode
    /// still finishes at once there.
    @Test func aThreadsLoopDoesNotServeTheMainQueue() {
        let outcome = TestMonitor<(Bool, RunLoop.RunResult)?>(nil)
        let thread = TestThread(name: "mq-worker") {
            let loop = RunLoop.current
            let serves = loop.servesMainDispatchQueue
            let result = loop.run(mode: .default, for: .seconds(5))
            outcome.update { $0 = (serves, result) }
        }
        #expect(thread.join(timeout: .seconds(30)))
        let result = outcome.update { $0 }
        #expect(result?.0 == false)
        #expect(result?.1 == .finished)
    }
}

// MARK: - Running the probe

/// What a probe run printed.
struct MainQueueProbeOutcome {
    /// The trace lines, without the final "done".
    let lines: [String]
    /// Everything, for failure messages.
    let report: String
}

/// Runs `MainQueueProbe <arguments>` (built next to the test binary by `swift build --build-tests`
/// and `swift test`), waits at most `timeout`, and returns its trace. Records an issue and returns
/// nil when the probe is missing, times out, fails, prints anything on standard error (a sanitizer
/// report, say), or does not finish its trace.
///
/// Plain `posix_spawn`, not Foundation's `Process`: under AddressSanitizer `Process` and its file
/// handles are reported as leaks (it keeps them alive), which would fail CI's leak-checked run.
/// The child inherits the environment (sanitizer options included); its output goes to temporary
/// files, never to pipes that a long report could fill.
func runMainQueueProbe(
    _ arguments: String..., timeout: Duration = .seconds(60), sourceLocation: SourceLocation = #_sourceLocation
) -> MainQueueProbeOutcome? {
    let command = "MainQueueProbe \(arguments.joined(separator: " "))"
    var path = [CChar](repeating: 0, count: Int(PATH_MAX) + 1)
    let length = readlink("/proc/self/exe", &path, Int(PATH_MAX))
    let testBinary = length > 0 ? String(decoding: path[0..<length].map { UInt8(bitPattern: $0) }, as: UTF8.self) : ""
    let probe = String(testBinary[..<(testBinary.lastIndex(of: "/") ?? testBinary.startIndex)]) + "/MainQueueProbe"
    guard access(probe, X_OK) == 0 else {
        Issue.record("MainQueueProbe not found at \(probe); build with --build-tests", sourceLocation: sourceLocation)
        return nil
    }
    guard let out = ProbeOutputFile(), let err = ProbeOutputFile() else {
        Issue.record("cannot create the probe's output files: \(String(cString: strerror(errno)))", sourceLocation: sourceLocation)
        return nil
    }
    var actions = posix_spawn_file_actions_t()
    posix_spawn_file_actions_init(&actions)
    defer { posix_spawn_file_actions_destroy(&actions) }
    posix_spawn_file_actions_adddup2(&actions, out.descriptor, 1)
    posix_spawn_file_actions_adddup2(&actions, err.descriptor, 2)
    let argv: [UnsafeMutablePointer<CChar>?] = ([probe] + arguments).map { strdup($0) } + [nil]
    defer { for argument in argv { free(argument) } }
    var pid: pid_t = 0
    let spawned = posix_spawn(&pid, probe, &actions, nil, argv, environ)
    guard spawned == 0 else {
        Issue.record("cannot launch \(probe): \(String(cString: strerror(spawned)))", sourceLocation: sourceLocation)
        return nil
    }
    // waitpid blocks, so a thread waits for the child and the test waits (bounded) for the thread.
    let status = TestMonitor<Int32?>(nil)
    let child = pid
    let waiter = TestThread(name: "mq-probe-wait") {
        var raw: Int32 = 0
        while waitpid(child, &raw, 0) < 0 && errno == EINTR {}
        status.update { $0 = raw }
    }
    let finished = status.wait(timeout: timeout) { $0 != nil }
    if !finished { kill(child, SIGKILL) }
    _ = waiter.join(timeout: .seconds(30))
    let stdout = out.contents(), stderr = err.contents()
    let report = "\(command): stdout:\n\(stdout)stderr:\n\(stderr)"
    guard finished, let raw = status.read({ $0 }) else {
        Issue.record("\(command) did not exit within \(timeout)\n\(report)", sourceLocation: sourceLocation)
        return nil
    }
    // WIFEXITED and WEXITSTATUS, which Swift does not import (they are macros).
    let exitedNormally = raw & 0x7f == 0
    let exitStatus = (raw >> 8) & 0xff
    var lines = stdout.split(separator: "\n", omittingEmptySubsequences: false).map(String.init)
    if lines.last == "" { lines.removeLast() }
    guard exitedNormally, exitStatus == 0, stderr.isEmpty, lines.last == "done" else {
        Issue.record("\(command) failed (wait status \(raw))\n\(report)", sourceLocation: sourceLocation)
        return nil
    }
    lines.removeLast()
    return MainQueueProbeOutcome(lines: lines, report: report)
}

/// A temporary file, already unlinked, that a child writes its output to.
final class ProbeOutputFile {
    let descriptor: Int32

    init?() {
        let directory = getenv("TMPDIR").map { String(cString: $0) } ?? "/tmp"
        var template = Array("\(directory)/mainqueue-probe-XXXXXX".utf8CString)
        descriptor = mkstemp(&template)
        guard descriptor >= 0 else { return nil }
        unlink(template)
        // Not inherited by other tests' children; dup2 gives the probe its own copy.
        _ = fcntl(descriptor, F_SETFD, FD_CLOEXEC)
    }

    deinit { close(descriptor) }

    /// Everything written so far, as UTF-8.
    func contents() -> String {
        var bytes: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 4096)
        var offset: off_t = 0
        while true {
            let count = pread(descriptor, &chunk, chunk.count, offset)
            if count < 0 && errno == EINTR { continue }
            guard count > 0 else { break }
            bytes.append(contentsOf: chunk[0..<count])
            offset += off_t(count)
        }
        return String(decoding: bytes, as: UTF8.self)
    }
}
