import Foundation
import Glibc
import RunLoopKit
import RunLoopMonitor
import SharedTestSupport
import Testing

/// A line cut short (a process killed mid-write, a full disk) does not swallow the next one.
@Suite(.serialized, .exclusive(.monitor)) struct StoreTornLineTests {
/// A line cut short (the process killed mid-write) does not swallow the records after it.
@Test func aTornLineDoesNotSwallowTheNextRecord() throws {
    let directory = try storeTestDirectory()
    defer { try? FileManager.default.removeItem(at: directory) }
    let store = try StallReportStore(directory: directory)
    func tear() throws {
        let handle = try FileHandle(forWritingTo: store.fileURL)
        handle.seekToEndOfFile()
        handle.write(Data("{\"event\":\"began\",\"rep".utf8))
        try handle.close()
    }
    try store.record(.began(storeTestReport(id: "a", processID: neverRunningProcessID)))
    try tear()
    try store.record(.began(storeTestReport(id: "b", processID: neverRunningProcessID)))
    try tear()
    try store.acknowledge([storeTestReport(id: "a", processID: neverRunningProcessID)])
    #expect(try store.reports().map(\.id) == ["a", "b"])
    #expect(try store.unfinished().map(\.id) == ["b"])
}

/// The same with a real failed write: RLIMIT_FSIZE cuts a line short (write returns short,
/// then EFBIG); the record throws, and the next lines are whole.
@Test func aLineCutShortByAFailedWriteDoesNotSwallowTheNextOne() throws {
    let directory = try storeTestDirectory()
    defer { try? FileManager.default.removeItem(at: directory) }
    let probe = try runMonitorProbe(["torn-write", directory.path])
    #expect(probe.status == 0, "status \(probe.status), stderr: \(probe.stderr)")
    #expect(probe.stdout.contains("cut write: "), "\(probe.stdout)")
    #expect(!probe.stdout.contains("cut write: no error"), "\(probe.stdout)")
    #expect(probe.stdout.contains("reports: a,c\n"), "\(probe.stdout)")
    #expect(probe.stdout.contains("unfinished: c\n"), "\(probe.stdout)")
}
}
