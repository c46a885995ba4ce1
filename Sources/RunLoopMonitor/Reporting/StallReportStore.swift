import Foundation
import Glibc
import RunLoopKit
import Synchronization

/// Stall reports on disk, as JSON lines, so that a hang that ends in a kill is found at the next
/// launch.
///
/// A stall is written when it begins (a `began` line) and again when it ends (an `ended` line
/// with the same `id`, which supersedes it). A process killed mid-stall leaves a `began` line with
/// no `ended`: ``unfinished()`` returns those of processes that are no longer running, and
/// ``acknowledge(_:)`` marks them handled so that the next launch does not report them again.
///
/// A process is told apart by its pid, the boot id and its start time (``StallReport/bootID``,
/// ``StallReport/processStartTime``, written into each report of the store's own process): in a
/// container the restarted app usually has the pid its killed predecessor had (the namespace's
/// first process is pid 1 every time), and a pid can be used again anywhere, so a pid alone would
/// take the predecessor for still running and never report its hang.
///
/// The file is `stalls.jsonl` in the directory; each line is one object:
///
/// ```json
/// {"event":"began","report":{…StallReport…}}
/// {"event":"ended","report":{…StallReport…}}
/// {"event":"acknowledged","id":"…"}
/// ```
///
/// (``StallReport`` documents the report's fields.) Each line is one `write(2)` to a file opened
/// with `O_APPEND`, so lines of several processes sharing the directory do not interleave, and a
/// line is in the kernel's page cache, which survives the process's death, when `record` returns
/// (call ``synchronize()`` to survive a power loss too). When the file passes ``maximumBytes`` it
/// becomes `stalls.1.jsonl` (the previous one is dropped) and a new file starts.
public final class StallReportStore: Sendable {
    /// The directory the store writes to.
    public let directory: URL
    /// The current file.
    public var fileURL: URL { directory.appendingPathComponent("stalls.jsonl") }
    /// The previous file, kept after a rotation.
    public var previousFileURL: URL { directory.appendingPathComponent("stalls.1.jsonl") }
    /// The size past which the file is rotated.
    public let maximumBytes: Int

    private let lock = Mutex(())

    /// A store in `directory`, made if missing.
    ///
    /// - Throws: the error of creating the directory.
    public init(directory: URL, maximumBytes: Int = 8 << 20) throws {
        self.directory = directory
        self.maximumBytes = max(4096, maximumBytes)
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
    }

    /// A store in the directory at `path`.
    public convenience init(directory path: String) throws {
        try self.init(directory: URL(fileURLWithPath: path, isDirectory: true))
    }

    private struct Line: Codable {
        var event: String
        var report: StallReport?
        var id: String?
    }

    /// Writes `event`'s report: a `began` or an `ended` line. A report of this process (its
    /// ``StallReport/processID`` is `getpid()`) without ``StallReport/bootID`` or
    /// ``StallReport/processStartTime`` gets this process's.
    ///
    /// - Throws: the encoding's or the file's error (disk full, directory removed).
    public func record(_ event: StallEvent) throws {
        switch event {
        case .began(let report): try append(Line(event: "began", report: Self.identified(report)))
        case .ended(let report): try append(Line(event: "ended", report: Self.identified(report)))
        }
    }

    private static func identified(_ report: StallReport) -> StallReport {
        guard report.processID == getpid(), report.bootID == nil || report.processStartTime == nil else { return report }
        var report = report
        report.bootID = report.bootID ?? ProcessIdentity.bootID
        report.processStartTime = report.processStartTime ?? ProcessIdentity.startTime(of: report.processID)
        return report
    }

    /// Marks `reports` handled: ``unfinished()`` no longer returns them.
    public func acknowledge(_ reports: [StallReport]) throws {
        for report in reports { try append(Line(event: "acknowledged", id: report.id)) }
    }

    /// Stalls that began and never ended in a process that is no longer running (killed or
    /// crashed mid-stall), oldest first, unless acknowledged. Each report is the `began` one:
    /// its ``StallReport/duration`` is what had passed when it was written.
    ///
    /// A report's process counts as running only when a process with its pid runs now (as this
    /// process's `/proc` shows it), in the same boot, with the same start time. A report without
    /// boot id and start time (written before they were recorded) is judged by its pid alone.
    public func unfinished() throws -> [StallReport] {
        let lines = try readLines()
        var began: [String: StallReport] = [:]
        var order: [String] = []
        var closed = Set<String>()
        for line in lines {
            switch line.event {
            case "began":
                if let report = line.report, began[report.id] == nil {
                    began[report.id] = report
                    order.append(report.id)
                }
            case "ended": if let id = line.report?.id { closed.insert(id) }
            case "acknowledged": if let id = line.id { closed.insert(id) }
            default: break
            }
        }
        return order.compactMap { id in
            guard !closed.contains(id), let report = began[id], !Self.isRunning(report) else { return nil }
            return report
        }
    }

