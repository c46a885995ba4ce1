import Glibc
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
        let result = diffRunOnFreshThread { () -> [String] in
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
}
