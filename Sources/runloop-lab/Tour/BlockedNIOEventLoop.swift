import Foundation
import RunLoopKit
import RunLoopMonitor
import Synchronization
#if SwiftNIO
import NIOCore
import NIOPosix
import NIOStallServer
import Prometheus
import RunLoopMonitorNIO
#endif

/// Experiment 23 (not from the seeds: SwiftNIO, from elsewhere): an HTTP server on SwiftNIO with
/// a handler that blocks its event loop, watched by StallMonitor through NIO's tick reports, beside
/// the heartbeat check NIO users run today. Needs the package trait SwiftNIO.
struct BlockedNIOEventLoop: Experiment {
    let title = "A blocked NIO event loop: StallMonitor beside the heartbeat workaround"
    let seed = Seed.cite(0, 1, 4)
    let seedSays = """
        Seeds 000/001 ("监控卡顿", monitoring stalls) and 004 detect stalls of the main run loop \
        with an observer and a semaphore watchdog, seed 004 with "80毫秒为卡顿阈值" (80 ms is the stall threshold); see \
        experiment 8. They say nothing of servers, SwiftNIO or event loops: everything here is from \
        elsewhere — SwiftNIO's event loop and its NIOEventLoopMetricsDelegate, the heartbeat \
        workaround linked from apple/swift-nio#2410 (a task scheduled on each loop, its delay \
        measured), and RunLoopKit's StallMonitor with RunLoopMonitorNIO.
        """
    let summary = """
        An HTTP server on a 2-loop NIO group (the example server of .ci/stall-server-check, \
        in-process, on 127.0.0.1) gets a few /hello requests, then one /block/sleep, whose handler \
        sleeps 300 ms on its event loop, with two /hello requests sent 50 ms into it. Watching the \
        group: StallMonitor through NIO's tick reports (threshold 100 ms, a look every 20 ms) and \
        the workaround (a task every 50 ms on each loop, lateness measured). Both see the stall; \
        only the monitor says where it was.
        """

    func run() {
        #if SwiftNIO
        runWithNIO()
        #else
        Out.paragraph("""
            This experiment needs SwiftNIO, which RunLoopKit builds only with the package trait \
            SwiftNIO: `swift run --traits SwiftNIO runloop-lab tour --only 23`.
            """, indent: 2)
        #endif
    }

    #if SwiftNIO
    private func runWithNIO() {
        let ticks = NIOEventLoopTicks()
        let group = MultiThreadedEventLoopGroup(numberOfThreads: 2, metricsDelegate: ticks)
        defer { try? group.syncShutdownGracefully() }
        let events = Mutex<[StallEvent]>([])
        let ended = DispatchSemaphore(value: 0)
        let monitor = StallMonitor(loops: [], threshold: .milliseconds(100), sampleInterval: .milliseconds(20), backoff: .none, logger: nil)
        monitor.watch(group, ticks: ticks)
        monitor.start { event in
            events.locked { $0.append(event) }
            if case .ended = event { ended.signal() }
        }
        defer { monitor.stop() }
        let start = ContinuousClock.now
        let heartbeats = HeartbeatCheck(group: group, every: .milliseconds(50), start: start)
        defer { heartbeats.cancel() }
        let server: StallServer
        do {
            server = try StallServer.start(group: group, port: 0, registry: PrometheusCollectorRegistry(), tally: Tally())
        } catch {
            print("  cannot start the server: \(error)")
            return
        }
        defer { try? server.channel.close().wait() }
        let port = server.port
        Out.subheading("requests (each on a connection of its own; NIO spreads connections over its loops)")
        for _ in 0..<3 { print("    " + HTTPGet.line(port: port, path: "/hello", start: start)) }
        let blocking = Thread { print("    " + HTTPGet.line(port: port, path: "/block/sleep", start: start)) }
        blocking.start()
        usleep(50_000)
        let during = (0..<2).map { _ in
            let result = ResultSlot()
            Thread { result.set(HTTPGet.line(port: port, path: "/hello", start: start)) }.start()
            return result
        }
        // Returns at the monitor's `ended` report. The first report of a process waits for the
        // monitor's symbol tables (about 0.4 s here, over 10 s under a sanitizer on a loaded machine).
        _ = ended.wait(timeout: .now() + 60)
        for result in during { print("    " + result.wait() + "   (sent 50 ms into the block)") }
        Out.subheading("the heartbeat workaround (a task every 50 ms on each loop; lateness over 20 ms)")
        let late = heartbeats.late
        if late.isEmpty { print("    no heartbeat was late") }
        for line in late { print("    " + line) }
        print("    → it says that a loop was late, and by how much; not what ran.")
        Out.subheading("StallMonitor through NIO's tick reports")
        for event in events.locked({ $0 }) {
            let report = event.report
            switch event {
            case .began:
                print("    began  \(report.loop)  phase \(report.phase)  after \(milliseconds(report.duration)) ms")
            case .ended:
                print("    ended  \(report.loop)  \(milliseconds(report.duration)) ms, CPU \(Int(report.cpuRatio * 100))%, stuck in \(report.stuckIn ?? "?")")
                let frames = report.stacks.first?.frames.compactMap(\.symbol).prefix(6) ?? []
                for frame in frames { print("           \(frame)") }
            case .suppressed:
                break
            }
        }
        Out.paragraph("""
            What it shows: the handler's 300 ms sleep holds its event loop; a /hello sent meanwhile \
            waits for it when it needs that loop, either because its connection was given to it or \
            because the listening socket, which accepts every new connection, is on it. The \
            heartbeat on that loop comes back about 300 ms late, which is all the workaround can \
            say. The \
            monitor reports the stall within its threshold plus one look, on the loop's thread \
            (NIO-ELT-…), in phase tick, with about 0% CPU (a sleep) and the function it was stuck \
            in, handleSleep(), read from the thread's stack where the kernel parked it, without a \
            signal.
            """, indent: 2)
    }
    #endif
}

