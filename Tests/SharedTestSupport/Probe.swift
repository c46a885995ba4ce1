import Foundation
import Glibc
import Synchronization

/// Runs the test-support executable `name` (built beside the test binary) with `arguments`, with
/// Swift's backtracer and LeakSanitizer off (a probe that must trap would otherwise hang or
/// report); returns its exit status (negative: killed by that signal), standard output and
/// standard error. Killed after `timeout`.
public func runProbe(
    _ name: String, _ arguments: [String], timeout: Duration = .seconds(60)
) throws -> (status: Int32, stdout: String, stderr: String) {
    let testBinary = try FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/exe")
    let process = Process()
    process.executableURL = URL(fileURLWithPath: testBinary).deletingLastPathComponent().appendingPathComponent(name)
    process.arguments = arguments
    var environment = ProcessInfo.processInfo.environment
    environment["SWIFT_BACKTRACE"] = "enable=no"
    environment["ASAN_OPTIONS"] = (environment["ASAN_OPTIONS"].map { $0 + ":" } ?? "") + "detect_leaks=0"
    process.environment = environment
    let out = Pipe()
    let err = Pipe()
    process.standardOutput = out
    process.standardError = err
    try process.run()
    // Both pipes are read on their own threads, so neither can fill while the other is read.
    let outData = Mutex(Data())
    let errData = Mutex(Data())
    let readers = DispatchGroup()
    DispatchQueue.global().async(group: readers) {
        let data = out.fileHandleForReading.readDataToEndOfFile()
        outData.withLock { $0 = data }
    }
    DispatchQueue.global().async(group: readers) {
        let data = err.fileHandleForReading.readDataToEndOfFile()
        errData.withLock { $0 = data }
    }
    let deadline = ContinuousClock.now + timeout
    while process.isRunning && ContinuousClock.now < deadline { usleep(10_000) }
    if process.isRunning { kill(process.processIdentifier, SIGKILL) }
    process.waitUntilExit()
    readers.wait()
    let status = process.terminationReason == .uncaughtSignal ? -process.terminationStatus : process.terminationStatus
    return (
        status, String(decoding: outData.withLock { $0 }, as: UTF8.self),
        String(decoding: errData.withLock { $0 }, as: UTF8.self)
    )
}
