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

    /// Writes `event`'s report: a `began` or an `ended` line.
    ///
    /// - Throws: the encoding's or the file's error (disk full, directory removed).
    public func record(_ event: StallEvent) throws {
        switch event {
        case .began(let report): try append(Line(event: "began", report: report))
        case .ended(let report): try append(Line(event: "ended", report: report))
        case .suppressed: return  // a summary of stalls that were never written
        }
    }

    /// Marks `reports` handled: ``unfinished()`` no longer returns them.
    public func acknowledge(_ reports: [StallReport]) throws {
        for report in reports { try append(Line(event: "acknowledged", id: report.id)) }
    }

    /// Stalls that began and never ended in a process that is no longer running (killed or
    /// crashed mid-stall), oldest first, unless acknowledged. Each report is the `began` one:
    /// its ``StallReport/duration`` is what had passed when it was written.
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
            guard !closed.contains(id), let report = began[id], !Self.isRunning(report.processID) else { return nil }
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

    private static func isRunning(_ processID: Int32) -> Bool {
        if processID == getpid() { return true }
        return kill(processID, 0) == 0 || errno == EPERM
    }
}
