import CRunLoopKit
import Glibc
import SharedTestSupport
import Synchronization
import SystemPackage
import Testing

@testable import RunLoopKit
import RunLoopLabNetwork

// The seeds' network thread (issue 4 item 5): TCPEchoServer's sockets are FileDescriptorSources on
// one loop thread. Clients run on their own threads with plain blocking sockets; every wait is a
// poll with a timeout, so a broken server fails the test instead of hanging it.
//
// Serialized with the robustness suites: the load test keeps both cores busy for seconds.

@Suite(.serialized, .exclusive(.robustness)) struct EchoServerTests {
    /// How long one client operation may wait for the server before the test fails.
    static let patience: Int32 = 30_000

    @Test func twoHundredClientsEchoAThousandRoundTripsWhileOthersMisbehave() async {
        let clients = 200
        let roundTrips = 1_000
        let misbehaving = 4  // threads of each kind
        let misdeeds = 100  // connections per misbehaving thread
        let seed = stressSeed()
        let replay = "seed \(seed), replay with RUNLOOPKIT_STRESS_SEED=\(seed)"
        guard let host = EchoServerHost.start() else { return }
        let port = host.server.port
        let tally = LoadTally()
        // Progress ticks: one per 100 round trips of a good client. Misbehaving thread k does its
        // i-th misdeed once the good clients are i/misdeeds of the way through, so misdeeds are
        // spread over the whole run.
        let ticks = clients * roundTrips / 100
        let started = ContinuousClock.now

        let good = (0..<clients).map { index in
            TestThread(name: "rlk-echo-\(index)", stackSize: 256 * 1024) {
                EchoLoad.goodClient(
                    index: index, port: port, seed: seed, roundTrips: roundTrips, tally: tally)
            }
        }
        let bad = (0..<(2 * misbehaving)).map { index in
            TestThread(name: "rlk-echo-bad\(index)", stackSize: 256 * 1024) {
                for misdeed in 0..<misdeeds {
                    let due = misdeed * ticks / misdeeds
                    guard tally.progress.wait(timeout: .seconds(120), until: { $0 >= due }) else {
                        tally.fail("misbehaving client \(index): the good clients stalled before tick \(due)")
                        return
                    }
                    var random = SplitMix(seed: seed ^ UInt64(0xBAD0_0000 + index * 1_000 + misdeed))
                    if index % 2 == 0 {
                        EchoLoad.disconnectMidMessage(port: port, random: &random, tally: tally)
                    } else {
                        EchoLoad.sendGarbageThenReset(port: port, random: &random, tally: tally)
                    }
                }
            }
        }
        var joined = true
        for thread in good + bad {
            joined = await thread.joinAsync(timeout: .seconds(600)) && joined
        }
        let elapsed = secondsSince(started)
        #expect(joined, "every client thread finished (\(replay))")
        let failures = tally.failures.locked { $0 }
        #expect(failures.isEmpty, "\(failures.count) client failures, first: \(failures.prefix(5)) (\(replay))")
        #expect(tally.completed.load(ordering: .relaxed) == clients, "good clients that completed (\(replay))")
        let goodBytes = tally.goodBytes.load(ordering: .relaxed)
        #expect(tally.roundTrips.load(ordering: .relaxed) == clients * roundTrips, "round trips (\(replay))")
        let misdeedCount = tally.misdeeds.load(ordering: .relaxed)
        #expect(misdeedCount == 2 * misbehaving * misdeeds, "misbehaving connections made (\(replay))")

        // Every connection, good or bad, is eventually closed by the server; the loop still runs.
        let expected = clients + misdeedCount
        let allClosed = await host.events.waitAsync(timeout: .seconds(60)) { $0.closed >= expected }
        let events = host.events.read { $0 }
        #expect(allClosed, "connections closed \(events.closed) of \(expected) (\(events.reasons); \(replay))")
        #expect(events.accepted == expected, "connections accepted (\(replay))")
        #expect(events.foreignThreadCallbacks == 0, "callbacks off the loop's thread (\(replay))")
        let statistics = host.server.statistics
        #expect(statistics.accepted == expected && statistics.open == 0, "\(statistics) (\(replay))")
        #expect(statistics.bytesReceived >= goodBytes && statistics.bytesEchoed >= goodBytes, "\(statistics)")
        #expect(host.isRunning, "the loop is still in its run (\(replay))")

        host.server.stop()
        #expect(await host.runReturned.waitAsync(timeout: .seconds(30)) { $0 }, "run() returned after stop()")
        #expect(await host.thread.joinAsync(timeout: .seconds(30)), "the loop thread exited")
        let rate = Double(clients * roundTrips) / elapsed
        let summary =
            "EchoServer load: \(clients) clients × \(roundTrips) round trips (\(goodBytes) bytes) + "
            + "\(misdeedCount) misbehaving connections in \(String(format: "%.2f", elapsed)) s "
            + "(\(Int(rate)) round trips/s), close reasons \(events.reasons.sorted { $0.key < $1.key })\n"
        writeToStandardError(summary)
    }

    @Test func theLoopKeepsServingAfterAClientIsKilledAndStopClosesEverything() async throws {
        let host = try #require(EchoServerHost.start())
        let result = await TestThreads.run(name: "rlk-echo-kill") { EchoLoad.killClientsThenStop(host) }
        #expect(result == .some(nil), "\(String(describing: result))")
        let events = host.events.read { $0 }
        #expect(events.reasons[.reset, default: 0] + events.reasons[.endOfFile, default: 0] == 2, "\(events)")
        #expect(events.foreignThreadCallbacks == 0)
        #expect(await host.runReturned.waitAsync(timeout: .seconds(30)) { $0 }, "run() returned after stop()")
        #expect(await host.thread.joinAsync(timeout: .seconds(30)), "the loop thread exited")
    }

    /// The same scenario in a child process, where nothing else opens descriptors: once the loop
    /// thread has exited, the process has exactly the descriptors it had before the server
    /// started (its loop's epoll, wake and timer descriptors, the listening socket and every
    /// connection are closed). In this process the count is shared with the suites running in
    /// parallel, whose loops kept it 28 above its start for over a minute in a CI run.
    @Test func aStoppedServerAndItsExitedLoopThreadLeaveNoDescriptorOpen() async {
        let result = await #expect(processExitsWith: .success, observing: [\.standardErrorContent]) {
            if let failure = EchoLoad.descriptorsAfterKillAndStop() {
                writeToStandardError("RLK-ECHO-DESCRIPTORS \(failure)\n")
            }
        }
        if let result {
            let text = String(decoding: result.standardErrorContent, as: UTF8.self)
            #expect(!text.contains("RLK-ECHO-DESCRIPTORS"), Comment(rawValue: text))
        }
    }

    @Test func slowReadersGetEveryByteThroughTheOutputBuffer() async {
        // A 16 KiB socket send buffer: the kernel takes echoes piecemeal, and the rest waits in
        // the connection's output buffer (at most 64 KiB before the server stops reading). The
        // client's small buffers keep the bytes in flight few, so that they come back quickly.
        let outputLimit = 64 * 1024
        guard let host = EchoServerHost.start(outputLimit: outputLimit, sendBufferSize: 16 * 1024) else { return }
        let port = host.server.port
        let result = await TestThreads.run(name: "rlk-echo-slow") { () -> String? in
            do throws(EchoFailure) {
                let client = try EchoTestClient(port: port, bufferSize: 16 * 1024)
                let total = 64 << 20
                // Byte i of the stream is i % 251 (a prime, so it does not line up with buffer
                // sizes): `pattern[i % 251...]` is the stream from byte i on.
                let pattern = (0..<(64 * 1024 + 251)).map { UInt8($0 % 251) }
                // Send without reading until the socket stays full for 200 ms: the server must stop
                // reading (backpressure), or all 64 MiB would go through.
                var sent = 0
                while sent < total {
                    var poller = pollfd(fd: client.fd, events: Int16(POLLOUT), revents: 0)
                    if poll(&poller, 1, 200) <= 0 { break }
                    let count = pattern.withUnsafeBytes {
                        Glibc.send(
                            client.fd, $0.baseAddress! + sent % 251, 64 * 1024, Int32(MSG_DONTWAIT | MSG_NOSIGNAL))
                    }
                    if count > 0 { sent += count }
                }
                guard sent < total else { return "the server read all \(total) bytes without its client reading" }
                let statistics = host.server.statistics
                let buffered = statistics.bytesReceived - statistics.bytesEchoed
                guard buffered <= outputLimit + 64 * 1024 else {
                    return "\(buffered) bytes in the output buffer (limit \(outputLimit))"
                }
                // Now read everything back, in order.
                var received = 0
                var buffer = [UInt8](repeating: 0, count: 64 * 1024)
                while received < sent {
                    try EchoTestClient.waitUntilReadable(client.fd)
                    let count = buffer.withUnsafeMutableBytes {
                        recv(client.fd, $0.baseAddress, min($0.count, sent - received), Int32(MSG_DONTWAIT))
                    }
                    guard count > 0 else {
                        if count < 0 && (errno == EAGAIN || errno == EINTR) { continue }
                        return
                            "recv after \(received) of \(sent) bytes: \(count < 0 ? String(cString: strerror(errno)) : "end of stream")"
                    }
                    let same = pattern.withUnsafeBytes { expected in
                        memcmp(buffer, expected.baseAddress! + received % 251, count) == 0
                    }
                    guard same else { return "bytes \(received)..<\(received + count) came back wrong" }
                    received += count
                }
                return nil
            } catch {
                return "\(error)"
            }
        }
        #expect(result == .some(nil), "\(String(describing: result))")
        let statistics = host.server.statistics
        #expect(statistics.writableWaits > 0, "the output buffer waited for .writable: \(statistics)")
        host.server.stop()
        #expect(await host.runReturned.waitAsync(timeout: .seconds(30)) { $0 })
        _ = await host.thread.joinAsync(timeout: .seconds(30))
    }

    @Test func aClientThatShutsDownItsSendingSideGetsTheRestOfItsEcho() async {
        // With a 16 KiB socket send buffer, most of a 1 MiB echo is still in the server's output
        // buffer when the client's end of file arrives: the server sends it, then closes.
        guard let host = EchoServerHost.start(sendBufferSize: 16 * 1024) else { return }
        let port = host.server.port
        let result = await TestThreads.run(name: "rlk-echo-half") { () -> String? in
            do throws(EchoFailure) {
                let client = try EchoTestClient(port: port)
                var random = SplitMix(seed: 42)
                let message = EchoLoad.randomBytes(1 << 20, &random)
                // Send while reading (the echo comes back while we send), then shut down.
                var back: [UInt8] = []
                var buffer = [UInt8](repeating: 0, count: 64 * 1024)
                var sent = 0
                var shut = false
                while true {
                    if sent == message.count && !shut {
                        shutdown(client.fd, Int32(SHUT_WR))
                        shut = true
                    }
                    var poller = pollfd(
                        fd: client.fd, events: Int16(POLLIN) | (shut ? 0 : Int16(POLLOUT)), revents: 0)
                    guard poll(&poller, 1, EchoServerTests.patience) > 0 else {
                        return "no progress (\(sent) sent, \(back.count) back)"
                    }
                    if !shut && poller.revents & Int16(POLLOUT) != 0 {
                        let count = message.withUnsafeBytes {
                            Glibc.send(
                                client.fd, $0.baseAddress! + sent, min(64 * 1024, $0.count - sent),
                                Int32(MSG_DONTWAIT | MSG_NOSIGNAL))
                        }
                        if count > 0 { sent += count }
                    }
                    if poller.revents & Int16(POLLIN | POLLHUP | POLLERR) != 0 {
                        let count = buffer.withUnsafeMutableBytes {
                            recv(client.fd, $0.baseAddress, $0.count, Int32(MSG_DONTWAIT))
                        }
                        if count == 0 { break }
                        if count > 0 {
                            back.append(contentsOf: buffer[..<count])
                        } else if errno != EAGAIN && errno != EINTR {
                            return "recv: \(String(cString: strerror(errno)))"
                        }
                    }
                }
                guard shut else { return "the server closed before the client finished sending" }
                guard back.count == message.count else { return "\(back.count) of \(message.count) bytes back" }
                guard back == message else { return "the echo differs from the message" }
                return nil
            } catch {
                return "\(error)"
            }
        }
        #expect(result == .some(nil), "\(String(describing: result))")
        #expect(await host.events.waitAsync(timeout: .seconds(30)) { $0.closed == 1 })
        let events = host.events.read { $0 }
        #expect(events.reasons == ["\(TCPEchoServer.CloseReason.endOfFile)": 1], "\(events)")
        #expect(host.server.statistics.writableWaits > 0, "\(host.server.statistics)")
        host.server.stop()
        #expect(await host.runReturned.waitAsync(timeout: .seconds(30)) { $0 })
        _ = await host.thread.joinAsync(timeout: .seconds(30))
    }

    @Test func bindFailuresAreReportedAsErrno() async throws {
        let host = try #require(EchoServerHost.start())
        #expect(throws: Errno.addressInUse) {
            try TCPEchoServer(on: host.loop, port: host.server.port)
        }
        #expect(throws: Errno.invalidArgument) {
            try TCPEchoServer(on: host.loop, host: "localhost")
        }
        #expect(host.server.isRunning)
        host.server.stop()
        host.server.stop()  // twice is fine
        #expect(!host.server.isRunning)
        #expect(await host.runReturned.waitAsync(timeout: .seconds(30)) { $0 })
        _ = await host.thread.joinAsync(timeout: .seconds(30))
    }
}

