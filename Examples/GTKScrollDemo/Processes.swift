#if GTK
import Foundation
import Glibc
import Synchronization

/// A program of the X tools (Xvfb, xdotool, ImageMagick) started with `posix_spawn`, found on
/// `PATH`, waited for with a time limit and killed by its process id.
///
/// `@unchecked Sendable`: `pid` and `command` are constants; the exit status is in a `Mutex`.
public final class ToolProcess: @unchecked Sendable {
    /// The process id.
    public let pid: pid_t
    /// The command line, for messages.
    public let command: String
    private let status = Mutex<Int32?>(nil)
    private let logPath: String?

    /// Where a tool is on `PATH`, or nil.
    public static func find(_ name: String) -> String? {
        let path = ProcessInfo.processInfo.environment["PATH"] ?? "/usr/local/bin:/usr/bin:/bin"
        for directory in path.split(separator: ":") {
            let candidate = "\(directory)/\(name)"
            if access(candidate, X_OK) == 0 { return candidate }
        }
        return nil
    }

    /// Starts `arguments[0]` (looked up on `PATH`) with the process's environment. Its standard
    /// output and error go to a file of their own (read with ``output()``); `extraDescriptor`
    /// becomes descriptor 3 of the child.
    public init(_ arguments: [String], extraDescriptor: Int32? = nil) throws(ToolError) {
        command = arguments.joined(separator: " ")
        guard let executable = Self.find(arguments[0]) else { throw .notFound(arguments[0]) }
        let logPath = "\(NSTemporaryDirectory())/gtkdemo-\(arguments[0])-\(getpid())-\(UInt32.random(in: 0...UInt32.max)).log"
        self.logPath = logPath
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        posix_spawn_file_actions_addopen(&actions, 1, logPath, O_WRONLY | O_CREAT | O_TRUNC, 0o600)
        posix_spawn_file_actions_adddup2(&actions, 1, 2)
        posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0)
        if let extraDescriptor { posix_spawn_file_actions_adddup2(&actions, extraDescriptor, 3) }
        let argv: [UnsafeMutablePointer<CChar>?] = ([executable] + arguments.dropFirst()).map { strdup($0) } + [nil]
        defer { for argument in argv { free(argument) } }
        var pid: pid_t = 0
        let result = posix_spawn(&pid, executable, &actions, nil, argv, environ)
        guard result == 0 else { throw .spawnFailed(command: command, errno: result) }
        self.pid = pid
    }

    /// Whether it has exited (reaps it then).
    public var hasExited: Bool {
        if status.locked({ $0 }) != nil { return true }
        var raw: Int32 = 0
        let reaped = waitpid(pid, &raw, WNOHANG)
        guard reaped == pid else { return false }
        status.locked { $0 = raw }
        return true
    }

    /// Its exit code (a signal's number + 128 if one killed it), or nil while it runs.
    public var exitCode: Int32? {
        guard hasExited, let raw = status.locked({ $0 }) else { return nil }
        return raw & 0x7f == 0 ? (raw >> 8) & 0xff : 128 + (raw & 0x7f)
    }

    /// Waits until it exits, at most `timeout` (then kills it); returns its exit code.
    @discardableResult
    public func wait(timeout: Duration) -> Int32 {
        let deadline = ContinuousClock.now + timeout
        while !hasExited {
            if ContinuousClock.now >= deadline {
                kill()
                break
            }
            usleep(2_000)
        }
        return exitCode ?? 137
    }

    /// Stops it: SIGTERM, then SIGKILL if it is still there after two seconds. Idempotent.
    public func kill() {
        guard !hasExited else { return }
        Glibc.kill(pid, SIGTERM)
        let deadline = ContinuousClock.now + .seconds(2)
        while !hasExited && ContinuousClock.now < deadline { usleep(5_000) }
        if !hasExited {
            Glibc.kill(pid, SIGKILL)
            var raw: Int32 = 0
            while waitpid(pid, &raw, 0) < 0 && errno == EINTR {}
            status.locked { $0 = raw }
        }
    }

    /// What it printed (standard output and error), and removes the file.
    public func output() -> String {
        guard let logPath, let data = FileManager.default.contents(atPath: logPath) else { return "" }
        return String(decoding: data, as: UTF8.self)
    }

    deinit {
        if let logPath { unlink(logPath) }
    }
}

