// A Hummingbird 2 application whose event loops RunLoopKit's stall monitor watches, set up as a
// user would from the documentation: Hummingbird's own event loop group (NIO's singleton, made
// without RunLoopMonitorNIO's tick delegate) watched by heartbeats, the monitor run as a
// swift-service-lifecycle Service among the application's services.
//
//   HummingbirdStallServer [--port 8080]
//
// GET /hello         "hello"
// GET /block/file    reads 96 MB from /dev/urandom synchronously
// GET /block/json    JSON-encodes 200,000 records
// GET /block/sleep   usleep(300 ms)
// GET /metrics       MonitorMetrics.prometheusText(): the monitor's metrics, no metrics backend
//
// Each stall that begins is printed as one JSON line on standard output ({"event":"began",...}),
// and each that ends too ({"event":"ended",...}); `.ci/stall-server-check` reads them.
//
// Hummingbird 2 runs its route handlers as Swift tasks on the global concurrent executor, which is
// Swift's own thread pool unless NIO's singleton group is installed as that executor (below, one
// line, as NIO documents it for servers). Without it, a blocking handler blocks a thread of Swift's
// pool, not an event loop: the event loops stay responsive and `monitor.watch(group)` sees nothing.
import Foundation
import Hummingbird
import NIOCore
import NIOPosix
import RunLoopMonitor
import RunLoopMonitorNIO
import RunLoopMonitorService

// Before any task runs: Swift's tasks, the route handlers among them, run on the singleton's loops.
let onEventLoops = NIOSingletons.unsafeTryInstallSingletonPosixEventLoopGroupAsConcurrencyGlobalExecutor()

var port = 8080
if let index = CommandLine.arguments.firstIndex(of: "--port"), index + 1 < CommandLine.arguments.count {
    port = Int(CommandLine.arguments[index + 1]) ?? port
}

// MARK: - The blocking handlers (their names are what the monitor must report)

@inline(never)
func readFileSynchronously() -> Int {
    let fd = open("/dev/urandom", O_RDONLY)
    guard fd >= 0 else { return 0 }
    defer { close(fd) }
    var buffer = [UInt8](repeating: 0, count: 65536)
    var total = 0
    while total < 96 << 20 {
        let count = buffer.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
        if count <= 0 { break }
        total += count
    }
    return total
}

struct Record: Encodable {
    let id: Int
    let name: String
    let tags: [String]
    let score: Double
}

@inline(never)
func encodeHugeJSON() -> Int {
    let records = (0..<200_000).map { Record(id: $0, name: "record \($0)", tags: ["a", "b", "c"], score: Double($0) / 7) }
    return (try? JSONEncoder().encode(records).count) ?? 0
}

@inline(never)
func sleepOnTheLoop() -> Int {
    usleep(300_000)
    return 0
}

// MARK: - The monitor

let group = MultiThreadedEventLoopGroup.singleton
let monitor = StallMonitor(loops: [], threshold: .milliseconds(100), sampleInterval: .milliseconds(20), backoff: .none)
monitor.watch(group)  // no tick delegate: heartbeats, which learn each loop's thread

/// A stall event as one JSON line.
func printEvent(_ event: StallEvent) {
    let report = event.report
    let kind: String
    switch event {
    case .began: kind = "began"
    case .ended: kind = "ended"
    case .suppressed: kind = "suppressed"
    }
    let duration = report.duration.components
    let object: [String: Any] = [
        "event": kind, "loop": report.loop, "stuckIn": report.stuckIn ?? "",
        "durationMs": Int(duration.seconds * 1000 + duration.attoseconds / 1_000_000_000_000_000),
        "symbolicated": report.isSymbolicated,
    ]
    if let data = try? JSONSerialization.data(withJSONObject: object, options: [.sortedKeys]) {
        FileHandle.standardOutput.write(data + Data("\n".utf8))
    }
}

// MARK: - The application

let router = Router()
router.get("hello") { _, _ in "hello\n" }
router.get("block/file") { _, _ in "read \(readFileSynchronously()) bytes\n" }
router.get("block/json") { _, _ in "encoded \(encodeHugeJSON()) bytes\n" }
router.get("block/sleep") { _, _ in "slept \(sleepOnTheLoop())\n" }
router.get("metrics") { _, _ in MonitorMetrics.prometheusText() }

var app = Application(
    router: router,
    configuration: .init(address: .hostname("127.0.0.1", port: port)),
    eventLoopGroupProvider: .shared(group)
)
app.addServices(StallMonitorService(monitor: monitor) { event in printEvent(event) })
FileHandle.standardError.write(Data("HummingbirdStallServer: 127.0.0.1:\(port), \(Array(group.makeIterator()).count) event loops, tasks on the event loops: \(onEventLoops)\n".utf8))
try await app.runService()