// MARK: - Server host

/// What the server's observer has seen.
struct EchoEvents: Sendable, CustomStringConvertible {
    var accepted = 0
    var closed = 0
    var reasons: [String: Int] = [:]
    /// Callbacks that ran on a thread other than the loop's (must stay 0).
    var foreignThreadCallbacks = 0

    var description: String { "accepted \(accepted), closed \(closed) \(reasons), foreign \(foreignThreadCallbacks)" }
}

extension [String: Int] {
    fileprivate subscript(reason: TCPEchoServer.CloseReason, default value: Int) -> Int {
        self["\(reason)", default: value]
    }
}

/// A ``TCPEchoServer`` on a dedicated loop thread that calls `run()` (it returns once `stop()`
/// leaves the mode empty).
final class EchoServerHost: Sendable {
    let server: TCPEchoServer
    let loop: RunLoop
    let thread: TestThread
    /// Accepted and closed connections, updated by the observer (received bytes are not counted
    /// here: the observer checks only their thread).
    let events: TestMonitor<EchoEvents>
    /// Set when the loop thread's `run()` returns.
    let runReturned: TestEvent

    private init(
        server: TCPEchoServer, loop: RunLoop, thread: TestThread, events: TestMonitor<EchoEvents>,
        runReturned: TestEvent
    ) {
        self.server = server
        self.loop = loop
        self.thread = thread
        self.events = events
        self.runReturned = runReturned
    }

