import Dispatch
import Glibc
import RunLoopKit
import SharedTestSupport
@testable import RunLoopMonitor
import Synchronization
import Testing

/// Bounds as in StallMonitorTests: the monitor looks every sample interval, a heartbeat source
/// sends a heartbeat every `beat`, and a loaded 2-core machine adds up to `room`.
private let threshold = Duration.milliseconds(100)
private let interval = Duration.milliseconds(20)
private let beat = Duration.milliseconds(30)
private let room = Duration.milliseconds(300)

@Suite(.serialized, .exclusive(.monitor)) struct StallSourceTests {
    /// A serial DispatchQueue blocked in a named function: found by the heartbeat within
    /// threshold + heartbeat interval (+ room), with the function, phase `heartbeat` and the queue's
    /// thread.
    @Test func aBlockedDispatchQueueIsReportedWithItsFunction() throws {
        let queue = DispatchQueue(label: "rlk.test.queue")
        let source = HeartbeatStallSource(queue: queue, interval: beat)
        let log = EventLog<StallEvent>()
        let monitor = StallMonitor(loops: [], threshold: threshold, sampleInterval: interval, backoff: .none, logger: nil)
        monitor.watch(source)
        monitor.start { log.append($0) }
        defer { monitor.stop() }
        // Let a heartbeat find the queue's thread first (the block below runs on the same thread
        // when the queue is busy from one block to the next).
        let found = waitUntil { source.stallSnapshot().threadID != 0 }
        try #require(found)
        let blockStarted = TestEvent()
        queue.async {
            blockStarted.fire()
            monitorTestBlockingWait(until: .now + .milliseconds(500))
        }
        #expect(blockStarted.wait(timeout: .seconds(60)))
        let events = log.wait(for: 2)
        try #require(events.count == 2)
        let began = events[0].report
        let ended = events[1].report
        #expect(began.phase == "heartbeat")
        #expect(began.loop == "rlk.test.queue")
        #expect(began.duration >= threshold)
        #expect(began.duration <= threshold + beat + interval + room, "began after \(began.duration)")
        #expect(ended.endReason == .movedOn)
        #expect(ended.stuckIn == "monitorTestBlockingWait(until:)", "\(ended.stacks.first?.frames.compactMap(\.symbol) ?? [])")
        #expect(ended.cpuRatio < 0.05)
    }

    /// The main queue, which no RunLoopKit loop drains here (swift test's main thread is parked
    /// in dispatch_main, and libdispatch runs the main queue on a worker thread): a block that
    /// blocks it is reported, named, on the thread the heartbeat found.
    @Test func aBlockedMainQueueIsReported() throws {
        let log = EventLog<StallEvent>()
        let monitor = StallMonitor(loops: [], threshold: threshold, sampleInterval: interval, backoff: .none, logger: nil)
        let source = monitor.watch(DispatchQueue.main, heartbeat: beat)
        #expect(source.stallSourceName == "com.apple.main-thread")
        monitor.start { log.append($0) }
        defer { monitor.stop() }
        #expect(waitUntil(timeout: .seconds(60)) { source.stallSnapshot().threadID != 0 })
        DispatchQueue.main.async { monitorTestBlockingWait(until: .now + .milliseconds(400)) }
        let events = log.wait(for: 2)
        try #require(events.count == 2)
        #expect(events[1].report.stuckIn == "monitorTestBlockingWait(until:)", "\(events[1].report.stacks.first?.frames.compactMap(\.symbol) ?? [])")
        #expect(events[1].report.loop == "com.apple.main-thread")
    }

    /// `watch(threadID:name:)`: a thread named by its kernel id; a wrong id is a clear error.
    @Test func watchingAThreadByItsID() throws {
        let monitor = StallMonitor(loops: [], threshold: threshold, sampleInterval: interval, backoff: .none, logger: nil)
        let source = try monitor.watch(threadID: currentThreadID(), name: "me")
        #expect(monitor.watchedSources.contains { $0 === source })
        #expect(throws: ThreadStallSource.SourceError.noSuchThread(threadID: -5)) { try monitor.watch(threadID: -5, name: "x") }
    }

    /// A queue that never answers, from its first heartbeat on (suspended): a stall is reported,
    /// with no stack and a clear error, and stopping the monitor does not hang.
    @Test func aQueueThatNeverAnswersIsAStallWithoutAThread() throws {
        let queue = DispatchQueue(label: "rlk.test.suspended")
        queue.suspend()
        defer { queue.resume() }
        let source = HeartbeatStallSource(queue: queue, interval: beat)
        let log = EventLog<StallEvent>()
        let monitor = StallMonitor(loops: [], threshold: threshold, sampleInterval: interval, backoff: .none, logger: nil)
        monitor.watch(source)
        monitor.start { log.append($0) }
        let events = log.wait(for: 1)
        try #require(events.count == 1)
        let began = events[0].report
        #expect(began.threadID == 0)
        #expect(began.captureError == ThreadStackError.threadUnknown.description)
        #expect(began.item == "heartbeat 1 unanswered")
        monitor.stop()
        let all = log.all
        #expect(all.count == 2)
        #expect(all.last?.report.endReason == .monitorStopped)
    }

    /// A queue busy with many short blocks, each far below the threshold: no stall.
    @Test func aQueueBusyWithShortBlocksIsNotStalled() throws {
        let queue = DispatchQueue(label: "rlk.test.short")
        let source = HeartbeatStallSource(queue: queue, interval: beat)
        let log = EventLog<StallEvent>()
        let monitor = StallMonitor(loops: [], threshold: .milliseconds(300), sampleInterval: interval, backoff: .none, logger: nil)
        monitor.watch(source)
        monitor.start { log.append($0) }
        let done = TestEvent()
        let remaining = Atomic(400)
        @Sendable func next() {
            usleep(1000)
            if remaining.subtract(1, ordering: .relaxed).newValue > 0 { queue.async(execute: next) } else { done.fire() }
        }
        queue.async(execute: next)
        #expect(done.wait(timeout: .seconds(60)))
        monitor.stop()
        #expect(log.all.isEmpty, "\(log.all.map(\.report.item))")
    }

    /// A thread that reports its own work: a long unit of work is a stall named by the item it
    /// gave and blamed on its function; short ones are not.
    @Test func aThreadThatReportsItsWorkIsWatched() throws {
        let log = EventLog<StallEvent>()
        let monitor = StallMonitor(loops: [], threshold: threshold, sampleInterval: interval, backoff: .none, logger: nil)
        monitor.start { log.append($0) }
        defer { monitor.stop() }
        let ready = TestMonitor<ThreadStallSource?>(nil)
        let thread = NamedThread(name: "game-loop") {
            let source = ThreadStallSource.current(name: "game")
            ready.update { $0 = source }
            for _ in 0..<50 {
                source.beat()
                usleep(2000)
            }
            source.begin("level load")
            _ = monitorTestCrunch(until: .now + .milliseconds(400))
            source.end()
        }
        _ = ready.wait(timeout: .seconds(60)) { $0 != nil }
        let source = try #require(ready.read { $0 })
        monitor.watch(source)
        let events = log.wait(for: 2)
        thread.join()
        try #require(events.count == 2)
        let ended = events[1].report
        #expect(ended.item == "level load")
        #expect(ended.loop == "game")
        #expect(ended.threadName == "game-loop")
        #expect(ended.stuckIn == "monitorTestCrunch(until:)")
        #expect(ended.duration >= .milliseconds(400) - interval - .milliseconds(150))
    }

    /// A thread id that does not exist: a clear error, not a source.
    @Test func aThreadIDThatDoesNotExistIsAnError() {
        #expect(throws: ThreadStallSource.SourceError.noSuchThread(threadID: 999_999_999)) {
            try ThreadStallSource(threadID: 999_999_999, name: "ghost")
        }
        #expect(ThreadStallSource.SourceError.noSuchThread(threadID: 7).description.contains("no thread 7 in this process"))
    }

    /// A watched thread that exits is forgotten, with no stall; unwatching a source ends its
    /// stall, cut short.
    @Test func exitedThreadsAreForgottenAndUnwatchEndsAStall() throws {
        let log = EventLog<StallEvent>()
        let monitor = StallMonitor(loops: [], threshold: threshold, sampleInterval: interval, backoff: .none, logger: nil)
        monitor.start { log.append($0) }
        defer { monitor.stop() }
        let exiting = TestMonitor<ThreadStallSource?>(nil)
        let thread = NamedThread(name: "short-lived") { exiting.update { $0 = ThreadStallSource.current(name: "short") } }
        thread.join()
        let gone = try #require(exiting.read { $0 })
        monitor.watch(gone)
        #expect(waitUntil(timeout: .seconds(60)) { !monitor.watchedSources.contains { $0 === gone } })
        // A source kept busy by hand: unwatched mid-stall.
        let held = try ThreadStallSource(threadID: currentThreadID(), name: "held")
        held.begin("held")
        monitor.watch(held)
        let began = log.wait(for: 1)
        try #require(began.count == 1)
        monitor.unwatch(held)
        let events = log.wait(for: 2)
        try #require(events.count == 2)
        #expect(events[1].report.endReason == .monitorStopped)
        held.end()
    }
}
