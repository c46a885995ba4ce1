import Glibc

// The process's open descriptors, for tests that check nothing leaks (thread exit, the echo
// server under misuse).

/// What each open descriptor of this process refers to (`/proc/self/fd/N` link targets).
public func openDescriptorTargets() -> [String] {
    guard let directory = opendir("/proc/self/fd") else { return [] }
    defer { closedir(directory) }
    var targets: [String] = []
    while let entry = readdir(directory) {
        let name = withUnsafeBytes(of: entry.pointee.d_name) { raw in
            String(decoding: raw.prefix { $0 != 0 }, as: UTF8.self)
        }
        if name.hasPrefix(".") { continue }
        var buffer = [CChar](repeating: 0, count: 256)
        let count = readlink("/proc/self/fd/\(name)", &buffer, buffer.count - 1)
        targets.append(
            count > 0 ? String(decoding: buffer[0..<count].map { UInt8(bitPattern: $0) }, as: UTF8.self) : "?")
    }
    return targets
}

/// Open descriptors by kind (`file` for paths), for failure messages.
public func describeOpenDescriptors() -> String {
    var kinds: [String: Int] = [:]
    for target in openDescriptorTargets() {
        kinds[target.hasPrefix("/") ? "file" : target, default: 0] += 1
    }
    return kinds.sorted { $0.key < $1.key }.map { "\($0.key) ×\($0.value)" }.joined(separator: ", ")
}
