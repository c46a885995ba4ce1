import Foundation
import Glibc
import Metrics
import MetricsTestKit
import RunLoopKit
import SharedTestSupport
@testable import RunLoopMonitor
import Synchronization
import Testing


@Suite(.serialized, .exclusive(.monitor)) struct ReportingTests {
private func temporaryDirectory() throws -> URL {
    let url = FileManager.default.temporaryDirectory.appendingPathComponent("stall-store-\(UUID().uuidString)")
    try FileManager.default.createDirectory(at: url, withIntermediateDirectories: true)
    return url
}

private func report(id: String, processID: Int32) -> StallReport {
    StallReport(
        id: id, processID: processID, threadName: "t", threadID: 1, mode: "m", phase: "blocks", startedAt: Date(),
        duration: .milliseconds(300), threadCPUTime: .zero, cpuMeasuredOver: .zero, stacks: [], sampleCount: 0)
}

/// A process id that is not running (a child that has exited and been reaped).
private func deadProcessID() throws -> Int32 {
    let process = Process()
    process.executableURL = URL(fileURLWithPath: "/bin/true")
    try process.run()
    process.waitUntilExit()
    return process.processIdentifier
}

@Test func theStorePairsBeganAndEndedAndFindsOnlyUnfinishedStallsOfDeadProcesses() throws {
    let directory = try temporaryDirectory()
    defer { try? FileManager.default.removeItem(at: directory) }
    let store = try StallReportStore(directory: directory)
    let dead = try deadProcessID()
    try store.record(.began(report(id: "a", processID: dead)))  // killed mid-stall
    try store.record(.began(report(id: "b", processID: dead)))
    var ended = report(id: "b", processID: dead)
    ended.endReason = .movedOn
    try store.record(.ended(ended))
    try store.record(.began(report(id: "c", processID: getpid())))  // this process: still going
    #expect(try store.unfinished().map(\.id) == ["a"])
    #expect(try store.reports().map(\.id) == ["a", "b", "c"])
    #expect(try store.reports()[1].endReason == .movedOn)
    // One JSON object per line.
    let text = try String(contentsOf: store.fileURL, encoding: .utf8)
    #expect(text.split(separator: "\n").count == 4)
    #expect(text.split(separator: "\n").allSatisfy { (try? JSONSerialization.jsonObject(with: Data($0.utf8))) != nil })
    try store.acknowledge(store.unfinished())
    #expect(try store.unfinished().isEmpty)
}

@Test func aTornLastLineIsSkipped() throws {
    let directory = try temporaryDirectory()
    defer { try? FileManager.default.removeItem(at: directory) }
    let store = try StallReportStore(directory: directory)
    try store.record(.began(report(id: "a", processID: try deadProcessID())))
    let handle = try FileHandle(forWritingTo: store.fileURL)
    handle.seekToEndOfFile()
    handle.write(Data("{\"event\":\"began\",\"rep".utf8))
    try handle.close()
    #expect(try store.unfinished().map(\.id) == ["a"])
}

@Test func theStoreRotatesPastItsSize() throws {
    let directory = try temporaryDirectory()
    defer { try? FileManager.default.removeItem(at: directory) }
    let store = try StallReportStore(directory: directory, maximumBytes: 4096)
    let dead = try deadProcessID()
    for index in 0..<40 { try store.record(.began(report(id: "r\(index)", processID: dead))) }
    #expect(FileManager.default.fileExists(atPath: store.previousFileURL.path))
    #expect(try store.unfinished().count > 0)
}

/// A process killed (SIGKILL) in the middle of a stall: its began line is on disk and the
/// next launch's unfinished() finds it, with the stuck function.
@Test func aStallOfAProcessKilledMidStallIsFoundAtTheNextLaunch() throws {
    let directory = try temporaryDirectory()
    defer { try? FileManager.default.removeItem(at: directory) }
    let child = try runMonitorProbe(["hang", directory.path])
    #expect(child.status == -SIGKILL, "status \(child.status), stderr: \(child.stderr)")
    #expect(child.stdout.contains("began"))
    let unfinished = try StallReportStore(directory: directory).unfinished()
    try #require(unfinished.count == 1)
    #expect(unfinished[0].threadName == "hung-loop")
    #expect(unfinished[0].endReason == nil)
    #expect(unfinished[0].stuckIn == "probeCrunchNumbers(until:)")
    // The probe's own reading agrees (a second process, as the next launch would be).
    let reader = try runMonitorProbe(["unfinished", directory.path])
    #expect(reader.stdout.contains("probeCrunchNumbers"))
}

/// fork() while a stall monitor samples a stall and a CPU monitor scans: in the child, whose
/// only thread is the forking one, stop() returns at once (no join of a thread that is not
/// there, no lock a vanished thread may hold), and the parent's monitors stop normally.
@Test func stopInAForkedChildReturnsAtOnce() throws {
    let probe = try runMonitorProbe(["fork"])
    #expect(probe.status == 0, "\(probe.stderr)")
    #expect(probe.stdout.contains("child stopped its monitors"))
    #expect(probe.stdout.contains("child exit 0"))
    #expect(probe.stdout.contains("done"))
}

@Test func aThresholdOrIntervalNotAboveZeroStopsWithAClearMessage() throws {
    let threshold = try runMonitorProbe(["bad-threshold"])
    #expect(threshold.status < 0)
    #expect(threshold.stderr.contains("threshold must be positive"), "\(threshold.stderr)")
    let interval = try runMonitorProbe(["bad-interval"])
    #expect(interval.status < 0)
    #expect(interval.stderr.contains("sampleInterval must be positive"), "\(interval.stderr)")
}

/// The probe's stalls in a process of its own (CI runs the same probe built in release,
/// where frame pointers are omitted).
@Test func theProbeNamesItsBusyAndBlockedStalls() throws {
    let child = try runMonitorProbe(["stall"])
    #expect(child.status == 0, "\(child.stderr)")
    let lines = child.stdout.split(separator: "\n").filter { $0.hasPrefix("{") }
    let reports = try lines.map { line -> (String, StallReport) in
        let object = try #require(try JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any])
        let report = try JSONSerialization.data(withJSONObject: try #require(object["report"]))
        return (object["event"] as? String ?? "", try JSONDecoder().decode(StallReport.self, from: report))
    }
    try #require(reports.count == 4)
    #expect(reports[1].1.stuckIn == "probeCrunchNumbers(until:)")
    #expect(reports[3].1.stuckIn == "probeBlockingRead(for:)")
}

@Test func stallsAreCountedAndTimedInMetrics() throws {
    _ = testMetrics
    let worker = PermanentThread(name: "metered-loop")
    defer { worker.stop() }
    let log = EventLog<StallEvent>()
    let monitor = StallMonitor(loop: worker.loop, threshold: .milliseconds(80), sampleInterval: .milliseconds(20), logger: nil)
    monitor.start { log.append($0) }
    defer { monitor.stop() }
    try worker.execute { _ = monitorTestCrunch(until: .now + .milliseconds(200)) }
    let events = log.wait(for: 2)
    try #require(events.count == 2)
    // The counter is labelled as the began report says (symbolicated or not yet), the timer as the
    // ended one (always symbolicated); both bounded by the process's first 20 fingerprints.
    let began = MonitorMetrics.stallLabels(events[0].report)
    let counter = try testMetrics.expectCounter(
        MonitorReporting.MetricName.stalls,
        [("loop", "metered-loop"), ("phase", "blocks"), ("stuck_in", began.stuckIn), ("fingerprint", began.fingerprint)])
    #expect(counter.totalValue == 1)
    let ended = MonitorMetrics.stallLabels(events[1].report)
    #expect(events[1].report.stuckIn == "monitorTestCrunch(until:)")
    let timer = try testMetrics.expectTimer(
        MonitorReporting.MetricName.stallDuration, [("loop", "metered-loop"), ("stuck_in", ended.stuckIn)])
    #expect(timer.values.count == 1)
    // The 200 ms stall, timed to the 20 ms sample interval (plus room for a loaded machine).
    #expect((timer.values.first ?? 0) >= 130_000_000)
}

@Test func aSpinningThreadIsFoundByTheCPUMonitorWithItsStack() throws {
    _ = testMetrics
    let stop = Atomic<Bool>(false)
    let spinner = NamedThread(name: "hot-spinner") {
        while !stop.load(ordering: .relaxed) { _ = monitorTestCrunch(until: .now + .milliseconds(5)) }
    }
    defer { stop.store(true, ordering: .relaxed); spinner.join() }
    let log = EventLog<CPUEvent>()
    // 20 % of a core over 100 ms windows, 3 in a row. A spinner is near 100 % on an idle
    // machine. With three busy loops on this 2-core machine and the other tests running in
    // parallel, it never held 50 % for 3 windows in 20 s: its share is about 2 cores over 4
    // or more runnable threads, and the threshold leaves room below that.
    let monitor = CPUMonitor(threshold: 0.2, window: .milliseconds(100), sustainedWindows: 3, logger: nil)
    monitor.start { log.append($0) }
    defer { monitor.stop() }
    var found: CPUReport?
    let deadline = ContinuousClock.now + .seconds(20)
    while found == nil, ContinuousClock.now < deadline {
        for case .hot(let report) in log.wait(for: log.all.count + 1, timeout: .seconds(1)) where report.threadID == spinner.threadID {
            found = report
        }
    }
    let report = try #require(found)
    #expect(report.threadName == "hot-spinner")
    #expect(report.usage.count == 3)
    #expect(report.usage.allSatisfy { $0 >= 0.2 })
    #expect(report.hotIn == "monitorTestCrunch(until:)")
    let gauge = try testMetrics.expectGauge(MonitorReporting.MetricName.threadCPURatio, [("thread", "hot-spinner")])
    // The gauge holds the newest window, which may be after the spinner lost the core.
    #expect(gauge.lastValue ?? 0 > 0)
}
}
