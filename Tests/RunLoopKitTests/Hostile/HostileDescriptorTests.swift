import Glibc
import SharedTestSupport
import Synchronization
import SystemPackage
import Testing

@testable import RunLoopKit

/// Findings 4, 7 and 12: descriptor sources facing descriptors that are closed behind their back,
/// that epoll cannot watch, or that another source watches too.
///
/// Serialized: the tests close descriptor numbers and reuse them, from 600 up (see
/// ``duplicate(_:atLeast:)``), and measure a loop thread's CPU time.
@Suite(.serialized) struct HostileDescriptorTests {
    // MARK: Finding 4: a descriptor closed behind the source's back while a dup keeps its file open

    /// What the closed-descriptor scenarios saw.
    struct ClosedOutcome: Sendable {
        /// Calls of the first source's handler without `.closed`, and with it.
        var readableCalls = 0
        var closedCalls = 0
        var firstSourceValid = true
        /// `afterWaiting` calls and the loop thread's CPU time in the 200 ms idle run that follows.
        var idleWakeups = 0
        var idleCPUMilliseconds = 0.0
        /// Variant: what the source on the new pipe (same number) read, and whether it is valid.
        var secondSourceText = ""
        var secondSourceValid = false
    }

    /// Runs the scenario: a pipe's read end (numbered 600 or above), duplicated so that its file
    /// stays open; a source on the original number (not owning it) added while the loop runs;
    /// 20 ms later, from a timer, the original number is closed and a byte written. With
    /// `reuseNumber`, the timer then gives the number to a new pipe, adds a source on it, and writes
    /// to both pipes. The loop runs until the first source is told `.closed` (or, with
    /// `reuseNumber`, the second source has read its data), for at most 2 s; then an idle run of
    /// 200 ms (the mode held by a source that is never signalled) measures whether the loop sleeps.
    static func closedBehindTheSourcesBack(reuseNumber: Bool) -> ClosedOutcome {
        final class Tally: Sendable {
            let readable = Atomic<Int>(0)
            let closed = Atomic<Int>(0)
            let wakeups = Atomic<Int>(0)
            let secondBytes = Mutex<[UInt8]>([])
            let second = Mutex<FileDescriptorSource?>(nil)
            let extraDescriptors = Mutex<[Int32]>([])
        }
        let tally = Tally()
        let loop = RunLoop.current
        let keepAlive = RunLoopSource {}
        loop.add(keepAlive, forMode: .default)
        let observer = RunLoopObserver(activities: .afterWaiting) { _, _ in tally.wakeups.add(1, ordering: .relaxed) }
        loop.add(observer, forMode: .default)
        let (readEnd, writeEnd) = hostilePipe()
        let keptOpen = dup(readEnd)
        let first: FileDescriptorSource
        do {
            first = try FileDescriptorSource(descriptor: readEnd, watching: .readable, ownsDescriptor: false) {
                _, events in
                if events.contains(.closed) {
                    tally.closed.add(1, ordering: .relaxed)
                    if !reuseNumber { RunLoop.current.stop() }
                } else {
                    // The number is closed: there is nothing this handler could read.
                    tally.readable.add(1, ordering: .relaxed)
                }
            }
        } catch {
            Issue.record("FileDescriptorSource on a pipe failed: \(error)")
            return ClosedOutcome()
        }
        // Added while the loop runs (from a block), then closed and written to once the loop has
        // slept with the descriptor watched (from a timer).
        loop.perform { RunLoop.current.add(first, forMode: .default) }
        let hostile = RunLoopTimer(after: .milliseconds(20)) { _ in
            close(readEnd)
            writeAll(writeEnd, "x")
            guard reuseNumber else { return }
            var fds: [Int32] = [-1, -1]
            precondition(pipe(&fds) == 0, "pipe failed: errno \(errno)")
            // Non-blocking: a handler called for data that is not its own must not block.
            _ = fcntl(fds[0], F_SETFL, fcntl(fds[0], F_GETFL) | O_NONBLOCK)
            precondition(dup2(fds[0], readEnd) == readEnd, "dup2 failed: errno \(errno)")
            close(fds[0])
            tally.extraDescriptors.locked { $0 = [readEnd, fds[1]] }
            do {
                let second = try FileDescriptorSource(descriptor: readEnd, watching: .readable) { source, _ in
                    let bytes = readAvailable(source.descriptor)
                    let count = tally.secondBytes.locked { all in
                        all += bytes
                        return all.count
                    }
                    if count >= 3 { RunLoop.current.stop() }
                }
                tally.second.locked { $0 = second }
                RunLoop.current.add(second, forMode: .default)
            } catch {
                Issue.record("FileDescriptorSource on the new pipe failed: \(error)")
            }
            writeAll(writeEnd, "old")
            writeAll(fds[1], "new")
        }
        loop.add(hostile, forMode: .default)
        loop.run(mode: .default, for: .seconds(2))

        let wakeupsBefore = tally.wakeups.load(ordering: .relaxed)
        let cpuBefore = threadCPUMilliseconds()
        loop.run(mode: .default, for: .milliseconds(200))
        var outcome = ClosedOutcome()
        outcome.idleCPUMilliseconds = threadCPUMilliseconds() - cpuBefore
        outcome.idleWakeups = tally.wakeups.load(ordering: .relaxed) - wakeupsBefore
        outcome.readableCalls = tally.readable.load(ordering: .relaxed)
        outcome.closedCalls = tally.closed.load(ordering: .relaxed)
        outcome.firstSourceValid = first.isValid
        outcome.secondSourceText = String(decoding: tally.secondBytes.locked { $0 }, as: UTF8.self)
        let second = tally.second.locked { $0 }
        outcome.secondSourceValid = second?.isValid ?? false

        first.invalidate()
        second?.invalidate()
        // The second source's handler captures `tally`, which holds the source: a cycle this
        // test made, broken here (a descriptor source keeps its handler until it is freed).
        tally.second.locked { $0 = nil }
        hostile.invalidate()
        observer.invalidate()
        loop.remove(keepAlive, forMode: .default)
        close(keptOpen)
        close(writeEnd)
        // The original number was closed by the timer; with `reuseNumber` it names the new pipe.
        for fd in tally.extraDescriptors.locked({ $0 }) { close(fd) }
        return outcome
    }

