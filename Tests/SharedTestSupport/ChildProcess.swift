import Glibc
import Testing

// Launching the test-support executables (`MainQueueProbe`, `HostileProbe`, `MonitorProbe`,
// `SchedulingProbe`) that run a scenario
// in a child process: one that needs a process's main thread, or changes process-wide state, or
// may hang or trap on a broken library.

/// How a child process ended.
public enum ChildEnding: Sendable, Equatable, CustomStringConvertible {
    case exited(Int32)
    case signalled(Int32)
    /// It ran out of time and was killed.
    case timedOut

    public var description: String {
        switch self {
        case .exited(let code): "exited with status \(code)"
        case .signalled(let signal): "killed by signal \(signal)"
        case .timedOut: "timed out (killed)"
        }
    }
}

/// What a child printed and how it ended.
public struct ChildOutput: Sendable {
    public let command: String
    public let stdout: String
    public let stderr: String
    public let ending: ChildEnding
}

/// Runs the test-support executable `name` (built next to the test binary by `swift build
/// --build-tests` and `swift test`) with `arguments`, waits at most `timeout`, kills it after
/// that, and returns what it printed and how it ended. Returns nil (recording an issue) only when
/// it cannot be launched.
///
/// Plain `posix_spawn`, not Foundation's `Process`: under AddressSanitizer `Process` and its file
/// handles are reported as leaks (it keeps them alive), which would fail CI's leak-checked run.
/// Output goes to unlinked temporary files, never to pipes that a long report could fill. The
/// child inherits the environment, except that with `crashQuietly` Swift's crash backtracer is
/// off (a child that traps dies at once with its message instead of spending seconds
/// symbolicating) and AddressSanitizer's leak check is off (a child that ends with `exit()` while
/// its scenario's threads still hold objects is not a leak of the library), and SIGALRM is
/// deliverable in the child whatever the test thread blocks (a probe ends itself with `alarm()`).
public func runTestExecutable(
    _ name: String, _ arguments: [String], timeout: Duration, crashQuietly: Bool,
    sourceLocation: SourceLocation
) -> ChildOutput? {
    let command = "\(name) \(arguments.joined(separator: " "))"
    var path = [CChar](repeating: 0, count: Int(PATH_MAX) + 1)
    let length = readlink("/proc/self/exe", &path, Int(PATH_MAX))
    let testBinary = length > 0 ? String(decoding: path[0..<length].map { UInt8(bitPattern: $0) }, as: UTF8.self) : ""
    let executable = String(testBinary[..<(testBinary.lastIndex(of: "/") ?? testBinary.startIndex)]) + "/" + name
    guard access(executable, X_OK) == 0 else {
        Issue.record("\(name) not found at \(executable); build with --build-tests", sourceLocation: sourceLocation)
        return nil
    }
    guard let out = ChildOutputFile(), let err = ChildOutputFile() else {
        Issue.record(
            "cannot create \(name)'s output files: \(String(cString: strerror(errno)))", sourceLocation: sourceLocation)
        return nil
    }
    var actions = posix_spawn_file_actions_t()
    posix_spawn_file_actions_init(&actions)
    defer { posix_spawn_file_actions_destroy(&actions) }
    posix_spawn_file_actions_adddup2(&actions, out.descriptor, 1)
    posix_spawn_file_actions_adddup2(&actions, err.descriptor, 2)
    let argv: [UnsafeMutablePointer<CChar>?] = ([executable] + arguments).map { strdup($0) } + [nil]
    defer { for argument in argv { free(argument) } }
    var environment: [UnsafeMutablePointer<CChar>?] = []
    var asanOptions = "detect_leaks=0"
    var index = 0
    while let entry = environ[index] {
        let text = String(cString: entry)
        if crashQuietly && text.hasPrefix("ASAN_OPTIONS=") {
            asanOptions = String(text.dropFirst("ASAN_OPTIONS=".count)) + ":detect_leaks=0"
        } else if !(crashQuietly && text.hasPrefix("SWIFT_BACKTRACE=")) {
            environment.append(strdup(entry))
        }
        index += 1
    }
    if crashQuietly {
        environment.append(strdup("SWIFT_BACKTRACE=enable=no"))
        environment.append(strdup("ASAN_OPTIONS=" + asanOptions))
    }
    environment.append(nil)
    defer { for entry in environment { free(entry) } }
    var attributes = posix_spawnattr_t()
    posix_spawnattr_init(&attributes)
    defer { posix_spawnattr_destroy(&attributes) }
    if crashQuietly {
        var noSignals = sigset_t()
        sigemptyset(&noSignals)
        posix_spawnattr_setsigmask(&attributes, &noSignals)
        var alarmOnly = sigset_t()
        sigemptyset(&alarmOnly)
        sigaddset(&alarmOnly, SIGALRM)
        posix_spawnattr_setsigdefault(&attributes, &alarmOnly)
        posix_spawnattr_setflags(&attributes, Int16(POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF))
    }
    var pid: pid_t = 0
    let spawned = posix_spawn(&pid, executable, &actions, &attributes, argv, environment)
    guard spawned == 0 else {
        Issue.record("cannot launch \(executable): \(String(cString: strerror(spawned)))", sourceLocation: sourceLocation)
        return nil
    }
    // waitpid blocks, so a thread waits for the child and the test waits (bounded) for the thread.
    let status = TestMonitor<Int32?>(nil)
    let child = pid
    let waiter = TestThread(name: "child-wait") {
        var raw: Int32 = 0
        while waitpid(child, &raw, 0) < 0 && errno == EINTR {}
        status.update { $0 = raw }
    }
    let finished = status.wait(timeout: timeout) { $0 != nil }
    if !finished { kill(child, SIGKILL) }
    _ = waiter.join(timeout: .seconds(30))
    let ending: ChildEnding
    if !finished {
        ending = .timedOut
    } else {
        // WIFEXITED / WEXITSTATUS / WTERMSIG, which Swift does not import (they are macros).
        let raw = status.read { $0 } ?? 0
        ending = raw & 0x7f == 0 ? .exited((raw >> 8) & 0xff) : .signalled(raw & 0x7f)
    }
    return ChildOutput(command: command, stdout: out.contents(), stderr: err.contents(), ending: ending)
}

/// A temporary file, already unlinked, that a child writes its output to.
final class ChildOutputFile {
    let descriptor: Int32

    init?() {
        let directory = getenv("TMPDIR").map { String(cString: $0) } ?? "/tmp"
        var template = Array("\(directory)/child-output-XXXXXX".utf8CString)
        descriptor = mkstemp(&template)
        guard descriptor >= 0 else { return nil }
        unlink(template)
        // Not inherited by other tests' children; dup2 gives the child its own copy.
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