    /// Whether the loop thread is still inside its `run()`.
    var isRunning: Bool { !runReturned.read { $0 } && server.isRunning }

    /// Starts the thread and its server; nil (with an issue) if either fails.
    static func start(
        outputLimit: Int = 256 * 1024, sendBufferSize: Int32? = nil, sourceLocation: SourceLocation = #_sourceLocation
    ) -> EchoServerHost? {
        _ = TestLog.recorder
        let events = TestMonitor(EchoEvents())
        let runReturned = TestEvent()
        let published = TestMonitor<Result<(TCPEchoServer, RunLoop), Errno>?>(nil)
        let thread = TestThread(name: "rlk-echo-loop") {
            let loop = RunLoop.current
            let tid = crlk_gettid()
            let result = Result { () throws(Errno) in
                try TCPEchoServer(
                    on: loop, outputLimit: outputLimit, sendBufferSize: sendBufferSize,
                    onEvent: { event in
                        let foreign = crlk_gettid() != tid
                        switch event {
                        case .received:
                            if foreign { events.update { $0.foreignThreadCallbacks += 1 } }
                        case .accepted:
                            events.update {
                                $0.accepted += 1
                                if foreign { $0.foreignThreadCallbacks += 1 }
                            }
                        case .closed(_, let reason):
                            events.update {
                                $0.closed += 1
                                $0.reasons["\(reason)", default: 0] += 1
                                if foreign { $0.foreignThreadCallbacks += 1 }
                            }
                        }
                    })
            }
            published.update { $0 = result.map { ($0, loop) } }
            guard case .success = result else { return }
            loop.run()
            runReturned.fire()
        }
        guard published.wait(timeout: .seconds(30), until: { $0 != nil }), let result = published.read({ $0 }) else {
            Issue.record("the echo server's loop thread did not start", sourceLocation: sourceLocation)
            return nil
        }
        switch result {
        case .success(let (server, loop)):
            return EchoServerHost(server: server, loop: loop, thread: thread, events: events, runReturned: runReturned)
        case .failure(let error):
            Issue.record("TCPEchoServer failed to start: \(error)", sourceLocation: sourceLocation)
            return nil
        }
    }
}

