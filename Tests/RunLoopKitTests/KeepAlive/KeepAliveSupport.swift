import CRunLoopKit
import Glibc
import Synchronization
import Testing

@testable import RunLoopKit

extension Robustness {
    /// The keep-alive suites. They count the process's threads and descriptors, and make and end
    /// a thousand threads with loops, so they run inside the serialized ``Robustness`` suite: not
    /// alongside the other suites that count descriptors exactly (thread exit, echo server).
    @Suite(.serialized) struct KeepAlive {}
}

/// The process's threads, from `/proc/self/task`.
enum ProcessThreads {
    /// Every thread of the process: kernel id → name (`/proc/self/task/<tid>/comm`).
    static func all() -> [Int32: String] {
        guard let directory = opendir("/proc/self/task") else { return [:] }
        defer { closedir(directory) }
        var threads: [Int32: String] = [:]
        while let entry = readdir(directory) {
            let entryName = withUnsafeBytes(of: entry.pointee.d_name) { raw in
                String(decoding: raw.prefix { $0 != 0 }, as: UTF8.self)
            }
            guard let tid = Int32(entryName) else { continue }
            threads[tid] = ProcessThreads.name(of: tid) ?? "?"
        }
        return threads
    }

    /// The name of thread `tid` of this process, or nil if it does not exist (any more).
    static func name(of tid: Int32) -> String? {
        let fd = open("/proc/self/task/\(tid)/comm", O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { return nil }
        defer { close(fd) }
        var buffer = [UInt8](repeating: 0, count: 64)
        let count = read(fd, &buffer, buffer.count)
        guard count > 0 else { return nil }
        return String(decoding: buffer[..<count], as: UTF8.self).trimmingSuffix("\n")
    }

    /// Whether thread `tid` of this process still exists.
    static func exists(_ tid: Int32) -> Bool { access("/proc/self/task/\(tid)", F_OK) == 0 }

    /// The threads whose name starts with `prefix`.
    static func named(_ prefix: String) -> [Int32: String] { all().filter { $0.value.hasPrefix(prefix) } }
}

extension String {
    fileprivate func trimmingSuffix(_ suffix: String) -> String {
        hasSuffix(suffix) ? String(dropLast(suffix.count)) : self
    }
}

/// A list shared by a task thread and a test.
final class Recorded<Element: Sendable>: Sendable {
    private let items = Mutex<[Element]>([])
    func append(_ item: Element) { items.locked { $0.append(item) } }
    var all: [Element] { items.locked { $0 } }
    var count: Int { items.locked { $0.count } }
}

/// A task's error, for delivery tests.
struct TaskFailure: Error, Equatable {
    let code: Int
}

extension RunLoop {
    /// Whether the loop's thread has exited and torn the loop down (its teardown closes the loop's
    /// kernel descriptors).
    var isTornDown: Bool { blocksClosed.load(ordering: .acquiring) }
}

extension RunLoop {
    /// Whether a perform source of this loop is in `mode` (a perform was queued there).
    func contains(anyPerformSourceIn mode: Mode) -> Bool {
        guard let queue = attachments.existing(ThreadPerformQueue.self), let source = queue.sourceForTesting(mode)
        else { return false }
        return contains(source, inMode: mode)
    }
}
