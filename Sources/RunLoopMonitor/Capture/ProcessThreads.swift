import CRunLoopMonitor
import Glibc

/// The process's threads as Linux shows them: ids (`/proc/self/task`), names (`comm`), per-thread
/// CPU clocks, blocked signals and the system call a thread is blocked in.
package enum ProcessThreads {
    /// The kernel ids of the process's threads now.
    package static func ids() -> [Int32] {
        guard let directory = opendir("/proc/self/task") else { return [] }
        defer { closedir(directory) }
        var ids: [Int32] = []
        while let entry = readdir(directory) {
            let id = withUnsafeBytes(of: entry.pointee.d_name) { bytes -> Int32? in
                let name = String(decoding: bytes.prefix { $0 != 0 }, as: UTF8.self)
                return Int32(name)
            }
            if let id { ids.append(id) }
        }
        return ids
    }

    /// The calling thread's kernel id.
    package static var ownID: Int32 { crlm_gettid() }

    /// The thread's name (`/proc/self/task/<tid>/comm`), nil when the thread is gone.
    package static func name(of threadID: Int32) -> String? {
        guard let text = read("/proc/self/task/\(threadID)/comm") else { return nil }
        return text.hasSuffix("\n") ? String(text.dropLast()) : text
    }

    /// CPU time the thread has used (its thread CPU clock, nanosecond precision), nil when gone.
    package static func cpuTime(of threadID: Int32) -> Duration? {
        let ns = crlm_thread_cpu_ns(threadID)
        return ns < 0 ? nil : .nanoseconds(ns)
    }

    /// Whether the thread exists in this process.
    package static func exists(_ threadID: Int32) -> Bool {
        access("/proc/self/task/\(threadID)", F_OK) == 0
    }

    /// Whether the thread blocks `signal` now (`SigBlk` of its status), nil when unknown.
    package static func blocks(signal: Int32, threadID: Int32) -> Bool? {
        guard let status = read("/proc/self/task/\(threadID)/status") else { return nil }
        for line in status.split(separator: "\n") where line.hasPrefix("SigBlk:") {
            guard let mask = UInt64(line.dropFirst(7).trimmingPrefix(while: { $0 == " " || $0 == "\t" }), radix: 16)
            else { return nil }
            return mask & (1 << UInt64(signal - 1)) != 0
        }
        return nil
    }

    /// What `/proc/self/task/<tid>/syscall` shows: `running` while the thread runs, else the
    /// system call it is blocked in with its arguments, stack pointer and program counter. Two
    /// equal readings with no CPU used between them mean the thread did not move.
    package static func blockedCall(of threadID: Int32) -> String? {
        read("/proc/self/task/\(threadID)/syscall")
    }

    /// Where the kernel has a thread now.
    package enum KernelState: Equatable {
        /// The thread does not exist.
        case gone
        /// It runs (or is ready to).
        case running
        /// It is blocked in system call `number` (-1: parked outside one), whose first argument
        /// is `firstArgument`.
        case blocked(number: Int, firstArgument: UInt64)
        /// The kernel's file could not be read (no descriptor left; no such file here).
        case unknown
    }

    /// Where the kernel has thread `threadID` now (`/proc/self/task/<tid>/syscall`).
    package static func kernelState(of threadID: Int32) -> KernelState {
        var argument: UInt64 = 0
        let value = crlm_blocked_syscall(threadID, &argument)
        if value == Int(CRLM_THREAD_GONE) { return .gone }
        if value == Int(CRLM_THREAD_RUNNING) { return .running }
        if value == Int(CRLM_THREAD_UNKNOWN) { return .unknown }
        return .blocked(number: value, firstArgument: argument)
    }

    /// A small text file's contents (procfs files report size 0, so read until end of file).
    package static func read(_ path: String) -> String? {
        let fd = open(path, O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { return nil }
        defer { close(fd) }
        var bytes: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 1024)
        while true {
            let count = chunk.withUnsafeMutableBytes { Glibc.read(fd, $0.baseAddress, $0.count) }
            if count < 0 {
                if errno == EINTR { continue }
                return nil
            }
            if count == 0 { break }
            bytes.append(contentsOf: chunk[0..<count])
            if bytes.count > 1 << 20 { break }
        }
        return String(decoding: bytes, as: UTF8.self)
    }
}
