import Foundation
import Glibc
import RunLoopKit
import SharedTestSupport
@testable import RunLoopMonitor
import Testing

/// A stall report names its process by pid, boot id and start time, so that a pid used again
/// (another PID namespace, pid reuse) does not hide a stall that ended in a kill.
@Suite(.serialized, .exclusive(.monitor)) struct StoreProcessIdentityTests {
/// A stall of the first process of one PID namespace (pid 1, as in a container) that ended
/// without an ended line, read by the first process of the next namespace (pid 1 again, as the
/// restarted container's app): not the reader's own stall, so it is unfinished.
@Test(.enabled(if: pidNamespacesWork, "needs `unshare --pid` (root or user namespaces)"))
func aStallOfAnotherPIDNamespaceWithTheSamePIDIsUnfinished() throws {
    let directory = try storeTestDirectory()
    defer { try? FileManager.default.removeItem(at: directory) }
    let writer = try runMonitorProbe(["pidns", "began", directory.path])
    #expect(writer.status == 0, "status \(writer.status), stderr: \(writer.stderr)")
    #expect(writer.stdout.contains("began pid 1"), "\(writer.stdout)")
    // The writer ran a 100 ms stall before it wrote: the reader, started after it exited,
    // starts at least 10 clock ticks later, so the start times differ.
    let reader = try runMonitorProbe(["pidns", "unfinished", directory.path])
    #expect(reader.status == 0, "status \(reader.status), stderr: \(reader.stderr)")
    #expect(reader.stdout.contains("\"threadName\":\"hung-loop\""), "\(reader.stdout)")
    #expect(reader.stdout.contains("done"))
}

/// Pid reuse without namespaces: a report with this process's pid but another start time (or
/// another boot) is of a process that is gone, so it is unfinished; one with this process's
/// identity is not.
@Test func aReportWithThisPIDButAnotherStartTimeOrBootIsUnfinished() throws {
    let directory = try storeTestDirectory()
    defer { try? FileManager.default.removeItem(at: directory) }
    let store = try StallReportStore(directory: directory)
    let ownStart = try #require(ProcessIdentity.startTime(of: getpid()))
    let bootID = try #require(ProcessIdentity.bootID)
    var earlier = storeTestReport(id: "earlier", processID: getpid())
    earlier.bootID = bootID
    earlier.processStartTime = ownStart - 1
    var lastBoot = storeTestReport(id: "last-boot", processID: getpid())
    lastBoot.bootID = "00000000-0000-0000-0000-000000000000"
    lastBoot.processStartTime = ownStart
    try store.record(.began(earlier))
    try store.record(.began(lastBoot))
    try store.record(.began(storeTestReport(id: "own", processID: getpid())))  // identity filled in
    #expect(try store.unfinished().map(\.id) == ["earlier", "last-boot"])
    let own = try #require(try store.reports().last)
    #expect(own.bootID == bootID)
    #expect(own.processStartTime == ownStart)
}

/// A line written before reports carried an identity still decodes, and is judged by its pid.
@Test func aReportWithoutIdentityIsJudgedByItsPID() throws {
    let directory = try storeTestDirectory()
    defer { try? FileManager.default.removeItem(at: directory) }
    let store = try StallReportStore(directory: directory)
    func line(_ id: String, _ processID: Int32) -> String {
        #"{"event":"began","report":{"cpuMeasuredOverNs":0,"durationNs":300000000,"id":"\#(id)","mode":"m","phase":"blocks","processID":\#(processID),"sampleCount":0,"stacks":[],"startedAt":1000.5,"suppressedSimilar":0,"threadCPUTimeNs":0,"threadID":1,"threadName":"t"}}"#
    }
    try Data((line("gone", neverRunningProcessID) + "\n" + line("own", getpid()) + "\n").utf8).write(to: store.fileURL)
    #expect(try store.reports().map(\.id) == ["gone", "own"])
    #expect(try store.reports().allSatisfy { $0.bootID == nil && $0.processStartTime == nil })
    #expect(try store.unfinished().map(\.id) == ["gone"])
}
}
