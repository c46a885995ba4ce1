// The example server's parts (Examples/StallServer is its executable; the lab's "blocked NIO event
// loop" experiment runs it in-process): an HTTP/1 handler on SwiftNIO with a normal endpoint,
// three that block their event loop, each in a named function, /metrics (swift-prometheus) and
// /stats (what the monitor reported).
#if SwiftNIO
import Foundation
import NIOCore
import NIOHTTP1
import NIOPosix
import Prometheus
import RunLoopMonitor
import Synchronization

// MARK: - The blocking handlers (their names are what the monitor must report)

/// `GET /block/file`: reads 96 MB from `/dev/urandom` with `read(2)`, on the event loop.
@inline(never)
public func handleSynchronousFileRead() -> Int {
    let fd = open("/dev/urandom", O_RDONLY)
    guard fd >= 0 else { return 0 }
    defer { close(fd) }
    let size = 65536
    let buffer = UnsafeMutableRawPointer.allocate(byteCount: size, alignment: 16)
    defer { buffer.deallocate() }
    var total = 0
    while total < 96 << 20 {
        let count = read(fd, buffer, size)
        if count <= 0 { break }
        total += count
    }
    return total
}

/// One record of the JSON encode.
struct Record: Encodable {
    let id: Int
    let name: String
    let tags: [String]
    let score: Double
}

/// `GET /block/json`: JSON-encodes 200,000 records, on the event loop.
@inline(never)
public func handleHugeJSONEncode() -> Int {
    let records = (0..<200_000).map { Record(id: $0, name: "record \($0)", tags: ["a", "b", "c"], score: Double($0) / 7) }
    return (try? JSONEncoder().encode(records).count) ?? 0
}

/// `GET /block/sleep`: `usleep(300 ms)`, on the event loop.
@inline(never)
public func handleSleep() -> Int {
    usleep(300_000)
    return 0
}

// MARK: - Stall bookkeeping

/// What the monitor reported, counted by the function each stall was stuck in.
public final class Tally: Sendable {
    /// An empty tally.
    public init() {}
    private let counts = Mutex<(total: Int, byFunction: [String: Int])>((0, [:]))
    /// Each blocking handler's run, in order: its function and its real duration in ms.
    private let runs = Mutex<[(function: String, milliseconds: Double)]>([])

    /// Records that `function` ran for `duration` (measured around the call, on the event loop).
    public func ran(_ function: String, for duration: Duration) {
        let milliseconds = Double(duration.components.seconds) * 1000 + Double(duration.components.attoseconds) / 1e15
        runs.withLock { $0.append((function, (milliseconds * 10).rounded() / 10)) }
    }

    /// Counts a stall that began.
    public func began(_ report: StallReport) {
        counts.withLock { counts in
            counts.total += 1
            counts.byFunction[report.stuckIn ?? "?", default: 0] += 1
        }
    }

    /// `{"byFunction": {...}, "handlers": [{"function": ..., "ms": ...}], "stalls": N}`: the
    /// stalls reported, and each blocking handler's real duration.
    public func json() -> String {
        let (total, byFunction) = counts.withLock { ($0.total, $0.byFunction) }
        let handlers = runs.withLock { $0.map { ["function": $0.function, "ms": $0.milliseconds] as [String: Any] } }
        let object: [String: Any] = ["stalls": total, "byFunction": byFunction, "handlers": handlers]
        let data = (try? JSONSerialization.data(withJSONObject: object, options: [.sortedKeys])) ?? Data()
        return String(decoding: data, as: UTF8.self)
    }
}

/// Whole milliseconds of `duration`.
public func milliseconds(_ duration: Duration) -> Int {
    Int(duration.components.seconds * 1000 + duration.components.attoseconds / 1_000_000_000_000_000)
}

/// A stall event as one JSON line on standard output.
public func printReport(_ event: StallEvent) {
    let report = event.report
    let kind: String
    switch event {
    case .began: kind = "began"
    case .ended: kind = "ended"
    case .suppressed: kind = "suppressed"
    }
    var object: [String: Any] = [
        "event": kind, "loop": report.loop, "phase": report.phase, "stuckIn": report.stuckIn ?? "",
        "durationMs": milliseconds(report.duration), "cpuRatio": (report.cpuRatio * 100).rounded() / 100,
        "thread": report.threadName,
    ]
    // A stall's first report is blamed from one sample: its stack shows what the blame came from.
    if case .began = event { object["stack"] = report.foldedStacks }
    if let data = try? JSONSerialization.data(withJSONObject: object, options: [.sortedKeys]) {
        FileHandle.standardOutput.write(data + Data("\n".utf8))
    }
}