// MARK: - Load

/// The load test's shared counters.
final class LoadTally: Sendable {
    let completed = Atomic<Int>(0)
    let roundTrips = Atomic<Int>(0)
    let goodBytes = Atomic<Int>(0)
    let misdeeds = Atomic<Int>(0)
    let failures = Mutex<[String]>([])
    /// One tick per 100 round trips of any good client.
    let progress = TestMonitor(0)

    func fail(_ message: String) { failures.locked { $0.append(message) } }
}

/// The load test's clients.
enum EchoLoad {
    /// 1,000 round trips of 1–512 random bytes, each compared with what was sent.
    static func goodClient(index: Int, port: UInt16, seed: UInt64, roundTrips: Int, tally: LoadTally) {
        var random = SplitMix(seed: seed &+ UInt64(index) &* 0x9E37_79B9_7F4A_7C15)
        let sent = UnsafeMutableRawBufferPointer.allocate(byteCount: 512, alignment: 8)
        let back = UnsafeMutableRawBufferPointer.allocate(byteCount: 512, alignment: 8)
        defer {
            sent.deallocate()
            back.deallocate()
        }
        var bytes = 0
        do throws(EchoFailure) {
            let client = try EchoTestClient(port: port)
            for trip in 0..<roundTrips {
                let length = 1 + random.below(512)
                fill(sent, length, &random)
                let message = UnsafeRawBufferPointer(rebasing: sent[..<length])
                try client.send(message)
                try client.receive(exactly: length, into: back)
                guard memcmp(sent.baseAddress!, back.baseAddress!, length) == 0 else {
                    throw EchoFailure("round trip \(trip): \(length) bytes came back different")
                }
                bytes += length
                tally.roundTrips.add(1, ordering: .relaxed)
                if (trip + 1) % 100 == 0 { tally.progress.update { $0 += 1 } }
            }
            tally.goodBytes.add(bytes, ordering: .relaxed)
            tally.completed.add(1, ordering: .relaxed)
        } catch {
            tally.fail("good client \(index): \(error)")
        }
    }

