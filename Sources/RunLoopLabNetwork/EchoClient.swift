import Glibc

/// A plain blocking TCP client of ``TCPEchoServer`` for the tour: connects to 127.0.0.1, sends,
/// and reads the echo back, every wait bounded by `poll`.
///
/// Errors are reported as a message (`EchoClient.Failure`), which the experiment prints.
package struct EchoClient: ~Copyable {
    /// A failed client operation, described for the trace.
    package struct Failure: Error, CustomStringConvertible {
        package let description: String
    }

    /// The connected socket.
    let fd: Int32

    /// Connects to 127.0.0.1:`port`.
    package init(port: UInt16) throws(Failure) {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue | SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { throw Failure(description: "socket: \(Self.lastError)") }
        var on: Int32 = 1
        _ = setsockopt(fd, Int32(IPPROTO_TCP), TCP_NODELAY, &on, socklen_t(MemoryLayout<Int32>.size))
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = port.bigEndian
        address.sin_addr.s_addr = UInt32(0x7F00_0001).bigEndian
        let status = withUnsafePointer(to: &address) { pointer in
            pointer.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size))
            }
        }
        guard status == 0 else {
            let failure = Failure(description: "connect: \(Self.lastError)")
            close(fd)
            throw failure
        }
        self.fd = fd
    }

    deinit { close(fd) }

    /// Sends `message` and reads until as many bytes have come back, sending and reading
    /// alternately (so a message larger than the socket buffers cannot deadlock); returns the bytes
    /// received. Fails if nothing moves for `timeout` milliseconds.
    package func roundTrip(_ message: [UInt8], timeoutMs: Int32 = 2000) throws(Failure) -> [UInt8] {
        var sent = 0
        var received: [UInt8] = []
        received.reserveCapacity(message.count)
        var chunk = [UInt8](repeating: 0, count: 64 * 1024)
        while received.count < message.count {
            var poller = pollfd(fd: fd, events: Int16(POLLIN) | (sent < message.count ? Int16(POLLOUT) : 0), revents: 0)
            let ready = poll(&poller, 1, timeoutMs)
            if ready < 0 && errno == EINTR { continue }
            guard ready > 0 else {
                throw Failure(
                    description: "no progress for \(timeoutMs) ms (\(received.count) of \(message.count) bytes back)")
            }
            if sent < message.count && poller.revents & Int16(POLLOUT) != 0 {
                let count = message.withUnsafeBytes { bytes in
                    Glibc.send(fd, bytes.baseAddress! + sent, bytes.count - sent, Int32(MSG_NOSIGNAL | MSG_DONTWAIT))
                }
                if count > 0 {
                    sent += count
                } else if count < 0 && errno != EAGAIN && errno != EINTR {
                    throw Failure(description: "send: \(Self.lastError)")
                }
            }
            if poller.revents & Int16(POLLIN | POLLHUP | POLLERR) != 0 {
                let count = chunk.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, Int32(MSG_DONTWAIT)) }
                if count > 0 {
                    received.append(contentsOf: chunk[..<count])
                } else if count == 0 {
                    throw Failure(description: "the server closed the connection")
                } else if errno != EAGAIN && errno != EINTR {
                    throw Failure(description: "recv: \(Self.lastError)")
                }
            }
        }
        return received
    }

    /// Sends `bytes` and returns without reading anything back.
    package func send(_ bytes: [UInt8]) throws(Failure) {
        let count = bytes.withUnsafeBytes { Glibc.send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
        guard count == bytes.count else { throw Failure(description: "send: \(Self.lastError)") }
    }

    /// The calling thread's kernel id (gettid), read from `/proc/thread-self`, which links to
    /// `<pid>/task/<tid>` (Swift's Glibc module does not import `gettid`).
    package static func threadID() -> Int {
        var buffer = [CChar](repeating: 0, count: 64)
        let count = readlink("/proc/thread-self", &buffer, buffer.count - 1)
        guard count > 0 else { return -1 }
        let link = String(decoding: buffer[..<count].map { UInt8(bitPattern: $0) }, as: UTF8.self)
        return link.split(separator: "/").last.flatMap { Int($0) } ?? -1
    }

    /// `errno` as text.
    private static var lastError: String { String(cString: strerror(errno)) }
}