/// Why a tool could not be run.
public enum ToolError: Error, CustomStringConvertible, Sendable {
    case notFound(String)
    case spawnFailed(command: String, errno: Int32)
    case failed(command: String, code: Int32, output: String)
    case xvfbDidNotStart(String)

    public var description: String {
        switch self {
        case .notFound(let name):
            "\(name) is not installed (Debian: apt-get install xvfb xdotool imagemagick)"
        case .spawnFailed(let command, let errno):
            "cannot start \(command): \(String(cString: strerror(errno)))"
        case .failed(let command, let code, let output):
            "\(command) exited with \(code): \(output.trimmingCharacters(in: .whitespacesAndNewlines))"
        case .xvfbDidNotStart(let why):
            "Xvfb did not start: \(why)"
        }
    }
}

/// An X server of its own (Xvfb) on a free display number, for a GTK window that no one sees and
/// xdotool can drive without touching a real display.
///
/// `Xvfb -displayfd` picks the display number and writes it once it listens; `-terminate` ends it
/// when its last client leaves, so a killed program's Xvfb does not outlive it. ``stop()`` kills
/// it by its process id.
public final class VirtualDisplay: Sendable {
    /// The display's name, `:N`.
    public let name: String
    /// The Xvfb process.
    public let server: ToolProcess
    /// The screen's size.
    public let width: Int, height: Int

    /// Starts Xvfb with one `width`×`height`×24 screen; throws if it is missing or not ready
    /// within `timeout`.
    public init(width: Int = 640, height: Int = 480, timeout: Duration = .seconds(20)) throws(ToolError) {
        self.width = width
        self.height = height
        var ends: [Int32] = [0, 0]
        guard pipe(&ends) == 0 else { throw .xvfbDidNotStart("pipe: \(String(cString: strerror(errno)))") }
        _ = fcntl(ends[0], F_SETFD, FD_CLOEXEC)
        let server: ToolProcess
        do {
            server = try ToolProcess(
                ["Xvfb", "-displayfd", "3", "-screen", "0", "\(width)x\(height)x24", "-nolisten", "tcp", "-terminate"],
                extraDescriptor: ends[1])
        } catch {
            close(ends[0])
            close(ends[1])
            throw error
        }
        close(ends[1])
        defer { close(ends[0]) }
        var text = ""
        let deadline = ContinuousClock.now + timeout
        var byte: UInt8 = 0
        while !text.hasSuffix("\n") {
            let left = deadline - .now
            guard left > .zero else {
                server.kill()
                throw .xvfbDidNotStart("no display number within \(timeout): \(server.output())")
            }
            var poller = pollfd(fd: ends[0], events: Int16(POLLIN), revents: 0)
            let ready = poll(&poller, 1, Int32(left.components.seconds * 1000 + 1))
            if ready < 0 && errno == EINTR { continue }
            guard ready > 0 else { continue }
            let count = read(ends[0], &byte, 1)
            if count < 0 && errno == EINTR { continue }
            guard count == 1 else {
                server.wait(timeout: .seconds(2))
                throw .xvfbDidNotStart("it exited: \(server.output().trimmingCharacters(in: .whitespacesAndNewlines))")
            }
            text.append(Character(UnicodeScalar(byte)))
        }
        guard let number = Int(text.trimmingCharacters(in: .whitespacesAndNewlines)) else {
            server.kill()
            throw .xvfbDidNotStart("it wrote '\(text)' for its display number")
        }
        name = ":\(number)"
        self.server = server
    }

    /// Kills Xvfb by its process id and waits for it. Idempotent.
    public func stop() { server.kill() }
}
#endif
