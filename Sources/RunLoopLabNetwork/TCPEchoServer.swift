import CRunLoopLab
import Glibc
import Synchronization
import RunLoopKit
import SystemPackage

/// A TCP echo server whose listening socket and client sockets are ``FileDescriptorSource``s on
/// one run loop: the seeds' network thread (AFNetworking's keep-alive thread that owns socket I/O).
///
/// The server binds an IPv4 address (by default 127.0.0.1 on an ephemeral port, see ``port``),
/// and every byte a client sends is written back to it. All socket I/O happens in the sources'
/// handlers, on the thread of ``loop``, while that loop runs in ``mode``:
///
/// ```swift
/// // On the network thread (AFNetworking's `networkRequestThread`):
/// let server = try TCPEchoServer(on: RunLoop.current)
/// print("listening on 127.0.0.1:\(server.port)")
/// RunLoop.current.run()  // returns once stop() has removed the server's sources
///                        // (if nothing else keeps the default mode from being empty)
///
/// // From any other thread:
/// server.stop()
/// ```
///
/// - Sockets are non-blocking; the listener accepts with `accept4(SOCK_NONBLOCK | SOCK_CLOEXEC)`.
/// - Each connection has an output buffer. When the kernel takes only part of an echo (`send`
///   returns `EAGAIN`), the rest waits there and the connection's source watches
///   ``FileDescriptorSource/Events/writable`` until it is drained. While more than
///   ``outputLimit`` bytes wait, the server stops reading that client (backpressure).
/// - A client that goes away (end of file, `ECONNRESET`, a hang-up or error event) is closed and
///   its source invalidated; other clients are not disturbed. A client that shuts down only its
///   sending side still gets the rest of its echo before the server closes the connection.
/// - ``stop()`` may be called from any thread; when it returns, every socket of the server is
///   closed.
///
/// The server's state is guarded by one lock, held by a handler while it performs its
/// (non-blocking) system calls and by ``stop()`` while it takes the sources; no lock is held
/// while ``Event`` observers run.
public final class TCPEchoServer: Sendable, CustomStringConvertible {
    /// A connection's number, unique for the server's lifetime (1, 2, 3, ... in accept order).
    public struct ConnectionID: Hashable, Sendable, CustomStringConvertible {
        /// The number.
        public let rawValue: UInt64

        /// `#` and the number, e.g. `#3`.
        public var description: String { "#\(rawValue)" }
    }

    /// Why the server closed a connection.
    public enum CloseReason: Sendable, Hashable, CustomStringConvertible {
        /// The client closed its side (`recv` returned 0), and the rest of its echo was sent (or
        /// could no longer be: the connection hung up).
        case endOfFile
        /// The client reset the connection (`ECONNRESET` or `EPIPE`).
        case reset
        /// The loop reported a hang-up, an error, or a descriptor closed under the source.
        case hangUp
        /// Another system call failure.
        case failed(Errno)

        /// A short description, e.g. `end of file`.
        public var description: String {
            switch self {
            case .endOfFile: "end of file"
            case .reset: "reset by peer"
            case .hangUp: "hang-up"
            case .failed(let error): "failed: \(error)"
            }
        }
    }

    /// What happened on the server, reported to the `onEvent` observer on the loop's thread.
    public enum Event: Sendable, CustomStringConvertible {
        /// A client connected.
        case accepted(ConnectionID)
        /// The server read `byteCount` bytes from a client (and echoes them).
        case received(ConnectionID, byteCount: Int)
        /// The server closed a connection, for `reason`.
        case closed(ConnectionID, CloseReason)

        /// A one-line description, e.g. `#2 received 17 bytes`.
        public var description: String {
            switch self {
            case .accepted(let id): "\(id) accepted"
            case .received(let id, let count): "\(id) received \(count) bytes"
            case .closed(let id, let reason): "\(id) closed (\(reason))"
            }
        }
    }

