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
/// becomes `stalls.1.jsonl` (`stalls.1` becomes `stalls.2`, and so on; the files beyond
/// ``retainedFiles`` are dropped) and a new file starts. Writers of several processes take turns
/// on `stalls.lock` (`flock(2)`), so a rotation never races another process's write or rotation.
///
/// A line cut short (the process killed mid-write, a disk full) is skipped by the readers, and the
/// next write ends it first (a newline in the same `write`), so the lines after it are whole.
///
/// The directory may be in a place others can write (`/var/tmp`), and the store may run as root,
/// so it trusts nothing it did not make: it refuses (``StoreError``) a directory that is a symlink,
/// that the process's effective user does not own or that its group or others can write, makes a
/// missing one with mode 0700 (again at the next write if it is removed), and opens its files with
/// `O_NOFOLLOW` relative to the directory it opened and checked, refusing a symlink, a file that is
/// not a regular one, or one of another user. Otherwise a user
/// who made the directory first could have a root process append to a file of their choosing
/// (`stalls.jsonl -> /root/.profile`) or read back reports they forged.
public final class StallReportStore: Sendable {
    /// Why the store refuses its directory or a file in it.
    public enum StoreError: Error, CustomStringConvertible, Equatable {
        /// The path exists and is not a directory.
        case notADirectory(path: String)
        /// The directory belongs to another user than the process's effective user.
        case directoryNotOwned(path: String, owner: UInt32, effectiveUser: UInt32)
        /// The directory's group or others can write it (`mode` is its permission bits).
        case directoryWritableByOthers(path: String, mode: UInt32)
        /// The store's directory or one of its files is a symbolic link (even to a directory or
        /// file of the process's user: whoever can replace the link could point it elsewhere
        /// between a check and a write).
        case symbolicLink(path: String)
        /// A store file is not a regular file (a device, a FIFO, a socket, a directory).
        case notARegularFile(path: String)
        /// A store file belongs to another user than the process's effective user.
        case fileNotOwned(path: String, owner: UInt32, effectiveUser: UInt32)
        /// Another process held the store's lock (`stalls.lock`) for longer than `waited`: it is
        /// stopped or hung mid-write. Nothing was written.
        case lockTimedOut(path: String, waited: Duration)

        /// What is wrong, naming the path.
        public var description: String {
            switch self {
            case .notADirectory(let path): "stall report store: \(path) is not a directory"
            case .directoryNotOwned(let path, let owner, let user):
                "stall report store: refusing \(path): it belongs to uid \(owner), not to this process's effective uid \(user) (another user could have prepared it)"
            case .directoryWritableByOthers(let path, let mode):
                "stall report store: refusing \(path): its group or others can write it (mode \(String(mode, radix: 8))); use a directory only its owner can write (chmod go-w)"
            case .symbolicLink(let path): "stall report store: refusing \(path): it is a symbolic link"
            case .notARegularFile(let path): "stall report store: refusing \(path): it is not a regular file"
            case .fileNotOwned(let path, let owner, let user):
                "stall report store: refusing \(path): it belongs to uid \(owner), not to this process's effective uid \(user)"
            case .lockTimedOut(let path, let waited):
                "stall report store: \(path) stayed locked by another process for \(waited) (stopped or hung mid-write); nothing was written"
            }
        }
    }

    /// The directory the store writes to.
    public let directory: URL
    /// The current file.
    public var fileURL: URL { directory.appendingPathComponent("stalls.jsonl") }
    /// The previous file, kept after a rotation.
    public var previousFileURL: URL { rotatedFileURL(1) }
    /// The `n`th newest rotated file (`stalls.<n>.jsonl`; 1 is the previous one).
    public func rotatedFileURL(_ n: Int) -> URL { directory.appendingPathComponent("stalls.\(n).jsonl") }
    /// The size past which the file is rotated.
    public let maximumBytes: Int
    /// How many rotated files are kept (`stalls.1.jsonl` … `stalls.<retainedFiles>.jsonl`); the
    /// oldest is dropped at a rotation.
    public let retainedFiles: Int
    /// The lock file that serializes writers of several processes (`flock(2)`).
    var lockFileURL: URL { directory.appendingPathComponent("stalls.lock") }