    /// Sends half of a 2–1,024-byte message and closes without reading the echo.
    static func disconnectMidMessage(port: UInt16, random: inout SplitMix, tally: LoadTally) {
        do throws(EchoFailure) {
            let client = try EchoTestClient(port: port)
            let length = 2 + random.below(1_023)
            try client.send(randomBytes(length / 2, &random))
            tally.misdeeds.add(1, ordering: .relaxed)
        } catch {
            tally.fail("mid-message client: \(error)")
        }
    }

    /// Sends 1–4,096 random bytes, sometimes waits for part of the echo, and resets the connection
    /// (`SO_LINGER` 0).
    static func sendGarbageThenReset(port: UInt16, random: inout SplitMix, tally: LoadTally) {
        do throws(EchoFailure) {
            let client = try EchoTestClient(port: port)
            try client.send(randomBytes(1 + random.below(4_096), &random))
            if random.oneIn(2) { try EchoTestClient.waitUntilReadable(client.fd) }
            client.reset()
            tally.misdeeds.add(1, ordering: .relaxed)
        } catch {
            tally.fail("garbage client: \(error)")
        }
    }

    /// Fills the first `count` bytes of `buffer` with random bytes.
    static func fill(_ buffer: UnsafeMutableRawBufferPointer, _ count: Int, _ random: inout SplitMix) {
        var offset = 0
        while offset < count {
            var word = random.next()
            let take = min(8, count - offset)
            withUnsafeBytes(of: &word) {
                buffer.baseAddress!.advanced(by: offset).copyMemory(from: $0.baseAddress!, byteCount: take)
            }
            offset += take
        }
    }