#if SwiftNIO
/// The workaround from apple/swift-nio#2410's discussion: a repeated task on each loop whose
/// lateness is measured. Lateness over 20 ms is noted with the loop's thread name.
final class HeartbeatCheck: Sendable {
    private let tasks: [RepeatedTask]
    private let notes: Notes

    /// The notes, shared by the loops' tasks.
    final class Notes: Sendable {
        let lines = Mutex<[String]>([])
    }

    init(group: MultiThreadedEventLoopGroup, every interval: Duration, start: ContinuousClock.Instant) {
        let notes = Notes()
        self.notes = notes
        let step = TimeAmount.nanoseconds(Int64(interval.components.seconds) * 1_000_000_000 + interval.components.attoseconds / 1_000_000_000)
        tasks = group.makeIterator().map { loop in
            let expected = Mutex(ContinuousClock.now + interval)
            return loop.scheduleRepeatedTask(initialDelay: step, delay: step) { _ in
                let now = ContinuousClock.now
                let due = expected.locked { due in
                    defer { due = now + interval }
                    return due
                }
                let lateness = now - due
                if lateness > .milliseconds(20) {
                    let name = Thread.current.name ?? "?"
                    notes.lines.locked {
                        $0.append("\(name): heartbeat \(milliseconds(lateness)) ms late, at +\(milliseconds(now - start)) ms")
                    }
                }
            }
        }
    }

    var late: [String] { notes.lines.locked { $0 } }
    func cancel() { tasks.forEach { $0.cancel() } }
}

/// A request's result line, set by the thread that made the request.
final class ResultSlot: Sendable {
    private let text = Mutex<String?>(nil)
    private let done = DispatchSemaphore(value: 0)

    func set(_ line: String) {
        text.locked { $0 = line }
        done.signal()
    }

    /// The line, once set (10 s at most).
    func wait() -> String {
        _ = done.wait(timeout: .now() + 10)
        return text.locked { $0 } ?? "no answer within 10 s"
    }
}

/// A one-shot HTTP/1.0 GET on 127.0.0.1 with a blocking socket: the status line, the time it
/// took, and when it was sent.
enum HTTPGet {
    static func line(port: Int, path: String, start: ContinuousClock.Instant) -> String {
        let sent = ContinuousClock.now
        let status = get(port: port, path: path)
        let took = ContinuousClock.now - sent
        return "GET \(path) at +\(milliseconds(sent - start)) ms: \(status), \(milliseconds(took)) ms"
    }

    static func get(port: Int, path: String) -> String {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        guard fd >= 0 else { return "socket failed (errno \(errno))" }
        defer { close(fd) }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = in_port_t(UInt16(port).bigEndian)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        let connected = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
        }
        guard connected == 0 else { return "connect failed (errno \(errno))" }
        let request = Array("GET \(path) HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n".utf8)
        guard request.withUnsafeBytes({ send(fd, $0.baseAddress, $0.count, 0) }) == request.count else { return "send failed" }
        var response: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 4096)
        while true {
            let count = chunk.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
            if count <= 0 { break }
            response += chunk[0..<count]
        }
        let text = String(decoding: response, as: UTF8.self)
        return text.split(separator: "\r\n").first.map(String.init) ?? "no response"
    }
}
#endif
