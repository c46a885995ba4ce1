import Foundation
import Glibc
import RunLoopMonitor
import SharedTestSupport

/// A new directory under the temporary directory (mode 0755: the process's own, not writable by
/// others), for one test's store.
func storeTestDirectory() throws -> URL {
    let url = FileManager.default.temporaryDirectory.appendingPathComponent("stall-store-\(UUID().uuidString)")
    try FileManager.default.createDirectory(at: url, withIntermediateDirectories: true)
    return url
}

/// A report with `id` of the process `processID`, without a process identity beyond the pid.
func storeTestReport(id: String, processID: Int32) -> StallReport {
    StallReport(
        id: id, processID: processID, threadName: "t", threadID: 1, mode: "m", phase: "blocks", startedAt: Date(),
        duration: .milliseconds(300), threadCPUTime: .zero, cpuMeasuredOver: .zero, stacks: [], sampleCount: 0)
}

/// Above any pid_max: never a running process.
let neverRunningProcessID = Int32.max

/// The permission bits of the file at `url` (0 when it cannot be read).
func permissionBits(of url: URL) -> mode_t {
    var info = stat()
    return stat(url.path, &info) == 0 ? info.st_mode & 0o7777 : 0
}

/// Whether `unshare --pid --fork --mount-proc` runs here (root, or user namespaces allowed).
let pidNamespacesWork: Bool = {
    let process = Process()
    process.executableURL = URL(fileURLWithPath: "/usr/bin/unshare")
    process.arguments = ["--pid", "--fork", "--mount-proc", "/bin/true"]
    process.standardOutput = FileHandle.nullDevice
    process.standardError = FileHandle.nullDevice
    guard (try? process.run()) != nil else { return false }
    process.waitUntilExit()
    return process.terminationStatus == 0
}()