    /// `count` random bytes.
    static func randomBytes(_ count: Int, _ random: inout SplitMix) -> [UInt8] {
        var bytes = [UInt8](repeating: 0, count: count)
        bytes.withUnsafeMutableBytes { fill($0, count, &random) }
        return bytes
    }
}

// MARK: - Client

/// A client failure, with what went wrong.
struct EchoFailure: Error, CustomStringConvertible {
    let description: String
    init(_ description: String) { self.description = description }

    /// The failure of `call`, with `errno`'s text.
    static func system(_ call: String) -> EchoFailure { EchoFailure("\(call): \(String(cString: strerror(errno)))") }
}

/// A blocking TCP client of the echo server on 127.0.0.1. Every wait is a `poll` bounded by
/// ``Robustness/EchoServerTests/patience``; data calls use `MSG_DONTWAIT`, so nothing can hang.
struct EchoTestClient: ~Copyable {
    let fd: Int32

    /// Connects to 127.0.0.1:`port`; `bufferSize` sets `SO_SNDBUF` and `SO_RCVBUF` first.
    init(port: UInt16, bufferSize: Int32? = nil) throws(EchoFailure) {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue | SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { throw .system("socket") }
        var on: Int32 = 1
        _ = setsockopt(fd, Int32(IPPROTO_TCP), TCP_NODELAY, &on, socklen_t(MemoryLayout<Int32>.size))
        if var size = bufferSize {
            _ = setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &size, socklen_t(MemoryLayout<Int32>.size))
            _ = setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &size, socklen_t(MemoryLayout<Int32>.size))
        }
        // A connect that does not complete in time fails rather than blocks for minutes.
        var timeout = timeval(tv_sec: Int(EchoServerTests.patience / 1000), tv_usec: 0)
        _ = setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = port.bigEndian
        address.sin_addr.s_addr = UInt32(0x7F00_0001).bigEndian
        while true {
            let status = withUnsafePointer(to: &address) { pointer in
                pointer.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                    connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size))
                }
            }
            if status == 0 { break }
            if errno == EINTR { continue }
            let failure = EchoFailure.system("connect")
            Glibc.close(fd)
            throw failure
        }
        self.fd = fd
    }

    deinit { Glibc.close(fd) }

    /// Closes the socket normally (FIN, or RST if echoed bytes were left unread).
    consuming func close() {}

    /// Resets the connection: `SO_LINGER` with a zero timeout makes `close` send RST.
    consuming func reset() {
        var linger = Glibc.linger(l_onoff: 1, l_linger: 0)
        _ = setsockopt(fd, SOL_SOCKET, SO_LINGER, &linger, socklen_t(MemoryLayout<Glibc.linger>.size))
    }

    /// Sends every byte of `bytes`.
    func send(_ bytes: UnsafeRawBufferPointer) throws(EchoFailure) {
        var offset = 0
        while offset < bytes.count {
            try Self.wait(fd, for: Int16(POLLOUT), "send")
            let count = Glibc.send(
                fd, bytes.baseAddress! + offset, bytes.count - offset, Int32(MSG_DONTWAIT | MSG_NOSIGNAL))
            if count > 0 {
                offset += count
            } else if errno != EAGAIN && errno != EINTR {
                throw .system("send")
            }
        }
    }

    /// Sends every byte of `bytes`.
    func send(_ bytes: [UInt8]) throws(EchoFailure) {
        try bytes.withUnsafeBytes { raw in Result { () throws(EchoFailure) in try send(raw) } }.get()
    }

    /// Reads exactly `count` bytes into the start of `buffer`.
    func receive(exactly count: Int, into buffer: UnsafeMutableRawBufferPointer) throws(EchoFailure) {
        try Self.receive(fd, exactly: count, into: buffer)
    }

    static func receive(_ fd: Int32, exactly count: Int, into buffer: UnsafeMutableRawBufferPointer) throws(EchoFailure)
    {
        var offset = 0
        while offset < count {
            try wait(fd, for: Int16(POLLIN), "the echo (\(offset) of \(count) bytes back)")
            let got = recv(fd, buffer.baseAddress! + offset, count - offset, Int32(MSG_DONTWAIT))
            if got > 0 {
                offset += got
            } else if got == 0 {
                throw EchoFailure("the server closed the connection (\(offset) of \(count) bytes back)")
            } else if errno != EAGAIN && errno != EINTR {
                throw .system("recv")
            }
        }
    }

    /// Sends `message` on `fd` and checks that the same bytes come back.
    static func roundTrip(fd: Int32, _ message: [UInt8]) throws(EchoFailure) {
        try message.withUnsafeBytes { bytes in
            Result { () throws(EchoFailure) in
                var offset = 0
                while offset < bytes.count {
                    try wait(fd, for: Int16(POLLOUT), "send")
                    let count = Glibc.send(
                        fd, bytes.baseAddress! + offset, bytes.count - offset, Int32(MSG_DONTWAIT | MSG_NOSIGNAL))
                    if count > 0 { offset += count } else if errno != EAGAIN && errno != EINTR { throw .system("send") }
                }
            }
        }.get()
        var back = [UInt8](repeating: 0, count: message.count)
        try back.withUnsafeMutableBytes { buffer in
            Result { () throws(EchoFailure) in try receive(fd, exactly: message.count, into: buffer) }
        }.get()
        guard back == message else { throw EchoFailure("\(message.count) bytes came back different") }
    }

    /// Waits until `fd` has something to read.
    static func waitUntilReadable(_ fd: Int32) throws(EchoFailure) {
        try wait(fd, for: Int16(POLLIN), "readable")
    }

    /// Whether reading `fd` reaches the end of the stream (or a reset) within the patience,
    /// discarding any data before it.
    static func readsEndOfStream(_ fd: Int32) -> Bool {
        var buffer = [UInt8](repeating: 0, count: 64 * 1024)
        while true {
            do throws(EchoFailure) {
                try wait(fd, for: Int16(POLLIN), "end of stream")
            } catch {
                return false
            }
            let count = buffer.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, Int32(MSG_DONTWAIT)) }
            if count == 0 || (count < 0 && errno == ECONNRESET) { return true }
            if count < 0 && errno != EAGAIN && errno != EINTR { return false }
        }
    }

    /// Polls `fd` for `events` (hang-ups and errors also end the wait); throws after the patience.
    private static func wait(_ fd: Int32, for events: Int16, _ what: String) throws(EchoFailure) {
        var poller = pollfd(fd: fd, events: events, revents: 0)
        while true {
            let ready = poll(&poller, 1, EchoServerTests.patience)
            if ready > 0 { return }
            if ready < 0 && errno == EINTR { continue }
            if ready < 0 { throw .system("poll") }
            throw EchoFailure("timed out after \(EchoServerTests.patience) ms waiting for \(what)")
        }
    }
}

