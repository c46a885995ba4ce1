import Glibc
import RunLoopKit
import SharedTestSupport
import Synchronization
import Testing

@testable import RunLoopKit

// The `.pause` sequences (port messages, descriptor readiness): the loop's thread decides to pause
// the producer and applies it after releasing the channel's lock, while the consumer's task
// decides to resume it and applies that. Whatever order the two are applied in, the producer must
// end in the state decided last, or the sequence stops for good: the producer paused, and the
// channel, which thinks it running, never resumes it.

/// The interleaving forced, on a channel alone: deterministic.
@Suite struct LoopChannelPauseOrderTests {
    /// The loop's side decides to pause and is slow to apply it; meanwhile the consumer reads and
    /// decides to resume. The producer ends resumed.
    @Test func aLatePauseIsFollowedByTheResumeDecidedMeanwhile() async {
        let channel = LoopChannel<Int>(policy: .pause(limit: 1))
        let applied = TestMonitor<[String]>([])
        let release = TestEvent()
        channel.pauseProducer = {
            applied.update { $0.append("pausing") }
            _ = release.wait(timeout: concurrencyPatience)
            applied.update { $0.append("paused") }
        }
        channel.resumeProducer = { applied.update { $0.append("resumed") } }
        let producer = TestThread(name: "rlk-late-pause") { channel.push(1) }
        #expect(await applied.waitAsync(timeout: concurrencyPatience) { $0 == ["pausing"] })
        #expect(await channel.next() == 1)
        release.fire()
        #expect(await producer.joinAsync(timeout: concurrencyPatience))
        #expect(applied.read { $0 } == ["pausing", "paused", "resumed"])
    }

    /// The mirror image: while the consumer applies its resume, the loop's side pushes and
    /// decides to pause again. The producer ends paused.
    @Test func aPauseDecidedWhileAResumeIsAppliedIsAppliedAfterIt() async {
        let channel = LoopChannel<Int>(policy: .pause(limit: 1))
        let applied = Mutex<[String]>([])
        let pushedMeanwhile = Atomic<Bool>(false)
        channel.pauseProducer = { applied.locked { $0.append("paused") } }
        channel.resumeProducer = { [weak channel] in
            applied.locked { $0.append("resuming") }
            if !pushedMeanwhile.exchange(true, ordering: .relaxed) { channel?.push(2) }
            applied.locked { $0.append("resumed") }
        }
        channel.push(1)
        #expect(await channel.next() == 1)
        #expect(applied.locked { $0 } == ["paused", "resuming", "resumed", "paused"])
        #expect(await channel.next() == 2)
    }
}

