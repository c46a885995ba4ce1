import Foundation
import Glibc
import SharedTestSupport
@testable import RunLoopMonitor
import RunLoopKit
import Synchronization
import Testing

import class RunLoopKit.RunLoop

/// Every thread's stack at once (the seeds' `HCCCallStackTypeAll`), with the monitor's rules: a
/// thread blocked in the kernel is read without a signal, a running one is interrupted briefly.
@Suite(.serialized, .exclusive(.monitor)) struct AllThreadsCaptureTests {
@Test func everyThreadIsListedWithItsStackAndABlockedReadIsNotInterrupted() throws {
    var pipeEnds: [Int32] = [0, 0]
    #expect(pipe(&pipeEnds) == 0)
    defer { close(pipeEnds[0]); close(pipeEnds[1]) }
    let readEnd = pipeEnds[0]
    let outcome = Mutex<(Int, Int32)?>(nil)
    let reader = NamedThread(name: "all-reader") {
        let result = parkedTestRead(readEnd)
        outcome.locked { $0 = result }
    }
    let stop = Atomic<Bool>(false)
    let spinner = NamedThread(name: "all-spinner") {
        while !stop.load(ordering: .relaxed) { _ = monitorTestCrunch(until: .now + .milliseconds(1)) }
    }
    defer {
        stop.store(true, ordering: .relaxed)
        spinner.join()
    }
    while (ProcessThreads.blockedCall(of: reader.threadID) ?? "running").hasPrefix("running") { usleep(200) }

    let threads = ThreadStack.captureAll()

    let ids = threads.map(\.threadID)
    #expect(ids == ids.sorted())
    #expect(threads.filter(\.isCallingThread).map(\.threadID) == [ProcessThreads.ownID])
    let read = try #require(threads.first { $0.threadID == reader.threadID })
    #expect(read.name == "all-reader")
    #expect(read.error == nil)
    if ThreadStack.parkedThreadsReadWithoutSignal { #expect(read.unwinder == .parkedInKernel) }
    #expect(read.frames.contains { $0.symbol?.contains("parkedTestRead") == true }, "\(read)")
    let spin = try #require(threads.first { $0.threadID == spinner.threadID })
    #expect(spin.error == nil, "\(spin)")
    #expect(spin.frames.contains { $0.symbol?.contains("monitorTestCrunch") == true }, "\(spin)")
    // The read went on: it returns only when its byte arrives.
    #expect(outcome.locked { $0 } == nil)
    var byte: UInt8 = 7
    #expect(write(pipeEnds[1], &byte, 1) == 1)
    reader.join()
    let (result, _) = try #require(outcome.locked { $0 })
    #expect(result == 1)
    // A description per thread: its id, name and frames.
    #expect(read.description.hasPrefix("thread \(reader.threadID) 'all-reader'\n  0 "))
}

/// A monitor made with `allThreads: true` attaches every thread's stack to a reported stall,
/// and the report round-trips through JSON with them.
@Test func aStallReportCarriesEveryThreadsStackWhenAsked() throws {
    let worker = PermanentThread(name: "all-stalled")
    defer { worker.stop() }
    let log = EventLog<StallEvent>()
    let monitor = StallMonitor(
        loop: worker.loop, threshold: .milliseconds(100), sampleInterval: .milliseconds(20), allThreads: true,
        logger: nil)
    monitor.start { log.append($0) }
    defer { monitor.stop() }
    // A blocked stall: the worker's snapshot is read where it is parked, so it holds the
    // whole stack (a busy thread's single snapshot can end early at an instruction whose
    // unwind tables are wrong, which a stall's many samples make up for and one does not).
    // The stalled thread is captured first, while it is still stalled; a second of stall
    // leaves room for a loaded machine.
    try worker.execute { _ = parkedTestUsleep(1_000_000) }
    // A sanitizer slows the snapshot of every thread (each running thread's capture waits
    // until the sanitizer delivers the signal): up to a minute.
    let events = log.wait(for: 2, timeout: .seconds(60))
    try #require(events.count == 2)
    let began = events[0].report
    let all = try #require(began.allThreads)
    let stalled = try #require(all.first { $0.threadID == worker.threadID })
    #expect(stalled.frames.contains { $0.symbol?.contains("parkedTestUsleep") == true }, "\(stalled)")
    #expect(all.count >= 3)  // the test's thread, the worker, the monitor's threads
    let decoded = try JSONDecoder().decode(StallReport.self, from: JSONEncoder().encode(began))
    #expect(decoded.allThreads == began.allThreads)
    // Without the option, none.
    let plain = StallMonitor(loop: worker.loop, logger: nil)
    #expect(!plain.capturesAllThreads)
}
}