// MARK: - Sockets of this process

/// The TCP sockets of this process whose local port is `port` (`/proc/net/tcp` entries whose
/// inode is one of this process's `socket:[inode]` descriptors), as `/proc/net/tcp` lines.
func openSocketsBound(toPort port: UInt16) -> [String] {
    let inodes = Set(
        openDescriptorTargets().compactMap { target -> Substring? in
            guard target.hasPrefix("socket:[") else { return nil }
            return target.dropFirst("socket:[".count).dropLast()
        })
    guard let file = fopen("/proc/net/tcp", "r") else { return ["/proc/net/tcp cannot be read"] }
    defer { fclose(file) }
    var found: [String] = []
    var line: UnsafeMutablePointer<CChar>?
    var capacity = 0
    defer { free(line) }
    while getline(&line, &capacity, file) > 0, let line {
        let text = String(cString: line)
        let fields = text.split(separator: " ", omittingEmptySubsequences: true)
        // sl local_address rem_address st tx_queue:rx_queue tr:tm->when retrnsmt uid timeout inode
        guard fields.count > 9, let colon = fields[1].lastIndex(of: ":"),
            let localPort = UInt16(fields[1][fields[1].index(after: colon)...], radix: 16)
        else { continue }
        if localPort == port && inodes.contains(fields[9]) { found.append(text) }
    }
    return found
}

