// An HTTP server on SwiftNIO whose event loops a StallMonitor watches: a normal endpoint, three
// that block their event loop (each in a named function), /metrics in Prometheus's text format and
// /stats with the monitor's own count. `.ci/stall-server-check` drives it with wrk and scrapes it
// with a real Prometheus server; the lab's "blocked NIO event loop" experiment runs the same
// handlers in-process.
//
//   stall-server --port 8080 [--threads 2] [--monitor on|off] [--heartbeats] [--reports DIR]
//
// --heartbeats: the group is made without NIOEventLoopTicks (as a framework makes it) and watched
// with `monitor.watch(group)`, by heartbeats.
//
// GET /hello         "hello": the normal endpoint
// GET /block/file    reads 96 MB from /dev/urandom synchronously on the event loop
// GET /block/json    JSON-encodes 200,000 records on the event loop
// GET /block/sleep   usleep(300 ms) on the event loop
// GET /metrics       swift-metrics through swift-prometheus (the monitor's runloop_* metrics)
// --metrics-port P: /metrics and /stats (and the rest) also on port P, on an unwatched loop.
// GET /stats         {"stalls": N, "byFunction": {...}, "handlers": [...]}: what the monitor
//                    reported, and each blocking handler's real duration (ms, timed around it)
//
// Each stall report is printed as one JSON line on standard output.
#if SwiftNIO
import Foundation
import Metrics
import NIOPosix
import NIOStallServer
import Prometheus
import RunLoopMonitor
import RunLoopMonitorNIO

struct Options {
    var port = 8080
    var threads = 2
    var monitor = true
    var heartbeats = false
    var reports: String?
    var metricsPort: Int?

    init(_ arguments: [String]) {
        var iterator = arguments.dropFirst().makeIterator()
        while let argument = iterator.next() {
            switch argument {
            case "--port": port = Int(iterator.next() ?? "") ?? port
            case "--threads": threads = max(1, Int(iterator.next() ?? "") ?? threads)
            case "--monitor": monitor = iterator.next() != "off"
            case "--heartbeats": heartbeats = true
            case "--reports": reports = iterator.next()
            case "--metrics-port": metricsPort = Int(iterator.next() ?? "")
            default:
                FileHandle.standardError.write(Data("stall-server: unknown argument \(argument)\n".utf8))
                exit(2)
            }
        }
    }
}

let options = Options(CommandLine.arguments)
let registry = PrometheusCollectorRegistry()
MetricsSystem.bootstrap(PrometheusMetricsFactory(registry: registry))
let tally = Tally()
let ticks = NIOEventLoopTicks()
let group = options.monitor && !options.heartbeats
    ? MultiThreadedEventLoopGroup(numberOfThreads: options.threads, metricsDelegate: ticks)
    : MultiThreadedEventLoopGroup(numberOfThreads: options.threads)
var monitor: StallMonitor?
if options.monitor {
    let store = try options.reports.map { try StallReportStore(directory: URL(fileURLWithPath: $0)) }
    let stallMonitor = StallMonitor(
        loops: [], threshold: .milliseconds(100), sampleInterval: .milliseconds(20), backoff: .none, store: store, logger: nil)
    if options.heartbeats {
        stallMonitor.watch(group)  // no delegate: heartbeats
    } else {
        stallMonitor.watch(group, ticks: ticks)
    }
    stallMonitor.start { event in
        if case .began(let report) = event { tally.began(report) }
        printReport(event)
    }
    monitor = stallMonitor
}

let server = try StallServer.start(group: group, port: options.port, registry: registry, tally: tally)
// /metrics and /stats on a port of their own, served by an event loop of its own (not watched):
// the listening channel of the main port lives on one of the watched loops, so while that loop is
// stalled no new connection to it is accepted, and a scrape would wait out the stall.
var metricsServer: StallServer?
if let port = options.metricsPort {
    metricsServer = try StallServer.start(group: MultiThreadedEventLoopGroup(numberOfThreads: 1), port: port, registry: registry, tally: tally)
}
FileHandle.standardError.write(Data("stall-server: listening on 127.0.0.1:\(options.port), \(options.threads) event loops, monitor \(options.monitor ? (options.heartbeats ? "on (heartbeats)" : "on (ticks)") : "off")\n".utf8))
_ = metricsServer
try server.channel.closeFuture.wait()
#else
print("stall-server needs the SwiftNIO trait: swift run --traits SwiftNIO stall-server")
#endif