    /// Every stall on disk, the latest line of each (`ended` when it ended), oldest first.
    public func reports() throws -> [StallReport] {
        var latest: [String: StallReport] = [:]
        var order: [String] = []
        for line in try readLines() {
            guard let report = line.report else { continue }
            if latest[report.id] == nil { order.append(report.id) }
            latest[report.id] = report
        }
        return order.compactMap { latest[$0] }
    }

    /// Flushes the file to the disk (`fsync`).
    public func synchronize() throws {
        try lock.locked { _ in
            let fd = open(fileURL.path, O_WRONLY | O_CLOEXEC)
            guard fd >= 0 else { throw POSIXError(POSIXErrorCode(rawValue: errno) ?? .EIO) }
            defer { close(fd) }
            guard fsync(fd) == 0 else { throw POSIXError(POSIXErrorCode(rawValue: errno) ?? .EIO) }
        }
    }

    private func append(_ line: Line) throws {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
        var data = try encoder.encode(line)
        data.append(0x0A)
        try lock.locked { _ in
            rotateIfNeeded()
            let fd = open(fileURL.path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0o644)
            guard fd >= 0 else { throw POSIXError(POSIXErrorCode(rawValue: errno) ?? .EIO) }
            defer { close(fd) }
            try data.withUnsafeBytes { bytes in
                var offset = 0
                while offset < bytes.count {
                    let written = write(fd, bytes.baseAddress! + offset, bytes.count - offset)
                    if written < 0 {
                        if errno == EINTR { continue }
                        throw POSIXError(POSIXErrorCode(rawValue: errno) ?? .EIO)
                    }
                    offset += written
                }
            }
        }
    }

    private func rotateIfNeeded() {
        var info = stat()
        guard stat(fileURL.path, &info) == 0, Int(info.st_size) > maximumBytes else { return }
        rename(fileURL.path, previousFileURL.path)
    }

    private func readLines() throws -> [Line] {
        let decoder = JSONDecoder()
        var lines: [Line] = []
        for url in [previousFileURL, fileURL] {
            guard let data = lock.locked({ _ in try? Data(contentsOf: url) }) else { continue }
            // A line cut short by a crash mid-write is skipped, not fatal.
            for slice in data.split(separator: 0x0A) {
                if let line = try? decoder.decode(Line.self, from: Data(slice)) { lines.append(line) }
            }
        }
        return lines
    }

    private static func isRunning(_ report: StallReport) -> Bool {
        let processID = report.processID
        // Without a start time to compare (an older report, or no /proc), the pid alone.
        guard let startTime = report.processStartTime, ProcessIdentity.startTime(of: getpid()) != nil else {
            if processID == getpid() { return true }
            return kill(processID, 0) == 0 || errno == EPERM
        }
        if let bootID = report.bootID, let current = ProcessIdentity.bootID, bootID != current { return false }  // rebooted since
        return ProcessIdentity.startTime(of: processID) == startTime
    }
}

/// What tells a process apart from a later one with the same pid: the boot and its start time.
enum ProcessIdentity {
    /// This boot's id (`/proc/sys/kernel/random/boot_id`), nil when it cannot be read.
    static let bootID: String? = ProcessThreads.read("/proc/sys/kernel/random/boot_id").map {
        $0.trimmingCharacters(in: .whitespacesAndNewlines)
    }.flatMap { $0.isEmpty ? nil : $0 }

    /// When the process `processID` started, in clock ticks since boot (field 22 of
    /// `/proc/<pid>/stat`), nil when no such process is in this process's `/proc`. Read each time:
    /// a forked child has the same memory and another start time.
    static func startTime(of processID: Int32) -> UInt64? {
        guard processID > 0, let stat = ProcessThreads.read("/proc/\(processID)/stat"),
            let commandEnd = stat.lastIndex(of: ")")
        else { return nil }
        // Field 2, the command, is in parentheses and may hold spaces and parentheses itself:
        // the fields after its last ")" are 3, 4, ...
        let fields = stat[stat.index(after: commandEnd)...].split(separator: " ")
        return fields.count > 19 ? UInt64(fields[19]) : nil
    }
}