    /// Counters of the server's work since it started.
    public struct Statistics: Sendable, Hashable {
        /// Connections accepted.
        public var accepted: Int
        /// Connections open now.
        public var open: Int
        /// Bytes read from clients.
        public var bytesReceived: Int
        /// Bytes written back to clients.
        public var bytesEchoed: Int
        /// How many times a connection's socket took only part of its output, so that the rest
        /// waited in the output buffer and the source watched ``FileDescriptorSource/Events/writable``.
        public var writableWaits: Int
    }

    /// The TCP port the server listens on (the kernel's choice when it was created with port 0).
    public let port: UInt16
    /// The loop whose thread performs the server's I/O.
    public let loop: RunLoop
    /// The mode the server's sources were added for.
    public let mode: RunLoop.Mode
    /// The most bytes waiting in a connection's output buffer before the server stops reading
    /// from that client until the buffer drains.
    public let outputLimit: Int
    /// The `SO_SNDBUF` given to each accepted socket, or nil for the kernel's (autotuned) default.
    public let sendBufferSize: Int32?

    private let state: Mutex<State>
    private let onEvent: (@Sendable (Event) -> Void)?
    private let acceptedCount = Atomic<Int>(0)
    private let openCount = Atomic<Int>(0)
    private let receivedBytes = Atomic<Int>(0)
    private let echoedBytes = Atomic<Int>(0)
    private let writableWaitCount = Atomic<Int>(0)

    /// How many bytes one `recv` reads at most.
    private static let readSize = 64 * 1024
    /// How many connections one listener callback accepts at most (the listener is level-triggered:
    /// the loop calls again on its next pass if more are waiting).
    private static let acceptBatch = 64
    /// How long accepting pauses when the process or system is out of descriptors or memory.
    private static let acceptPause = Duration.milliseconds(100)

    /// Creates a listening socket on `host`:`port` and adds it to `loop` for `mode`.
    ///
    /// Callable from any thread. The server accepts and echoes while `loop` runs in `mode`.
    ///
    /// - Parameters:
    ///   - loop: The loop whose thread performs the server's I/O.
    ///   - mode: The mode the server's sources are added for (`.common` adds them to every
    ///     common mode).
    ///   - host: An IPv4 address in dotted-decimal form.
    ///   - port: The port to listen on; 0 lets the kernel choose one (read it from ``port``).
    ///   - backlog: The listen queue's length (the kernel caps it at `net.core.somaxconn`).
    ///   - outputLimit: See ``outputLimit``.
    ///   - sendBufferSize: See ``sendBufferSize``. A small buffer makes the kernel take echoes
    ///     piecemeal (useful to watch or test the output buffer).
    ///   - onEvent: Called on the loop's thread for every ``Event``, with no lock held.
    /// - Throws: `Errno.invalidArgument` for a `host` that is not an IPv4 address, or the `Errno`
    ///   of the failed `socket`, `bind` or `listen` call (`.addressInUse`, ...).
    public init(
        on loop: RunLoop,
        mode: RunLoop.Mode = .default,
        host: String = "127.0.0.1",
        port: UInt16 = 0,
        backlog: Int32 = SOMAXCONN,
        outputLimit: Int = 256 * 1024,
        sendBufferSize: Int32? = nil,
        onEvent: (@Sendable (Event) -> Void)? = nil
    ) throws(Errno) {
        self.loop = loop
        self.mode = mode
        self.outputLimit = max(1, outputLimit)
        self.sendBufferSize = sendBufferSize
        self.onEvent = onEvent
        let fd = try EchoSocket.listen(host: host, port: port, backlog: backlog)
        let boundPort: UInt16
        do throws(Errno) {
            boundPort = try EchoSocket.localPort(fd)
        } catch {
            Socket.close(fd)
            throw error
        }
        self.port = boundPort
        let scratch = UnsafeMutableRawBufferPointer.allocate(byteCount: Self.readSize, alignment: 16)
        state = Mutex(State(scratch: scratch))
        let listener: FileDescriptorSource
        do throws(Errno) {
            listener = try FileDescriptorSource(descriptor: fd, watching: .readable, ownsDescriptor: true) {
                [weak self] source, events in
                self?.handleListener(source, events)
            }
        } catch {
            Socket.close(fd)
            throw error
        }
        state.locked { $0.listener = listener }
        loop.add(listener, forMode: mode)
    }

