import Dispatch
import Glibc
import RunLoopKit
import SharedTestSupport
import struct Foundation.Date
import class Foundation.JSONEncoder
import class Foundation.JSONDecoder
import class Foundation.JSONSerialization
@testable import RunLoopMonitor
import Synchronization
import Testing

/// Bounds on real time: the monitor times a stall from its first look that saw the pass busy and
/// to the look that saw it move on, each up to one sample interval late, plus however long its
/// thread waits for a CPU on a loaded 2-core machine (and ThreadSanitizer's slowdown): 300 ms of
/// room above, 150 ms below.
private let threshold = Duration.milliseconds(100)
private let interval = Duration.milliseconds(20)
private let room = Duration.milliseconds(300)

@Suite(.serialized, .exclusive(.monitor)) struct StallMonitorTests {
@Test func aBusyStallIsReportedWithTheFunctionPhaseAndTimes() throws {
    let worker = PermanentThread(name: "busy-loop")
    defer { worker.stop() }
    let log = EventLog<StallEvent>()
    let monitor = StallMonitor(loop: worker.loop, threshold: threshold, sampleInterval: interval, logger: nil)
    monitor.start { log.append($0) }
    defer { monitor.stop() }
    try worker.execute { _ = monitorTestCrunch(until: .now + .milliseconds(400)) }
    let events = log.wait(for: 2)
    try #require(events.count == 2)
    guard case .began(let began) = events[0], case .ended(let ended) = events[1] else {
        Issue.record("expected began then ended, got \(events)")
        return
    }
    #expect(began.id == ended.id)
    #expect(began.phase == "blocks")
    #expect(began.mode == RunLoop.Mode.default.rawValue)
    #expect(began.threadName == "busy-loop")
    #expect(began.threadID == worker.threadID)
    // .began within threshold + one sample interval (+ room); never before the threshold.
    #expect(began.duration >= threshold)
    #expect(began.duration <= threshold + interval + room, "began after \(began.duration)")
    // The began report is symbolicated once the symbol tables are loaded (in the background from
    // the monitor's start; it never waits for them): before, its frames have image and offset.
    let beganNames = symbols(began.stacks.first?.frames ?? [])
    if began.isSymbolicated {
        #expect(beganNames.contains("monitorTestCrunch(until:)"))
    } else {
        #expect(beganNames.isEmpty && began.stuckIn == nil && !(began.stacks.first?.frames.isEmpty ?? true))
    }
    // .ended with the total: the 400 ms the block took, within the same room.
    #expect(ended.endReason == .movedOn)
    #expect(ended.duration >= .milliseconds(400) - interval - .milliseconds(150), "ended after \(ended.duration)")
    #expect(ended.duration <= .milliseconds(400) + interval + room, "ended after \(ended.duration)")
    #expect(ended.stuckIn == "monitorTestCrunch(until:)")
    #expect(ended.sampleCount >= 3)  // 400 ms / 20 ms alone; fewer when the monitor waits for a core
    #expect(ended.stacks.map(\.count).reduce(0, +) == ended.sampleCount)
    // Most frequent first.
    #expect(ended.stacks.map(\.count) == ended.stacks.map(\.count).sorted(by: >))
    // Busy: alone, the thread runs nearly all the time it is watched (0.9+); the bound leaves
    // room for the other suites' threads sharing the 2 cores. A blocked thread is near 0
    // (the next test).
    #expect(ended.cpuRatio > 0.1, "cpu \(ended.threadCPUTime) over \(ended.cpuMeasuredOver)")
}

@Test func aBlockedStallShowsLowCPUAndTheBlockingCaller() throws {
    let worker = PermanentThread(name: "blocked-loop")
    defer { worker.stop() }
    let log = EventLog<StallEvent>()
    let monitor = StallMonitor(loop: worker.loop, threshold: threshold, sampleInterval: interval, logger: nil)
    monitor.start { log.append($0) }
    defer { monitor.stop() }
    try worker.execute { monitorTestBlockingWait(until: .now + .milliseconds(400)) }
    let events = log.wait(for: 2)
    try #require(events.count == 2)
    let ended = events[1].report
    #expect(ended.endReason == .movedOn)
    let endedNames = symbols(ended.stacks.first?.frames ?? [])
    #expect(endedNames.contains("monitorTestBlockingWait(until:)"))
    #expect(ended.stuckIn == "monitorTestBlockingWait(until:)")
    #expect(ended.cpuRatio < 0.05, "cpu \(ended.threadCPUTime) over \(ended.cpuMeasuredOver)")
}

@Test func aStallInATimerIsInTheTimersPhaseAndMode() throws {
    let worker = PermanentThread(name: "timer-loop")
    defer { worker.stop() }
    let log = EventLog<StallEvent>()
    let monitor = StallMonitor(loop: worker.loop, threshold: threshold, sampleInterval: interval, logger: nil)
    monitor.start { log.append($0) }
    defer { monitor.stop() }
    try worker.execute {
        let timer = RunLoopTimer(fireAt: .now + .milliseconds(10), interval: .zero) { _ in
            _ = monitorTestCrunch(until: .now + .milliseconds(300))
        }
        RunLoop.current.add(timer, forMode: .default)
    }
    let events = log.wait(for: 2)
    try #require(events.count == 2)
    #expect(events[0].report.phase == "timers")
    #expect(events[1].report.stuckIn == "monitorTestCrunch(until:)")
}

/// A loop asleep in the kernel for seconds, and one woken every 50 ms by a quick timer, are
/// never stalled. (This test must wait the time out: it asserts an absence.) The threshold,
/// 300 ms, is far above the ticker's 2 ms pass, so a loaded machine that preempts that pass
/// for a while does not make it a stall; the sleeper sleeps 2 s, far above it too.
@Test func idleAndQuickLoopsGiveNoEvent() throws {
    let sleeper = PermanentThread(name: "sleeper")
    let ticker = PermanentThread(name: "ticker")
    defer { sleeper.stop(); ticker.stop() }
    try ticker.execute {
        RunLoop.current.add(RunLoopTimer(fireAt: .now, interval: .milliseconds(50)) { _ in usleep(2000) }, forMode: .default)
    }
    let log = EventLog<StallEvent>()
    let monitor = StallMonitor(loops: [sleeper.loop, ticker.loop], threshold: .milliseconds(300), sampleInterval: .milliseconds(10), logger: nil)
    monitor.start { log.append($0) }
    _ = log.wait(for: 1, timeout: .seconds(2))
    monitor.stop()
    #expect(log.all.isEmpty, "\(log.all.map(\.report.threadName))")
}

@Test func stopDuringAStallEndsItAsCutShort() throws {
    let worker = PermanentThread(name: "cut-loop")
    defer { worker.stop() }
    let log = EventLog<StallEvent>()
    let monitor = StallMonitor(loop: worker.loop, threshold: threshold, sampleInterval: interval, logger: nil)
    monitor.start { log.append($0) }
    let release = Atomic<Bool>(false)
    try worker.execute { while !release.load(ordering: .relaxed) { _ = monitorTestCrunch(until: .now + .milliseconds(5)) } }
    _ = log.wait(for: 1)
    monitor.stop()
    release.store(true, ordering: .relaxed)
    let events = log.all
    try #require(events.count == 2)
    guard case .ended(let ended) = events[1] else { Issue.record("no ended event"); return }
    #expect(ended.endReason == .monitorStopped)
    #expect(ended.isCutShort)
    #expect(ended.duration >= threshold)
}

@Test func stopFromInsideTheHandlerDoesNotDeadlock() throws {
    let worker = PermanentThread(name: "stop-inside")
    defer { worker.stop() }
    let log = EventLog<StallEvent>()
    let monitor = StallMonitor(loop: worker.loop, threshold: threshold, sampleInterval: interval, logger: nil)
    monitor.start { event in
        log.append(event)
        if case .began = event { monitor.stop() }
    }
    let release = Atomic<Bool>(false)
    try worker.execute { while !release.load(ordering: .relaxed) { _ = monitorTestCrunch(until: .now + .milliseconds(5)) } }
    let events = log.wait(for: 2)
    release.store(true, ordering: .relaxed)
    #expect(events.count == 2)
    #expect(events.last?.report.endReason == .monitorStopped)
    monitor.stop()  // again, from outside: nothing to do
}

/// One watched loop's thread exits: no report for it, and the monitor goes on watching the
/// other loop.
@Test func aLoopWhoseThreadExitsIsDroppedAndTheOthersStillWatched() throws {
    let leaving = PermanentThread(name: "leaving")
    let staying = PermanentThread(name: "staying")
    defer { staying.stop() }
    let log = EventLog<StallEvent>()
    let monitor = StallMonitor(loops: [leaving.loop, staying.loop], threshold: threshold, sampleInterval: interval, logger: nil)
    monitor.start { log.append($0) }
    defer { monitor.stop() }
    leaving.stop()
    try waitFor { leaving.loop.hasThreadExited }
    try staying.execute { _ = monitorTestCrunch(until: .now + .milliseconds(250)) }
    let events = log.wait(for: 2)
    #expect(events.count == 2)
    #expect(events.allSatisfy { $0.report.threadName == "staying" })
}

/// A stall in a nested run's callback belongs to the nested pass; the nested run's sleeps are
/// not stalls of the enclosing pass.
@Test func aNestedRunThatSleepsIsNotAStall() throws {
    let worker = PermanentThread(name: "nested")
    defer { worker.stop() }
    let log = EventLog<StallEvent>()
    let monitor = StallMonitor(loop: worker.loop, threshold: threshold, sampleInterval: interval, logger: nil)
    monitor.start { log.append($0) }
    try worker.execute {
        let loop = RunLoop.current
        loop.add(RunLoopTimer(fireAt: .now + .milliseconds(400), interval: .zero) { _ in }, forMode: "nested")
        loop.run(mode: "nested", for: .milliseconds(500))
    }
    let finished = DispatchSemaphore(value: 0)
    try worker.execute { finished.signal() }
    finished.wait()
    monitor.stop()
    #expect(log.all.isEmpty)
}

/// Durations no clock can add to an instant are clamped, not a crash.
@Test func hugeDurationsAreClamped() throws {
    let worker = PermanentThread(name: "huge")
    defer { worker.stop() }
    let monitor = StallMonitor(loop: worker.loop, threshold: .seconds(Int64.max), sampleInterval: .seconds(Int64.max / 2), logger: nil)
    #expect(monitor.threshold == .seconds(365 * 86400))
    monitor.start { _ in }
    _ = try worker.executeAndWait { usleep(1000) }
    monitor.stop()
    let cpu = CPUMonitor(window: .seconds(Int64.max), coolDown: .seconds(Int64.max), logger: nil)
    cpu.start { _ in }
    cpu.stop()
}

@Test func identicalStallsBackOffFibonacciStyle() {
    var backoff = StallBackoff(.standard)
    let now = ContinuousClock.now
    let reported = (1...13).filter { _ in backoff.decide([1, 2, 3], at: now).report }
    #expect(reported.count == 6)  // the 1st, 2nd, 3rd, 5th, 8th and 13th
    var counted = StallBackoff(.standard)
    let decisions = (1...5).map { _ in counted.decide([9], at: now) }
    #expect(decisions.map(\.report) == [true, true, true, false, true])
    #expect(decisions[4].suppressedBefore == 1)
    // A different stack is reported at once; ten quiet minutes start the count over.
    #expect(counted.decide([8], at: now).report)
    #expect(counted.decide([9], at: now + .seconds(601)).report)
}

@Test func aReportRoundTripsThroughJSON() throws {
    let report = StallReport(
        id: "x", processID: 7, threadName: "t", threadID: 8, mode: "m", phase: "timers", startedAt: Date(timeIntervalSince1970: 1000.5),
        duration: .milliseconds(1234), threadCPUTime: .milliseconds(5), cpuMeasuredOver: .milliseconds(1200),
        stacks: [StackSample(count: 2, frames: [StackFrame(address: 0x10, image: "/bin/x", imageOffset: 0x8, symbol: "f()", file: "a.swift", line: 3)])],
        sampleCount: 2, endReason: .movedOn)
    let data = try JSONEncoder().encode(report)
    let object = try #require(try JSONSerialization.jsonObject(with: data) as? [String: Any])
    #expect(object["durationNs"] as? Int == 1_234_000_000)
    #expect(object["startedAt"] as? Double == 1000.5)
    #expect(try JSONDecoder().decode(StallReport.self, from: data) == report)
}
}

/// Waits (polling) until `condition` holds, up to 10 s.
func waitFor(_ condition: () -> Bool) throws {
    let deadline = ContinuousClock.now + .seconds(10)
    while !condition() {
        guard ContinuousClock.now < deadline else { throw CancellationError() }
        usleep(1000)
    }
}