// MARK: - Killed clients, then stop

extension EchoLoad {
    /// Two clients echo; one is killed (its kernel resets the connection: it had unread data)
    /// and one dies mid-message (an orderly close). The loop must keep serving old and new
    /// clients; then `stop()`, called from this thread (not the loop's) while a client is in the
    /// middle of sending 100 kB, must leave no socket of the server open when it returns.
    /// Returns a failure, or nil.
    static func killClientsThenStop(_ host: EchoServerHost) -> String? {
        let port = host.server.port
        do throws(EchoFailure) {
            let victim = try EchoTestClient(port: port)
            let dying = try EchoTestClient(port: port)
            let survivor = try EchoTestClient(port: port)
            for client in [victim.fd, dying.fd, survivor.fd] {
                try EchoTestClient.roundTrip(fd: client, Array("ping \(client)".utf8))
            }
            try victim.send(Array(repeating: 0xAB, count: 300))
            try EchoTestClient.waitUntilReadable(victim.fd)
            victim.reset()
            try dying.send(Array("half a mess".utf8))
            dying.close()
            guard host.events.wait(timeout: .seconds(30), until: { $0.closed >= 2 }) else {
                return "the server did not close the two dead connections"
            }
            guard host.isRunning else { return "the loop left its run" }
            try EchoTestClient.roundTrip(fd: survivor.fd, Array("still there?".utf8))
            let late = try EchoTestClient(port: port)
            try EchoTestClient.roundTrip(fd: late.fd, Array(repeating: 7, count: 5_000))
            try late.send(Array(repeating: 1, count: 100_000))

            host.server.stop()
            let left = openSocketsBound(toPort: port)
            guard left.isEmpty else { return "sockets still open on port \(port) after stop(): \(left)" }
            for fd in [survivor.fd, late.fd] {
                guard EchoTestClient.readsEndOfStream(fd) else {
                    return "client fd \(fd) did not see the server's close"
                }
            }
            return nil
        } catch {
            return "\(error)"
        }
    }

    /// ``killClientsThenStop(_:)`` on a fresh server, counting the process's descriptors before
    /// the server starts and after its loop thread has exited (the clients are closed by then).
    /// Meant for a child process: the count is the whole process's. Returns a failure, or nil.
    static func descriptorsAfterKillAndStop() -> String? {
        // Warm-up: the process-wide state a loop thread makes lazily, before counting.
        if let warm = EchoServerHost.start() {
            warm.server.stop()
            _ = warm.thread.join(timeout: .seconds(30))
        }
        let before = TestThreads.openFileDescriptors()
        let beforeKinds = describeOpenDescriptors()
        guard let host = EchoServerHost.start() else { return "the server did not start" }
        if let failure = killClientsThenStop(host) { return failure }
        guard host.runReturned.wait(timeout: .seconds(30)) else { return "run() did not return after stop()" }
        guard host.thread.join(timeout: .seconds(30)) else { return "the loop thread did not exit" }
        let after = TestThreads.openFileDescriptors()
        guard after == before else {
            return "open descriptors before \(before) (\(beforeKinds)), after \(after) (\(describeOpenDescriptors()))"
        }
        return nil
    }
}