    /// The handler is told `.closed` once (never `.readable` on and on), the source is
    /// invalidated, and the loop sleeps again: in 200 ms idle it wakes at most 5 times (once is
    /// expected: the run's end) and uses under 50 ms of CPU (a loop spinning on the stale
    /// readiness uses nearly all 200 ms; 50 ms is room for a loaded machine).
    @Test func aDescriptorClosedBehindTheSourcesBackIsReportedClosedOnceAndTheLoopSleeps() async {
        let outcome = await TestThreads.run(name: "hl-closed-fd", timeout: .seconds(30)) {
            Self.closedBehindTheSourcesBack(reuseNumber: false)
        }
        guard let outcome else { return }
        #expect(outcome.closedCalls == 1, "told .closed \(outcome.closedCalls) times")
        #expect(outcome.readableCalls <= 1, "told .readable \(outcome.readableCalls) times for a closed number")
        #expect(!outcome.firstSourceValid, "the source is invalidated")
        #expect(outcome.idleWakeups <= 5, "an idle loop woke \(outcome.idleWakeups) times in 200 ms")
        #expect(
            outcome.idleCPUMilliseconds < 50, "an idle loop used \(outcome.idleCPUMilliseconds) ms of CPU in 200 ms")
    }

    /// The closed number is reused by a new pipe at once: the source on the new pipe reads only
    /// its own data ("new", not the old pipe's "old"), the old source is told `.closed` once, and
    /// the loop does not spin on the old file, which the dup keeps open (with unread data).
    @Test func aClosedNumberReusedByANewPipeDeliversOnlyTheNewDataAndTheLoopSleeps() async {
        let outcome = await TestThreads.run(name: "hl-reused-fd", timeout: .seconds(30)) {
            Self.closedBehindTheSourcesBack(reuseNumber: true)
        }
        guard let outcome else { return }
        #expect(
            outcome.secondSourceText == "new", "the new pipe's source read \(outcome.secondSourceText.debugDescription)"
        )
        #expect(outcome.secondSourceValid, "the new pipe's source is still valid")
        #expect(outcome.closedCalls == 1, "the old source was told .closed \(outcome.closedCalls) times")
        #expect(outcome.readableCalls <= 1, "the old source was told .readable \(outcome.readableCalls) times")
        #expect(!outcome.firstSourceValid, "the old source is invalidated")
        #expect(outcome.idleWakeups <= 5, "an idle loop woke \(outcome.idleWakeups) times in 200 ms")
        #expect(
            outcome.idleCPUMilliseconds < 50, "an idle loop used \(outcome.idleCPUMilliseconds) ms of CPU in 200 ms")
    }

    // MARK: Finding 7: /dev/null and /dev/zero

    /// epoll refuses neither, yet they are always ready, like the regular files the source already
    /// rejects: a source on them would be called on every pass. Rejected with `Errno.notPermitted`.
    @Test(arguments: ["/dev/null", "/dev/zero"])
    func aSourceOnAnAlwaysReadyDeviceIsRejectedWithNotPermitted(_ path: String) {
        let low = open(path, O_RDONLY | O_CLOEXEC)
        guard low >= 0 else {
            Issue.record("cannot open \(path): errno \(errno)")
            return
        }
        let fd = duplicate(low, atLeast: 600)
        close(low)
        #expect(throws: Errno.notPermitted) {
            _ = try FileDescriptorSource(descriptor: fd, ownsDescriptor: false) { _, _ in }
        }
        #expect(close(fd) == 0, "the caller's descriptor is still open")
    }

    /// With `ownsDescriptor: true` and the init throwing, the caller still owns the descriptor
    /// (closing it succeeds), and 100 attempts on each device leak no descriptor. In
    /// `HostileProbe`, which counts its descriptors exactly (and where a source that closes the
    /// caller's number cannot close another test's descriptor that reused it).
    @Test func aRejectedOwningSourceClosesNothingAndLeaksNothing() throws {
        let probe = try #require(runHostileProbe("dev-null"))
        try #require(probe.completed, "\(probe.report)")
        #expect(probe.int("/dev/null rejected with notPermitted") == 100, "\(probe.report)")
        #expect(probe.int("/dev/zero rejected with notPermitted") == 100, "\(probe.report)")
        #expect(probe.int("caller's close succeeded") == 200, "\(probe.report)")
        #expect(probe.int("descriptors leaked") == 0, "\(probe.report)")
    }

    // MARK: Finding 12: a read source and a write source on one socket

    /// Which source the test invalidates once both have worked.
    enum Invalidated: String, CaseIterable, Sendable {
        case writeSource
        case readSource
    }

    struct SharedSocketOutcome: Sendable {
        var firstRun: RunLoop.RunResult = .finished
        var bothValidAfterFirstRun = false
        var readText = ""
        var writableCalls = 0
        var readTerminal: [String] = []
        var writeTerminal: [String] = []
        var secondRun: RunLoop.RunResult = .finished
        var survivorValid = false
    }

    /// A socket watched by two sources on one loop, one for `.readable` and one for `.writable`:
    /// the read source gets the peer's data, the write source `.writable`, neither is told
    /// `.closed` (or anything terminal) nor invalidated; then one is invalidated and the other
    /// keeps working (the read source reads the next data, the write source is told `.writable`
    /// again). Each run stops as soon as its goal is met, within 2 s.
    @Test(arguments: Invalidated.allCases)
    func aReadSourceAndAWriteSourceOnOneSocketBothWork(_ invalidated: Invalidated) async {
        let outcome = await TestThreads.run(name: "hl-shared-fd", timeout: .seconds(30)) { () -> SharedSocketOutcome in
            final class Log: Sendable {
                let phase = Atomic<Int>(1)
                let readBytes = Mutex<[UInt8]>([])
                let readTerminal = Mutex<[String]>([])
                let writable = Atomic<Int>(0)
                let writableTarget = Atomic<Int>(Int.max)
                let writeTerminal = Mutex<[String]>([])

                var readText: String { String(decoding: readBytes.locked { $0 }, as: UTF8.self) }

                func stopIfDone() {
                    let done: Bool
                    switch phase.load(ordering: .relaxed) {
                    case 1: done = readText == "ping" && writable.load(ordering: .relaxed) >= 1
                    case 2: done = readText == "pingpong"
                    default: done = writable.load(ordering: .relaxed) >= writableTarget.load(ordering: .relaxed)
                    }
                    if done { RunLoop.current.stop() }
                }
            }
            let log = Log()
            var fds: [Int32] = [-1, -1]
            precondition(socketpair(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0, &fds) == 0, "socketpair: errno \(errno)")
            let (mine, peer) = (fds[0], fds[1])
            _ = fcntl(mine, F_SETFL, fcntl(mine, F_GETFL) | O_NONBLOCK)
            defer {
                close(mine)
                close(peer)
            }
            let terminal: FileDescriptorSource.Events = [.closed, .hangUp, .error]
            let reader: FileDescriptorSource
            let writer: FileDescriptorSource
            do {
                reader = try FileDescriptorSource(descriptor: mine, watching: .readable) { source, events in
                    if !events.isDisjoint(with: terminal) { log.readTerminal.locked { $0.append("\(events)") } }
                    if events.contains(.readable) {
                        let bytes = readAvailable(source.descriptor)
                        log.readBytes.locked { $0 += bytes }
                    }
                    log.stopIfDone()
                }
                writer = try FileDescriptorSource(descriptor: mine, watching: .writable) { _, events in
                    if !events.isDisjoint(with: terminal) { log.writeTerminal.locked { $0.append("\(events)") } }
                    if events.contains(.writable) { log.writable.add(1, ordering: .relaxed) }
                    log.stopIfDone()
                }
            } catch {
                Issue.record("FileDescriptorSource on a socket failed: \(error)")
                return SharedSocketOutcome()
            }
            let loop = RunLoop.current
            loop.add(reader, forMode: .default)
            loop.add(writer, forMode: .default)
            writeAll(peer, "ping")
            var outcome = SharedSocketOutcome()
            outcome.firstRun = loop.run(mode: .default, for: .seconds(2))
            outcome.bothValidAfterFirstRun = reader.isValid && writer.isValid
            switch invalidated {
            case .writeSource:
                writer.invalidate()
                log.phase.store(2, ordering: .relaxed)
                writeAll(peer, "pong")
                outcome.secondRun = loop.run(mode: .default, for: .seconds(2))
                outcome.survivorValid = reader.isValid
            case .readSource:
                reader.invalidate()
                log.writableTarget.store(log.writable.load(ordering: .relaxed) + 1, ordering: .relaxed)
                log.phase.store(3, ordering: .relaxed)
                outcome.secondRun = loop.run(mode: .default, for: .seconds(2))
                outcome.survivorValid = writer.isValid
            }
            outcome.readText = log.readText
            outcome.writableCalls = log.writable.load(ordering: .relaxed)
            outcome.readTerminal = log.readTerminal.locked { $0 }
            outcome.writeTerminal = log.writeTerminal.locked { $0 }
            reader.invalidate()
            writer.invalidate()
            return outcome
        }
        guard let outcome else { return }
        #expect(
            outcome.firstRun == .stopped,
            "the read source got \(outcome.readText.debugDescription), the write source \(outcome.writableCalls) .writable calls"
        )
        #expect(outcome.bothValidAfterFirstRun, "both sources are still valid")
        #expect(outcome.readTerminal.isEmpty, "the read source was told \(outcome.readTerminal)")
        #expect(outcome.writeTerminal.isEmpty, "the write source was told \(outcome.writeTerminal)")
        #expect(
            outcome.secondRun == .stopped, "after invalidating the \(invalidated), the other did not work on its own")
        #expect(outcome.survivorValid, "the other source is still valid")
        if invalidated == .writeSource {
            #expect(outcome.readText == "pingpong")
        }
    }
}
