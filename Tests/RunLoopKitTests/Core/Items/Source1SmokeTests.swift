import Glibc
import SharedTestSupport
import Synchronization
import SystemPackage
import Testing

import class RunLoopKit.RunLoop

@testable import RunLoopKit

/// The run algorithm's version-1 phase, end to end: a pipe and a message port on one loop.
@Suite struct Source1SmokeTests {
    @Test func pipeAndPortDeliverInOrderAndHangUpInvalidates() throws {
        var fds: [Int32] = [0, 0]
        #expect(pipe(&fds) == 0)
        let (readEnd, writeEnd) = (fds[0], fds[1])
        let result = TestThreads.runBlocking(timeout: .seconds(10), stackSize: 1 << 20) { () -> [String] in
            let loop = RunLoop.current
            let trace = Mutex<[String]>([])
            let port = MessagePort<Int>(order: 1) { message in trace.locked { $0.append("message \(message)") } }
            let source = try! FileDescriptorSource(descriptor: readEnd, ownsDescriptor: true) { source, events in
                var buffer = [UInt8](repeating: 0, count: 64)
                let count = read(source.descriptor, &buffer, 64)
                trace.locked { $0.append("fd \(events) \(count)") }
            }
            loop.add(source, forMode: .default)
            loop.add(port, forMode: .default)
            try! port.send(1)
            try! port.send(2)
            _ = "x".withCString { write(writeEnd, $0, 1) }
            var result = loop.run(mode: .default, for: .seconds(5), returnAfterSourceHandled: true)
            trace.locked { $0.append("result \(result)") }
            close(writeEnd)
            while source.isValid {
                result = loop.run(mode: .default, for: .seconds(5), returnAfterSourceHandled: true)
            }
            trace.locked { $0.append("valid \(source.isValid)") }
            result = loop.run(mode: .default, for: .seconds(5), returnAfterSourceHandled: true)
            trace.locked { $0.append("result \(result)") }
            port.invalidate()
            return trace.locked { $0 }
        }
        // returnAfterSourceHandled handles one callout per run: the pipe (order 0) before the port
        // (order 1); after the hang-up the source is invalid and the port goes on.
        #expect(
            result == [
                "fd readable 1", "result handledSource", "fd hangUp 0", "valid false", "message 1",
                "result handledSource",
            ], "\(result ?? [])")
    }

    @Test func badDescriptorsAreRejected() {
        #expect(throws: Errno.badFileDescriptor) { try FileDescriptorSource(descriptor: -1) { _, _ in } }
        #expect(throws: Errno.badFileDescriptor) { try FileDescriptorSource(descriptor: 99_999) { _, _ in } }
    }

    /// An owning source whose descriptor was closed behind its back, its number then reused by
    /// another source's descriptor, is told `.closed` and invalidated without closing the new
    /// descriptor (a regression: it used to close it).
    @Test func reusedNumberIsNotClosedByTheEarlierOwningSource() {
        let outcome = TestThreads.runBlocking(timeout: .seconds(10), stackSize: 1 << 20) {
            () -> (firstEvents: String, firstValid: Bool, secondOpen: Bool) in
            let loop = RunLoop.current
            var first: [Int32] = [0, 0]
            var second: [Int32] = [0, 0]
            _ = pipe(&first)
            let told = Mutex("")
            let earlier = try! FileDescriptorSource(descriptor: first[0], ownsDescriptor: true) { _, events in
                told.locked { $0 = "\(events)" }
            }
            loop.add(earlier, forMode: .default)
            // Close first[0] and reuse its number for another pipe's read end in one atomic step:
            // closing and reopening would race with other tests' descriptors for the number.
            _ = pipe(&second)
            _ = dup2(second[0], first[0])
            let reused = first[0]
            let later = try! FileDescriptorSource(descriptor: reused) { _, _ in }
            loop.add(later, forMode: .default)
            loop.run(mode: .default, for: .milliseconds(50))
            let open = fcntl(reused, F_GETFD) != -1
            later.invalidate()
            for fd in [reused, first[1], second[0], second[1]] { close(fd) }
            return (told.locked { $0 }, earlier.isValid, open)
        }
        #expect(outcome?.firstEvents == "closed")
        #expect(outcome?.firstValid == false)
        #expect(outcome?.secondOpen == true)
    }
}