// MARK: - HTTP

/// One connection's handler: it lives on its channel's event loop, which alone calls it.
public final class HTTPHandler: ChannelInboundHandler {
    /// HTTP/1 request parts.
    public typealias InboundIn = HTTPServerRequestPart
    /// HTTP/1 response parts.
    public typealias OutboundOut = HTTPServerResponsePart

    let registry: PrometheusCollectorRegistry
    let tally: Tally
    private var uri = ""
    private var keepAlive = true

    /// A handler that serves `/metrics` from `registry` and `/stats` from `tally`.
    public init(registry: PrometheusCollectorRegistry, tally: Tally) {
        self.registry = registry
        self.tally = tally
    }

    /// Answers each request when its end arrives (the blocking endpoints block here).
    public func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        switch unwrapInboundIn(data) {
        case .head(let head):
            uri = head.uri
            keepAlive = head.isKeepAlive
        case .body:
            break
        case .end:
            let (status, contentType, body) = respond(to: uri)
            var headers = HTTPHeaders()
            headers.add(name: "Content-Type", value: contentType)
            headers.add(name: "Content-Length", value: "\(body.utf8.count)")
            context.write(wrapOutboundOut(.head(HTTPResponseHead(version: .http1_1, status: status, headers: headers))), promise: nil)
            context.write(wrapOutboundOut(.body(.byteBuffer(context.channel.allocator.buffer(string: body)))), promise: nil)
            if keepAlive {
                context.writeAndFlush(wrapOutboundOut(.end(nil)), promise: nil)
            } else {
                // HTTP/1.0 without keep-alive: the response ends with the connection.
                let channel = context.channel
                context.writeAndFlush(wrapOutboundOut(.end(nil))).whenComplete { _ in channel.close(promise: nil) }
            }
        }
    }

    /// Runs a blocking handler and records its real duration in the tally.
    private func timed(_ name: String, _ handler: () -> Int) -> Int {
        let start = ContinuousClock.now
        let result = handler()
        tally.ran(name, for: ContinuousClock.now - start)
        return result
    }

    /// The status, content type and body for `uri`.
    func respond(to uri: String) -> (HTTPResponseStatus, String, String) {
        switch uri {
        case "/hello": return (.ok, "text/plain", "hello\n")
        case "/block/file": return (.ok, "text/plain", "read \(timed("handleSynchronousFileRead()", handleSynchronousFileRead)) bytes\n")
        case "/block/json": return (.ok, "text/plain", "encoded \(timed("handleHugeJSONEncode()", handleHugeJSONEncode)) bytes\n")
        case "/block/sleep": return (.ok, "text/plain", "slept \(timed("handleSleep()", handleSleep))\n")
        case "/metrics": return (.ok, "text/plain; version=0.0.4", registry.emitToString())
        case "/stats": return (.ok, "application/json", tally.json() + "\n")
        default: return (.notFound, "text/plain", "not found\n")
        }
    }
}


/// An HTTP server on 127.0.0.1 serving ``HTTPHandler`` on `group`.
public struct StallServer: Sendable {
    /// The listening channel.
    public let channel: any Channel
    /// The port it listens on.
    public var port: Int { channel.localAddress?.port ?? 0 }

    /// Binds `port` (0: any free port) on 127.0.0.1.
    public static func start(
        group: MultiThreadedEventLoopGroup, port: Int, registry: PrometheusCollectorRegistry, tally: Tally
    ) throws -> StallServer {
        let bootstrap = ServerBootstrap(group: group)
            .serverChannelOption(.backlog, value: 256)
            .serverChannelOption(.socketOption(.so_reuseaddr), value: 1)
            .childChannelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    try channel.pipeline.syncOperations.configureHTTPServerPipeline()
                    try channel.pipeline.syncOperations.addHandler(HTTPHandler(registry: registry, tally: tally))
                }
            }
            .childChannelOption(.socketOption(.so_reuseaddr), value: 1)
        return StallServer(channel: try bootstrap.bind(host: "127.0.0.1", port: port).wait())
    }
}
#endif