    private let lock = Mutex(())

    /// A store in `directory`, made if missing (mode 0700; missing parents as `FileManager`
    /// makes them), whose file is rotated past `maximumBytes` (at least 4 KiB), keeping
    /// `retainedFiles` rotated files (0 to 100; 0 keeps none). Reading the reports back reads every
    /// kept file: up to `(retainedFiles + 1) × maximumBytes` in memory.
    ///
    /// Several processes may share the directory: each write, and each rotation, holds an
    /// exclusive `flock(2)` on `stalls.lock` in it, so that no line is split, interleaved or lost
    /// to two processes rotating at once.
    ///
    /// - Throws: ``StoreError`` when the directory is a symlink, is not the process's effective
    ///   user's or others can write it; the error of creating it.
    public init(directory: URL, maximumBytes: Int = 8 << 20, retainedFiles: Int = 1) throws {
        self.directory = directory
        self.maximumBytes = max(4096, maximumBytes)
        self.retainedFiles = min(max(0, retainedFiles), 100)
        if let fd = try openDirectory(creating: true) { close(fd) }
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
    /// - Throws: the encoding's or the file's error (a disk full); ``StoreError`` when the
    ///   directory or the file is refused. A removed directory is made again, not an error.
    public func record(_ event: StallEvent) throws {
        switch event {
        case .began(let report): try append(Line(event: "began", report: Self.identified(report)))
        case .ended(let report): try append(Line(event: "ended", report: Self.identified(report)))
        case .suppressed: return  // a summary of stalls that were never written
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
                // A later `began` line of a stall is the same report symbolicated (written once the
                // symbol tables were loaded): it replaces the first.
                if let report = line.report {
                    if began[report.id] == nil { order.append(report.id) }
                    began[report.id] = report
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

    /// Flushes the file to the disk (`fsync`); nothing to do before the first line.
    public func synchronize() throws {
        try lock.locked { _ in
            guard let directoryFD = try openDirectory(creating: false) else { return }
            defer { close(directoryFD) }
            guard let fd = try openFile(fileURL, in: directoryFD, writing: false) else { return }
            defer { close(fd) }
            guard fsync(fd) == 0 else { throw Self.posixError() }
        }
    }

    private func append(_ line: Line) throws {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
        var line = try encoder.encode(line)
        line.append(0x0A)
        try lock.locked { _ in
            // Checked at each write: the directory may have been removed (made again here),
            // opened up or replaced since.
            let directoryFD = try openDirectory(creating: true)!
            defer { close(directoryFD) }
            let lock = try lockAcross(processes: LOCK_EX, in: directoryFD)
            defer { unlockAcrossProcesses(lock) }
            var fd = try openFile(fileURL, in: directoryFD, writing: true)!
            if Self.size(of: fd) > maximumBytes {
                close(fd)
                rotate(in: directoryFD)
                fd = try openFile(fileURL, in: directoryFD, writing: true)!
            }
            defer { close(fd) }
            // A line cut short (a process killed mid-write, a full disk) is ended first, in the same
            // write, or this line would be glued to it and lost with it.
            let data = Self.endsInPartialLine(fd) ? Data([0x0A]) + line : line
            try data.withUnsafeBytes { bytes in
                var offset = 0
                while offset < bytes.count {
                    let written = write(fd, bytes.baseAddress! + offset, bytes.count - offset)
                    if written < 0 {
                        if errno == EINTR { continue }
                        throw Self.posixError()
                    }
                    offset += written
                }
            }
        }
    }

    /// Shifts the rotated files up by one (dropping the oldest kept) and makes the current file
    /// the previous one. Under the lock across processes, in the directory opened. rename(2)
    /// moves a symlink itself, never what it points to.
    private func rotate(in directoryFD: Int32) {
        func name(_ url: URL) -> String { url.lastPathComponent }
        guard retainedFiles > 0 else {
            unlinkat(directoryFD, name(fileURL), 0)
            return
        }
        unlinkat(directoryFD, name(rotatedFileURL(retainedFiles)), 0)
        if retainedFiles > 1 {
            for n in stride(from: retainedFiles - 1, through: 1, by: -1) {
                renameat(directoryFD, name(rotatedFileURL(n)), directoryFD, name(rotatedFileURL(n + 1)))
            }
        }
        renameat(directoryFD, name(fileURL), directoryFD, name(previousFileURL))
    }

    /// How long a write waits for another process's lock before it gives up.
    static let lockPatience = Duration.seconds(5)

    /// Opens the lock file (checked as the store's files are) and takes `operation` (`LOCK_EX`,
    /// `LOCK_SH`) on it, waiting for other processes at most ``lockPatience``; returns the
    /// descriptor, which the caller lets go with ``unlockAcrossProcesses(_:)``.
    private func lockAcross(processes operation: Int32, in directoryFD: Int32) throws -> Int32 {
        let fd = try openFile(lockFileURL, in: directoryFD, writing: true)!
        let deadline = ContinuousClock.now + Self.lockPatience
        while flock(fd, operation | LOCK_NB) != 0 {
            let code = errno
            if code == EINTR { continue }
            guard code == EWOULDBLOCK, ContinuousClock.now < deadline else {
                close(fd)
                if code == EWOULDBLOCK { throw StoreError.lockTimedOut(path: lockFileURL.path, waited: Self.lockPatience) }
                throw POSIXError(POSIXErrorCode(rawValue: code) ?? .EIO)
            }
            usleep(1_000)
        }
        return fd
    }

    /// Lets go of the lock before closing: a child forked meanwhile shares the descriptor's open
    /// file, and would otherwise keep the lock after this process closed its copy.
    private func unlockAcrossProcesses(_ fd: Int32) {
        flock(fd, LOCK_UN)
        close(fd)
    }

    /// Opens the directory, made first if it is missing and `creating`, and checks it (see
    /// ``StoreError``); returns its descriptor, which the caller closes, or nil when it is missing
    /// and not made. Never through a symlink (`O_NOFOLLOW`): the store's files are then opened,
    /// renamed and removed relative to this descriptor, so the directory checked is the one
    /// written, even if its entry is replaced meanwhile. (Symlinks in the parents are followed:
    /// they are the parents' owners' to place.)
    private func openDirectory(creating: Bool) throws -> Int32? {
        let path = directory.path
        func open() -> Int32 { Glibc.open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC) }
        var fd = open()
        var made = false
        if fd < 0 && errno == ENOENT {
            guard creating else { return nil }
            try FileManager.default.createDirectory(at: directory.deletingLastPathComponent(), withIntermediateDirectories: true)
            // Made by someone else meanwhile (EEXIST): checked below like any other.
            if mkdir(path, 0o700) == 0 {
                made = true
            } else if errno != EEXIST {
                throw Self.posixError()
            }
            fd = open()
        }
        guard fd >= 0 else {
            let code = errno
            // O_NOFOLLOW with O_DIRECTORY refuses a symlink with ELOOP or ENOTDIR: lstat tells it
            // from a file that is not a directory.
            if code == ELOOP || code == ENOTDIR {
                var info = stat()
                if lstat(path, &info) == 0 && info.st_mode & S_IFMT == S_IFLNK { throw StoreError.symbolicLink(path: path) }
                throw StoreError.notADirectory(path: path)
            }
            throw POSIXError(POSIXErrorCode(rawValue: code) ?? .EIO)
        }
        var info = stat()
        guard fstat(fd, &info) == 0 else {
            let error = Self.posixError()
            close(fd)
            throw error
        }
        guard info.st_uid == geteuid() else {
            close(fd)
            throw StoreError.directoryNotOwned(path: path, owner: info.st_uid, effectiveUser: geteuid())
        }
        // A umask may have taken bits of 0700 away from the one made here.
        if made { fchmod(fd, 0o700) }
        guard info.st_mode & 0o022 == 0 else {
            close(fd)
            throw StoreError.directoryWritableByOthers(path: path, mode: info.st_mode & 0o7777)
        }
        return fd
    }

    /// Opens a store file: for appending (made if missing) or for reading (nil when missing). Never
    /// through a symlink, and only a regular file of the process's effective user. `url` names
    /// the file in messages; it is opened by name in the directory `directoryFD`.
    private func openFile(_ url: URL, in directoryFD: Int32, writing: Bool) throws -> Int32? {
        // O_NONBLOCK: opening a FIFO must not wait for a writer or reader (it is refused below); on
        // a regular file it changes nothing.
        // Read and write: an append reads the last byte first (endsInPartialLine).
        let access = writing ? O_RDWR | O_APPEND | O_CREAT : O_RDONLY
        let fd = openat(directoryFD, url.lastPathComponent, access | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0o644)
        guard fd >= 0 else {
            if errno == ELOOP { throw StoreError.symbolicLink(path: url.path) }
            if errno == ENOENT && !writing { return nil }
            throw Self.posixError()
        }
        var info = stat()
        guard fstat(fd, &info) == 0 else {
            let error = Self.posixError()
            close(fd)
            throw error
        }
        guard info.st_mode & S_IFMT == S_IFREG else {
            close(fd)
            throw StoreError.notARegularFile(path: url.path)
        }
        guard info.st_uid == geteuid() else {
            close(fd)
            throw StoreError.fileNotOwned(path: url.path, owner: info.st_uid, effectiveUser: geteuid())
        }
        return fd
    }

    /// Whether the file's last byte is not a newline: the end of a line cut short.
    private static func endsInPartialLine(_ fd: Int32) -> Bool {
        let size = size(of: fd)
        guard size > 0 else { return false }
        var last: UInt8 = 0
        return pread(fd, &last, 1, off_t(size - 1)) == 1 && last != 0x0A
    }

    private static func size(of fd: Int32) -> Int {
        var info = stat()
        return fstat(fd, &info) == 0 ? Int(info.st_size) : 0
    }

    private static func posixError() -> POSIXError { POSIXError(POSIXErrorCode(rawValue: errno) ?? .EIO) }

    /// The file's bytes, nil when it is missing.
    private func read(_ url: URL, in directoryFD: Int32) throws -> [UInt8]? {
        guard let fd = try openFile(url, in: directoryFD, writing: false) else { return nil }
        defer { close(fd) }
        var bytes: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 64 << 10)
        while true {
            let count = chunk.withUnsafeMutableBytes { Glibc.read(fd, $0.baseAddress, $0.count) }
            if count < 0 {
                if errno == EINTR { continue }
                throw Self.posixError()
            }
            if count == 0 { return bytes }
            bytes.append(contentsOf: chunk[0..<count])
        }
    }

    private func readLines() throws -> [Line] {
        let decoder = JSONDecoder()
        var lines: [Line] = []
        let files = try lock.locked { _ -> [[UInt8]] in
            guard let directoryFD = try openDirectory(creating: false) else { return [] }
            defer { close(directoryFD) }
            // Shared with other readers, exclusive of writers; a directory this process cannot
            // write (a reader's) is read without it.
            let lock = try? lockAcross(processes: LOCK_SH, in: directoryFD)
            defer { if let lock { unlockAcrossProcesses(lock) } }
            let rotated = stride(from: retainedFiles, through: 1, by: -1).map(rotatedFileURL)
            return try (rotated + [fileURL]).compactMap { try read($0, in: directoryFD) }
        }
        for data in files {
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