    deinit {
        stop()
        state.locked { $0.scratch }.deallocate()
    }

    /// Whether the server is listening: neither stopped nor its listener lost.
    public var isRunning: Bool {
        state.locked { !$0.stopped && $0.listener != nil }
    }

    /// The server's counters so far (any thread).
    public var statistics: Statistics {
        Statistics(
            accepted: acceptedCount.load(ordering: .relaxed),
            open: openCount.load(ordering: .relaxed),
            bytesReceived: receivedBytes.load(ordering: .relaxed),
            bytesEchoed: echoedBytes.load(ordering: .relaxed),
            writableWaits: writableWaitCount.load(ordering: .relaxed))
    }

    /// `TCPEchoServer(port 41641, 3 open connections)` (`, stopped` once stopped).
    public var description: String {
        "TCPEchoServer(port \(port), \(openCount.load(ordering: .relaxed)) open connections\(isRunning ? "" : ", stopped"))"
    }

    /// Stops the server: invalidates the listener and every connection's source, which closes
    /// their sockets, and wakes the loop (so that a `run()` whose mode is now empty returns).
    ///
    /// Callable from any thread, any number of times. When it returns, every socket of the server
    /// is closed; a handler already running on the loop's thread finishes its system calls first.
    /// Connections closed by `stop()` are not reported to the `onEvent` observer.
    public func stop() {
        let (sources, retryTimer) = state.locked { state -> ([FileDescriptorSource], RunLoopTimer?) in
            guard !state.stopped else { return ([], nil) }
            state.stopped = true
            var sources = state.connections.values.map(\.source)
            if let listener = state.listener { sources.append(listener) }
            state.connections.removeAll()
            state.listener = nil
            defer { state.acceptRetry = nil }
            return (sources, state.acceptRetry)
        }
        guard !sources.isEmpty || retryTimer != nil else { return }
        // Outside the lock: a handler waiting for it sees `stopped` and returns without touching its
        // descriptor, and invalidate() never waits for us while we hold it.
        for source in sources { source.invalidate() }
        retryTimer?.invalidate()
        openCount.store(0, ordering: .relaxed)
        loop.wakeUp()
    }

    // MARK: - Loop-thread handlers

    /// The listener's handler: accepts what is waiting (up to a batch) and adds a source for each.
    private func handleListener(_ listener: FileDescriptorSource, _ events: FileDescriptorSource.Events) {
        var report: [Event] = []
        state.locked { state in
            guard !state.stopped, state.listener === listener else { return }
            if !events.isDisjoint(with: [.error, .hangUp, .closed]) {
                // The listening socket failed; the loop invalidates its source after this handler.
                listener.invalidate()
                state.listener = nil
                return
            }
            for _ in 0..<Self.acceptBatch {
                let fd: Int32
                do throws(Errno) {
                    fd = try Socket.retryingOnInterrupt {
                        crll_accept4(
                            listener.descriptor, nil, nil, Int32(SOCK_NONBLOCK.rawValue | SOCK_CLOEXEC.rawValue))
                    }
                } catch {
                    if error == .wouldBlock { return }
                    if Self.isOutOfResources(error) {
                        pauseAccepting(&state, listener)
                        return
                    }
                    // accept(2) on Linux: the connection's own network errors belong to that
                    // connection; skip it and go on. Anything else means the listener is broken.
                    if Self.isConnectionError(error) { continue }
                    listener.invalidate()
                    state.listener = nil
                    return
                }
                EchoSocket.configure(fd, sendBufferSize: sendBufferSize)
                let id = ConnectionID(rawValue: state.nextID)
                state.nextID += 1
                let source: FileDescriptorSource
                do throws(Errno) {
                    source = try FileDescriptorSource(descriptor: fd, watching: .readable, ownsDescriptor: true) {
                        [weak self] source, events in
                        self?.handleConnection(id, source, events)
                    }
                } catch {
                    Socket.close(fd)
                    continue
                }
                state.connections[id] = Connection(source: source)
                loop.add(source, forMode: mode)
                acceptedCount.add(1, ordering: .relaxed)
                openCount.add(1, ordering: .relaxed)
                if onEvent != nil { report.append(.accepted(id)) }
            }
        }
        deliver(report)
    }