/// The real sequences under storms of pauses and resumes. Serialized and exclusive: each test keeps
/// both cores busy for seconds, and a stall is detected as no progress for `concurrencyPatience`,
/// which other suites' load must not fake.
@Suite(.serialized, .exclusive(.robustness)) struct LoopAsyncSequenceStormTests {
    /// 20 runs; 3 under a sanitizer, whose storms (a tenth of the messages) still hold both cores
    /// and a pool thread for seconds a run, starving the suites that run beside them.
    static let runs = TestThreads.sanitized ? 3 : 20

    /// 300,000 messages from one sender thread to one `for await` consumer, with a buffer of one
    /// message: all delivered, in order, in each of 20 runs.
    ///
    /// The port is paused (taken out of its modes) when a message waits unread and resumed when
    /// the consumer has read it, but a sender that runs freely fills the port far faster than the
    /// loop and the consumer drain it: the loop then delivers batches of thousands, one pause each,
    /// a few dozen a run. So the sender yields its core after each of its first 10,000 sends: the
    /// loop then takes the messages one or two at a time, and the port is paused and resumed some
    /// thousands of times a run. The stall needs the loop's thread to be preempted in the few
    /// microseconds between deciding a pause and applying it, so it is a matter of chance: with
    /// pauses and resumes applied out of order, 5 runs of this test of 6 stalled on this 2-core
    /// machine (in its runs 1, 2, 2, 5 and 12), where the free-running sender alone did not in 20
    /// runs; `LoopChannelPauseOrderTests` force the interleaving. About 1.1-1.6 s a run here in a
    /// debug build.
    @Test func portMessagesAtABufferLimitOfOneAllArriveInOrder() async throws {
        let host = try #require(ModalLoop.start(name: "rlk-port-storm"))
        let total = TestThreads.scaled(300_000, minimum: 30_000)
        for run in 1...Self.runs {
            let outcome = await Self.sendThroughPort(host.loop, total: total, yieldingSends: total / 30)
            #expect(
                outcome.received == total, "run \(run): \(outcome.received) of \(total) delivered, then no progress")
            #expect(outcome.inOrder, "run \(run): out of order")
            if outcome.received != total || !outcome.inOrder { break }
        }
        #expect(await host.finish())
    }

    /// A worker writes a pipe one byte at a time while the consumer reads one byte per element:
    /// the descriptor source is paused when an element waits unread and resumed when the consumer
    /// asks again, thousands of times a run. Every byte is read while the writer keeps the pipe
    /// open (a source left paused would report only the hang-up), in each of 20 runs. With pauses
    /// and resumes applied out of order, 8 runs of this test of 8 stalled on this 2-core machine
    /// (in its runs 1, 1, 1, 1, 1, 2, 4 and 18). About 1.2-1.6 s a run here in a debug build.
    @Test func descriptorEventsUnderAPauseAndResumeStormAccountForEveryByte() async throws {
        let host = try #require(ModalLoop.start(name: "rlk-fd-storm"))
        // Below a pipe's 64 KiB, so the writer never blocks on a consumer that stalled.
        let total = TestThreads.scaled(40_000, minimum: 5_000)
        for run in 1...Self.runs {
            let outcome = try await Self.writeThroughPipe(host.loop, total: total)
            #expect(
                outcome.readBeforeHangUp == total,
                "run \(run): \(outcome.readBeforeHangUp) of \(total) bytes read before the writer gave up and hung up")
            #expect(outcome.readInAll == total, "run \(run): \(outcome.readInAll) of \(total) bytes read in all")
            if outcome.readBeforeHangUp != total { break }
        }
        #expect(await host.finish())
    }

    /// One run of the port storm: how many messages the consumer read, and whether in order. A
    /// stall (no message read for `concurrencyPatience`) cancels the consumer.
    private static func sendThroughPort(
        _ loop: RunLoop, total: Int, yieldingSends: Int
    ) async -> (received: Int, inOrder: Bool) {
        let (port, messages) = loop.messageStream(of: Int.self, capacity: 10_000_000, bufferLimit: 1)
        let progress = Progress()
        let sender = TestThread(name: "rlk-port-sender") {
            for message in 0..<total {
                do { try port.send(message) } catch { return }
                if message < yieldingSends { sched_yield() }
            }
        }
        let consumer = Task { () -> (Int, Bool) in
            var received = 0
            var inOrder = true
            for await message in messages {
                if message != received { inOrder = false }
                received += 1
                progress.advance(to: received, of: total)
                if received == total { break }
            }
            return (received, inOrder)
        }
        if !(await progress.reachesTotalWhileMoving()) { consumer.cancel() }
        let outcome = await consumer.value
        _ = port.invalidate()
        #expect(await sender.joinAsync(timeout: concurrencyPatience))
        return outcome
    }

    /// One run of the pipe storm: the bytes read while the writer kept the pipe open, and in all.
    private static func writeThroughPipe(
        _ loop: RunLoop, total: Int
    ) async throws -> (readBeforeHangUp: Int, readInAll: Int) {
        var fds: [Int32] = [0, 0]
        try #require(pipe(&fds) == 0)
        let (readEnd, writeEnd) = (fds[0], fds[1])
        defer { close(readEnd) }
        _ = fcntl(readEnd, F_SETFL, O_NONBLOCK)
        let events = try loop.events(of: readEnd)
        let progress = Progress()
        let readBeforeHangUp = TestMonitor(0)
        let writer = TestThread(name: "rlk-fd-writer") {
            var byte: UInt8 = 1
            for _ in 0..<total { _ = write(writeEnd, &byte, 1) }
            // The hang-up would end a stall (it is reported to a paused source): close only once
            // every byte is read, or once the consumer has stopped reading.
            _ = progress.reachesTotalWhileMovingBlocking()
            readBeforeHangUp.update { $0 = progress.count.load(ordering: .relaxed) }
            close(writeEnd)
        }
        let consumer = Task { () -> Int in
            var read = 0
            var byte: UInt8 = 0
            for await happened in events where happened.contains(.readable) {
                if Glibc.read(readEnd, &byte, 1) == 1 {
                    read += 1
                    progress.advance(to: read, of: total)
                }
            }
            // After the hang-up: what is left.
            while Glibc.read(readEnd, &byte, 1) == 1 { read += 1 }
            return read
        }
        // Not a time bound: the writer's own wait ends once the consumer stops moving.
        while !(await writer.joinAsync(timeout: concurrencyPatience)) {}
        // A source left paused may not even see the hang-up: then the consumer is cancelled.
        if await completes(within: concurrencyPatience, { await consumer.value }) == nil { consumer.cancel() }
        let readInAll = await consumer.value
        return (readBeforeHangUp.read { $0 }, readInAll)
    }
}

/// A consumer's progress: how far it got, and an event when it has read everything.
private final class Progress: Sendable {
    let count = Atomic<Int>(0)
    private let reached = TestEvent()

    /// The consumer has read `count` of `total`.
    func advance(to count: Int, of total: Int) {
        self.count.store(count, ordering: .relaxed)
        if count == total { reached.fire() }
    }

    /// Waits until the consumer has read everything; false once it has read nothing for
    /// `concurrencyPatience` (a stall fails the test instead of hanging it).
    func reachesTotalWhileMoving() async -> Bool {
        var seen = -1
        while !(await reached.waitAsync(timeout: concurrencyPatience) { $0 }) {
            let now = count.load(ordering: .relaxed)
            if now == seen { return false }
            seen = now
        }
        return true
    }

    /// The same, blocking the calling (dedicated) thread.
    func reachesTotalWhileMovingBlocking() -> Bool {
        var seen = -1
        while !reached.wait(timeout: concurrencyPatience) {
            let now = count.load(ordering: .relaxed)
            if now == seen { return false }
            seen = now
        }
        return true
    }
}
