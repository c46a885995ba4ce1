import Glibc

/// The process's threads, from `/proc/self/task`. (RunLoopMonitor reads them too, for its captures;
/// the core's tests do not depend on the monitor.)
public enum ThreadTable {
    /// Every thread of the process: kernel id → name (`/proc/self/task/<tid>/comm`).
    public static func all() -> [Int32: String] {
        guard let directory = opendir("/proc/self/task") else { return [:] }
        defer { closedir(directory) }
        var threads: [Int32: String] = [:]
        while let entry = readdir(directory) {
            let entryName = withUnsafeBytes(of: entry.pointee.d_name) { raw in
                String(decoding: raw.prefix { $0 != 0 }, as: UTF8.self)
            }
            guard let tid = Int32(entryName) else { continue }
            threads[tid] = ThreadTable.name(of: tid) ?? "?"
        }
        return threads
    }

    /// The name of thread `tid` of this process, or nil if it does not exist (any more).
    public static func name(of tid: Int32) -> String? {
        let fd = open("/proc/self/task/\(tid)/comm", O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { return nil }
        defer { close(fd) }
        var buffer = [UInt8](repeating: 0, count: 64)
        let count = read(fd, &buffer, buffer.count)
        guard count > 0 else { return nil }
        return String(decoding: buffer[..<count], as: UTF8.self).trimmingSuffix("\n")
    }

    /// Whether thread `tid` of this process still exists.
    public static func exists(_ tid: Int32) -> Bool { access("/proc/self/task/\(tid)", F_OK) == 0 }

    /// The threads whose name starts with `prefix`.
    public static func named(_ prefix: String) -> [Int32: String] { all().filter { $0.value.hasPrefix(prefix) } }
}

extension String {
    fileprivate func trimmingSuffix(_ suffix: String) -> String {
        hasSuffix(suffix) ? String(dropLast(suffix.count)) : self
    }
}