    /// A connection's handler: writes what is pending, reads and echoes, closes on end of file,
    /// reset, hang-up or error, and keeps the source's interest in step with the output buffer.
    private func handleConnection(
        _ id: ConnectionID, _ source: FileDescriptorSource, _ events: FileDescriptorSource.Events
    ) {
        var report: [Event] = []
        state.locked { state in
            guard !state.stopped, let index = state.connections.index(forKey: id) else { return }
            let outcome = service(&state.connections.values[index], events, state.scratch)
            if outcome.received > 0 {
                receivedBytes.add(outcome.received, ordering: .relaxed)
                if onEvent != nil { report.append(.received(id, byteCount: outcome.received)) }
            }
            if outcome.echoed > 0 { echoedBytes.add(outcome.echoed, ordering: .relaxed) }
            if let reason = outcome.close {
                // Under the lock, so that a concurrent stop() returns only once this socket is closed.
                state.connections.remove(at: index)
                source.invalidate()
                openCount.subtract(1, ordering: .relaxed)
                if onEvent != nil { report.append(.closed(id, reason)) }
            }
        }
        deliver(report)
    }

    /// One handler call's I/O on one connection.
    private func service(
        _ connection: inout Connection, _ events: FileDescriptorSource.Events, _ scratch: UnsafeMutableRawBufferPointer
    ) -> (received: Int, echoed: Int, close: CloseReason?) {
        if events.contains(.closed) { return (0, 0, .hangUp) }
        let fd = connection.source.descriptor
        var received = 0
        var echoed = 0
        // 1. Older output first.
        if connection.pendingCount > 0 {
            switch connection.flush(fd) {
            case .success(let count): echoed += count
            case .failure(let error): return (0, echoed, Self.reason(error))
            }
        }
        // 2. Read (also on a hang-up or error: take what is left) unless the buffer is full.
        if !connection.inputClosed, connection.pendingCount < outputLimit,
            !events.isDisjoint(with: [.readable, .hangUp, .error])
        {
            do throws(Errno) {
                let count = try Socket.retryingOnInterrupt { recv(fd, scratch.baseAddress, scratch.count, 0) }
                if count == 0 {
                    connection.inputClosed = true
                } else {
                    received = count
                    let bytes = UnsafeRawBufferPointer(rebasing: scratch[..<count])
                    switch connection.echo(bytes, fd) {
                    case .success(let count): echoed += count
                    case .failure(let error): return (received, echoed, Self.reason(error))
                    }
                }
            } catch {
                if error != .wouldBlock { return (received, echoed, Self.reason(error)) }
            }
        }
        // 3. A hang-up or an error ends the connection (the loop invalidates the source after us).
        if !events.isDisjoint(with: [.hangUp, .error]) {
            if let error = EchoSocket.pendingError(fd) { return (received, echoed, Self.reason(error)) }
            return (received, echoed, connection.inputClosed ? .endOfFile : .hangUp)
        }
        if connection.inputClosed && connection.pendingCount == 0 { return (received, echoed, .endOfFile) }
        // 4. Interest follows the buffer: read while it has room, write while it holds bytes.
        var interest: FileDescriptorSource.Events = []
        if !connection.inputClosed && connection.pendingCount < outputLimit { interest.insert(.readable) }
        if connection.pendingCount > 0 { interest.insert(.writable) }
        if interest != connection.interest {
            if interest.contains(.writable) && !connection.interest.contains(.writable) {
                writableWaitCount.add(1, ordering: .relaxed)
            }
            connection.source.watchedEvents = interest
            connection.interest = interest
        }
        return (received, echoed, nil)
    }

