import CRunLoopKit
import Glibc
import SharedTestSupport
import Synchronization
import SystemPackage
import Testing

import class RunLoopKit.RunLoop

@testable import RunLoopKit

// FileDescriptorSource (issue 4): bad descriptors are rejected at creation with an `Errno`, a
// hang-up is delivered once and invalidates the source while the loop keeps running, and a
// descriptor number the kernel reuses never delivers the new descriptor's events to the old
// source.
//
// Descriptor numbers are shared by every test running in this process, so no test frees a number
// and then counts on it staying free: a number is "reused" atomically with `dup2` (which closes
// what the number named and makes it name another descriptor in one step), and a "closed" number
// is taken from above 900 (numbers are handed out lowest first, so nothing else gets one that
// high unless 900 descriptors are open).

/// What a source's handler saw: the events of each call and the bytes it read.
struct DescriptorLog: Sendable {
    var events: [FileDescriptorSource.Events] = []
    var bytes: [UInt8] = []
    var text: String { String(decoding: bytes, as: UTF8.self) }
}

/// A handler that records its events and, when readable (or hung up), reads everything there is.
func recordingHandler(
    _ log: TestMonitor<DescriptorLog>
) -> @Sendable (FileDescriptorSource, FileDescriptorSource.Events) -> Void {
    { source, events in
        var data: [UInt8] = []
        if !events.isDisjoint(with: [.readable, .hangUp]) {
            var buffer = [UInt8](repeating: 0, count: 256)
            while true {
                let count = read(source.descriptor, &buffer, buffer.count)
                if count <= 0 { break }
                data += buffer[0..<count]
            }
        }
        log.update { log in
            log.events.append(events)
            log.bytes += data
        }
    }
}

/// Writes `text` to `fd` (a pipe's write end).
func writeText(_ fd: Int32, _ text: String) {
    let bytes = Array(text.utf8)
    let written = write(fd, bytes, bytes.count)
    precondition(written == bytes.count, "write failed: errno \(errno)")
}

/// A descriptor number ≥ `minimum` naming a new eventfd.
func highEventFD(atLeast minimum: Int32) -> Int32 {
    let low = s1EventFD()
    defer { close(low) }
    let high = fcntl(low, F_DUPFD, minimum)
    precondition(high >= minimum, "F_DUPFD failed: errno \(errno)")
    _ = fcntl(high, F_SETFD, FD_CLOEXEC)
    return high
}

/// Whether `fd` is open.
func isOpen(_ fd: Int32) -> Bool { fcntl(fd, F_GETFD) != -1 }

@Suite(.serialized) struct FileDescriptorSourceTests {
    // MARK: Bad input