    /// Stops watching the listener and schedules a timer that resumes accepting.
    private func pauseAccepting(_ state: inout State, _ listener: FileDescriptorSource) {
        guard state.acceptRetry == nil else { return }
        listener.watchedEvents = []
        let timer = RunLoopTimer(after: Self.acceptPause) { [weak self] _ in self?.resumeAccepting() }
        state.acceptRetry = timer
        loop.add(timer, forMode: mode)
    }

    /// The pause timer's handler: watches the listener again.
    private func resumeAccepting() {
        state.locked { state in
            state.acceptRetry = nil
            guard !state.stopped, let listener = state.listener else { return }
            listener.watchedEvents = .readable
        }
    }

    /// Calls the observer, outside the lock, for each event.
    private func deliver(_ report: [Event]) {
        guard let onEvent, !report.isEmpty else { return }
        for event in report { onEvent(event) }
    }

    /// Whether `accept4` failed for lack of descriptors or memory (retrying at once would spin).
    private static func isOutOfResources(_ error: Errno) -> Bool {
        error == .tooManyOpenFiles || error == .tooManyOpenFilesInSystem || error == .noBufferSpace
            || error == .noMemory
    }

    /// Whether `accept4` failed for a reason of the pending connection, not of the listener
    /// (accept(2): Linux passes the new connection's network errors on to `accept`).
    private static func isConnectionError(_ error: Errno) -> Bool {
        [
            .connectionAbort, .protocolError, .protocolNotAvailable, .networkDown, .networkUnreachable,
            .hostIsDown, .noRouteToHost, .notSupported, .notPermitted, .timedOut,
        ].contains(error) || error.rawValue == ENONET
    }

    /// The close reason for a failed `recv` or `send`.
    private static func reason(_ error: Errno) -> CloseReason {
        error == .connectionReset || error == .brokenPipe ? .reset : .failed(error)
    }

    // MARK: - State

    /// Everything the handlers and stop() share, behind ``state``.
    private struct State {
        var stopped = false
        var listener: FileDescriptorSource?
        var connections: [ConnectionID: Connection] = [:]
        var nextID: UInt64 = 1
        var acceptRetry: RunLoopTimer?
        /// The buffer every `recv` reads into (one server, one loop thread: one buffer).
        let scratch: UnsafeMutableRawBufferPointer

        init(scratch: UnsafeMutableRawBufferPointer) { self.scratch = scratch }
    }

    /// One client: its source and the output the kernel has not taken yet.
    private struct Connection {
        let source: FileDescriptorSource
        /// Bytes to send; those before `outputStart` are sent already.
        var output: [UInt8] = []
        var outputStart = 0
        /// What the source watches (mirrors `source.watchedEvents` without asking it).
        var interest: FileDescriptorSource.Events = .readable
        /// Whether the client has closed its sending side.
        var inputClosed = false

        init(source: FileDescriptorSource) { self.source = source }

        /// Bytes waiting to be sent.
        var pendingCount: Int { output.count - outputStart }

        /// Sends `bytes` (after the pending output, which is empty or has just been tried), keeping
        /// what the kernel does not take. Returns the bytes sent.
        mutating func echo(_ bytes: UnsafeRawBufferPointer, _ fd: Int32) -> Result<Int, Errno> {
            var sent = 0
            if pendingCount == 0 {
                switch EchoSocket.send(fd, bytes) {
                case .success(let count): sent = count
                case .failure(let error): return .failure(error)
                }
            }
            if sent < bytes.count {
                // As typed bytes, so that the append is one copy (a raw slice goes byte by byte).
                output.append(
                    contentsOf: UnsafeRawBufferPointer(rebasing: bytes[sent...]).assumingMemoryBound(to: UInt8.self))
            }
            return .success(sent)
        }