    /// -1, a closed descriptor and a number past any limit are rejected with
    /// `Errno.badFileDescriptor`, at creation.
    @Test func invalidDescriptorsAreRejectedWithBadFileDescriptor() {
        #expect(throws: Errno.badFileDescriptor) { try FileDescriptorSource(descriptor: -1) { _, _ in } }
        let closed = highEventFD(atLeast: 900)
        close(closed)
        #expect(throws: Errno.badFileDescriptor) { try FileDescriptorSource(descriptor: closed) { _, _ in } }
        #expect(throws: Errno.badFileDescriptor) {
            try FileDescriptorSource(descriptor: closed, ownsDescriptor: true) { _, _ in }
        }
        #expect(throws: Errno.badFileDescriptor) { try FileDescriptorSource(descriptor: Int32.max) { _, _ in } }
    }

    /// A regular file or a directory (which epoll cannot watch: they are always ready) is
    /// rejected with `Errno.notPermitted`; a rejected source does not close the descriptor even
    /// when it was to own it.
    @Test func regularFilesAndDirectoriesAreRejectedWithNotPermitted() {
        var template = Array("/tmp/rlk-fd-test-XXXXXX".utf8CString)
        let file = mkstemp(&template)
        #expect(file >= 0)
        defer {
            unlink(template)
            close(file)
        }
        #expect(throws: Errno.notPermitted) { try FileDescriptorSource(descriptor: file) { _, _ in } }
        #expect(throws: Errno.notPermitted) {
            try FileDescriptorSource(descriptor: file, ownsDescriptor: true) { _, _ in }
        }
        #expect(isOpen(file), "a rejected source leaves the descriptor open")
        let directory = open("/tmp", O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        #expect(directory >= 0)
        defer { close(directory) }
        #expect(throws: Errno.notPermitted) { try FileDescriptorSource(descriptor: directory) { _, _ in } }
    }

    /// After rejections the loop keeps working: a valid source on the same loop fires.
    @Test func rejectionsLeaveTheLoopWorking() async {
        let outcome = await TestThreads.run(name: "rlk-fd-bad") { () -> [String] in
            let loop = RunLoop.current
            var trace: [String] = []
            for bad in [Int32(-1), Int32.max] {
                do {
                    let source = try FileDescriptorSource(descriptor: bad) { _, _ in }
                    loop.add(source, forMode: .default)
                    trace.append("accepted \(bad)")
                } catch {
                    trace.append("rejected: \(error)")
                }
            }
            let fd = s1EventFD()
            defer { close(fd) }
            let fired = Mutex(0)
            guard
                let good = try? FileDescriptorSource(
                    descriptor: fd,
                    handler: { source, _ in
                        var counter: UInt64 = 0
                        _ = read(source.descriptor, &counter, 8)
                        fired.locked { $0 += 1 }
                    })
            else { return trace + ["eventfd rejected"] }
            loop.add(good, forMode: .default)
            s1Signal(fd)
            trace.append("run: \(loop.run(mode: .default, for: .seconds(5), returnAfterSourceHandled: true))")
            trace.append("fired: \(fired.locked { $0 })")
            good.invalidate()
            return trace
        }
        let rejected = "rejected: \(Errno.badFileDescriptor)"
        #expect(outcome == [rejected, rejected, "run: handledSource", "fired: 1"])
    }

    // MARK: Readiness

    /// Level-triggered: while the descriptor stays readable, every pass calls the handler; once
    /// it is read, none does.
    @Test func readinessIsLevelTriggered() async {
        let outcome = await TestThreads.run(name: "rlk-fd-level") { () -> [String] in
            let loop = RunLoop.current
            let fd = s1EventFD()
            defer { close(fd) }
            let calls = Mutex<[String]>([])
            guard
                let source = try? FileDescriptorSource(
                    descriptor: fd,
                    handler: { _, events in
                        calls.locked { $0.append("\(events)") }
                    })
            else { return ["eventfd rejected"] }
            loop.add(source, forMode: .default)
            s1Signal(fd)
            var results: [String] = []
            for _ in 0..<3 { results.append("\(loop.run(mode: .default, for: .zero, returnAfterSourceHandled: true))") }
            var counter: UInt64 = 0
            _ = read(fd, &counter, 8)
            results.append("\(loop.run(mode: .default, for: .zero, returnAfterSourceHandled: true))")
            source.invalidate()
            return results + calls.locked { $0 }
        }
        #expect(
            outcome == [
                "handledSource", "handledSource", "handledSource", "timedOut", "readable", "readable", "readable",
            ])
    }

    /// A pipe whose write end closes: the handler reads all the data, is told `.hangUp` exactly
    /// once (with the last data or after it), then the source is invalid, out of the loop, and
    /// never called again, while the loop keeps running.
    @Test func aPipeWhoseWriterClosesDeliversHangUpAndTheSourceBecomesInvalid() async throws {
        let pipe = s1Pipe()
        let log = TestMonitor(DescriptorLog())
        let source = try FileDescriptorSource(
            descriptor: pipe.read, ownsDescriptor: true, handler: recordingHandler(log))
        guard let host = PortLoop.start(name: "rlk-fd-hangup", setup: { $0.add(source, forMode: .default) }) else {
            return
        }
        writeText(pipe.write, "abc")
        #expect(log.wait(timeout: .seconds(10)) { $0.bytes.count == 3 }, "the first data woke the loop")
        writeText(pipe.write, "de")
        close(pipe.write)
        let hungUp = log.wait(timeout: .seconds(10)) { $0.events.contains { $0.contains(.hangUp) } }
        #expect(hungUp, "the hang-up was delivered: \(log.read { $0.events })")
        // A block queued now runs after the handler has returned (and the source was invalidated).
        let after = Mutex<(valid: Bool, contained: Bool)?>(nil)
        let loop = host.loop
        #expect(host.sync { after.locked { $0 = (source.isValid, loop.contains(source, inMode: .default)) } })
        #expect(host.sync(), "the loop keeps running")
        let final = log.read { $0 }
        #expect(final.text == "abcde", "all data read")
        #expect(final.events.filter { $0.contains(.hangUp) }.count == 1, "one hang-up call: \(final.events)")
        #expect(final.events.last?.contains(.hangUp) == true, "no call after the hang-up: \(final.events)")
        #expect(after.locked { $0?.valid } == false, "invalid after the hang-up")
        #expect(after.locked { $0?.contained } == false, "removed from the loop")
        #expect(await host.shutdown())
    }

    // MARK: Reused descriptor numbers

    /// The old source's descriptor is closed behind its back and its number reused for another
    /// pipe: the old handler never sees that pipe's data, neither before a new source watches the
    /// number nor after; the new source gets all of it (also after the old source is told
    /// `.closed` and invalidated, which must not unregister the number it no longer owns).
    @Test func aReusedNumberNeverDeliversToTheOldSource() async throws {
        let first = s1Pipe()
        let second = s1Pipe()
        let number = first.read
        let oldLog = TestMonitor(DescriptorLog())
        let newLog = TestMonitor(DescriptorLog())
        let old = try FileDescriptorSource(descriptor: number, handler: recordingHandler(oldLog))
        guard let host = PortLoop.start(name: "rlk-fd-reuse", setup: { $0.add(old, forMode: .default) }) else {
            return
        }
        defer {
            close(first.write)
            close(second.write)
        }
        // The old source works.
        writeText(first.write, "a")
        #expect(oldLog.wait(timeout: .seconds(10)) { $0.text == "a" })
        // Close behind its back and reuse the number for the second pipe, in one step.
        #expect(dup2(second.read, number) == number)
        close(second.read)
        writeText(second.write, "b")
        // Two passes of the loop (each perform wakes it): a stale registration would report now.
        #expect(host.sync())
        #expect(host.sync())
        #expect(oldLog.read { $0.events } == [.readable], "nothing for the reused number")
        // A new source on the number gets what is there and what comes later.
        let new = try FileDescriptorSource(descriptor: number, handler: recordingHandler(newLog))
        host.loop.add(new, forMode: .default)
        #expect(newLog.wait(timeout: .seconds(10)) { $0.text == "b" }, "\(newLog.read { $0.events })")
        writeText(second.write, "c")
        #expect(newLog.wait(timeout: .seconds(10)) { $0.text == "bc" }, "\(newLog.read { $0.events })")
        #expect(host.sync())
        let oldEvents = oldLog.read { $0 }
        #expect(oldEvents.text == "a", "the old handler read nothing of the new pipe")
        #expect(
            oldEvents.events.dropFirst().allSatisfy { $0 == .closed },
            "after its first read, at most .closed: \(oldEvents.events)")
        #expect(!old.isValid, "the old source was found closed when the number was reused")
        new.invalidate()
        old.invalidate()
        close(number)
        #expect(await host.shutdown())
    }

    /// A source created on a descriptor that is then closed and its number reused, before the
    /// source is added: adding it must not make it watch the new descriptor.
    @Test func aSourceAddedAfterItsNumberWasReusedSeesNothingOfTheNewDescriptor() async throws {
        let first = s1Pipe()
        let second = s1Pipe()
        let number = first.read
        let oldLog = TestMonitor(DescriptorLog())
        let old = try FileDescriptorSource(descriptor: number, handler: recordingHandler(oldLog))
        #expect(dup2(second.read, number) == number)
        close(second.read)
        guard let host = PortLoop.start(name: "rlk-fd-reuse-2", setup: { $0.add(old, forMode: .default) }) else {
            return
        }
        writeText(second.write, "b")
        #expect(host.sync())
        #expect(host.sync())
        let oldEvents = oldLog.read { $0 }
        #expect(oldEvents.text == "", "the old handler read the new pipe's data")
        #expect(oldEvents.events.allSatisfy { $0 == .closed }, "\(oldEvents.events)")
        old.invalidate()
        close(number)
        close(first.write)
        close(second.write)
        #expect(await host.shutdown())
    }

    /// A source whose number was reused behind its back, then added to one more mode: in that
    /// mode it must not watch the new descriptor.
    @Test func aSourceAddedToAnotherModeAfterItsNumberWasReusedSeesNothing() async throws {
        let first = s1Pipe()
        let second = s1Pipe()
        let number = first.read
        let other: RunLoop.Mode = "FDTestsOtherMode"
        let oldLog = TestMonitor(DescriptorLog())
        let old = try FileDescriptorSource(descriptor: number, handler: recordingHandler(oldLog))
        guard let host = PortLoop.start(name: "rlk-fd-reuse-3", setup: { $0.add(old, forMode: .default) }) else {
            return
        }
        writeText(first.write, "a")
        #expect(oldLog.wait(timeout: .seconds(10)) { $0.text == "a" })
        #expect(dup2(second.read, number) == number)
        close(second.read)
        host.loop.add(old, forMode: other)
        writeText(second.write, "b")
        // A nested run of the other mode, on the loop's thread (a 50 ms bound: it returns at
        // once if the source fires, and there is nothing else to wait for).
        #expect(
            host.sync { _ = RunLoop.current.run(mode: other, for: .milliseconds(50), returnAfterSourceHandled: true) })
        let oldEvents = oldLog.read { $0 }
        #expect(oldEvents.text == "a", "the old handler read the new pipe's data")
        #expect(oldEvents.events.dropFirst().allSatisfy { $0 == .closed }, "\(oldEvents.events)")
        old.invalidate()
        close(number)
        close(first.write)
        close(second.write)
        #expect(await host.shutdown())
    }

    // MARK: Ownership

    /// `ownsDescriptor: true`: `invalidate()` closes the descriptor (and so does releasing the
    /// source); `false`: the descriptor stays open.
    @Test func anOwningSourceClosesItsDescriptorAndOthersDoNot() throws {
        let owned = highEventFD(atLeast: 700)
        let source = try FileDescriptorSource(descriptor: owned, ownsDescriptor: true) { _, _ in }
        #expect(isOpen(owned))
        source.invalidate()
        #expect(!isOpen(owned), "invalidate() closed the owned descriptor")

        let dropped = highEventFD(atLeast: 700)
        do { _ = try FileDescriptorSource(descriptor: dropped, ownsDescriptor: true) { _, _ in } }
        #expect(!isOpen(dropped), "releasing an owning source closed the descriptor")

        let borrowed = highEventFD(atLeast: 700)
        defer { close(borrowed) }
        let other = try FileDescriptorSource(descriptor: borrowed) { _, _ in }
        other.invalidate()
        #expect(isOpen(borrowed), "a source that does not own its descriptor leaves it open")
    }
}