        /// Sends as much pending output as the kernel takes. Returns the bytes sent.
        mutating func flush(_ fd: Int32) -> Result<Int, Errno> {
            let result = output.withUnsafeBytes { bytes in
                EchoSocket.send(fd, UnsafeRawBufferPointer(rebasing: bytes[outputStart...]))
            }
            guard case .success(let count) = result else { return result }
            outputStart += count
            if outputStart == output.count {
                output.removeAll(keepingCapacity: output.capacity <= 64 * 1024)
                outputStart = 0
            } else if outputStart >= 64 * 1024 && outputStart * 2 >= output.count {
                output.removeFirst(outputStart)
                outputStart = 0
            }
            return result
        }
    }
}

/// The socket system calls of ``TCPEchoServer``: each retries `EINTR` and reports failure as an
/// `Errno`.
enum EchoSocket {
    /// A non-blocking, close-on-exec IPv4 TCP socket listening on `host`:`port`.
    static func listen(host: String, port: UInt16, backlog: Int32) throws(Errno) -> Int32 {
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = port.bigEndian
        guard inet_pton(AF_INET, host, &address.sin_addr) == 1 else { throw .invalidArgument }
        let fd = try Socket.retryingOnInterrupt {
            socket(AF_INET, Int32(SOCK_STREAM.rawValue | SOCK_NONBLOCK.rawValue | SOCK_CLOEXEC.rawValue), 0)
        }
        do throws(Errno) {
            var on: Int32 = 1
            _ = try Socket.retryingOnInterrupt {
                setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, socklen_t(MemoryLayout<Int32>.size))
            }
            _ = try Socket.retryingOnInterrupt {
                withUnsafePointer(to: &address) { pointer in
                    pointer.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                        bind(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size))
                    }
                }
            }
            _ = try Socket.retryingOnInterrupt { Glibc.listen(fd, backlog) }
        } catch {
            Socket.close(fd)
            throw error
        }
        return fd
    }

    /// The local port a socket is bound to.
    static func localPort(_ fd: Int32) throws(Errno) -> UInt16 {
        var address = sockaddr_in()
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        _ = try Socket.retryingOnInterrupt {
            withUnsafeMutablePointer(to: &address) { pointer in
                pointer.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd, $0, &length) }
            }
        }
        return UInt16(bigEndian: address.sin_port)
    }

    /// Turns Nagle's algorithm off (an echo should leave at once) and sets `SO_SNDBUF` if asked;
    /// failure is harmless (the socket works with the defaults).
    static func configure(_ fd: Int32, sendBufferSize: Int32?) {
        var on: Int32 = 1
        _ = setsockopt(fd, Int32(IPPROTO_TCP), TCP_NODELAY, &on, socklen_t(MemoryLayout<Int32>.size))
        if var size = sendBufferSize {
            _ = setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &size, socklen_t(MemoryLayout<Int32>.size))
        }
    }

    /// The socket's pending error (`SO_ERROR`, which reading clears), or nil if there is none.
    static func pendingError(_ fd: Int32) -> Errno? {
        var error: Int32 = 0
        var length = socklen_t(MemoryLayout<Int32>.size)
        guard getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &length) == 0, error != 0 else { return nil }
        return Errno(rawValue: error)
    }

    /// Sends what the kernel takes of `bytes` without raising `SIGPIPE`; `EAGAIN` sends 0 bytes.
    static func send(_ fd: Int32, _ bytes: UnsafeRawBufferPointer) -> Result<Int, Errno> {
        guard !bytes.isEmpty else { return .success(0) }
        do throws(Errno) {
            return .success(
                try Socket.retryingOnInterrupt { Glibc.send(fd, bytes.baseAddress, bytes.count, Int32(MSG_NOSIGNAL)) })
        } catch {
            return error == .wouldBlock ? .success(0) : .failure(error)
        }
    }
}
