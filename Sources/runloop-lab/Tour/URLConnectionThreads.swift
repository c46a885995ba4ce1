import Foundation
import Glibc
import RunLoopKit
import Synchronization

import class RunLoopKit.RunLoop

/// Experiment 21 (seed 003, NSURLConnection's two threads): a socket thread reads the socket and
/// hands each event to a Source0 on a second keep-alive loop, which calls the delegate.
struct URLConnectionThreads: Experiment {
    let title = "NSURLConnection's two threads: a socket thread hands each event to a Source0 on the loader's loop"
    let seed = Seed.cite(3)
    let seedSays = """
        "当开始网络传输时,NSURLConnection 创建了两个新线程:com.apple.NSURLConnectionLoader 和 \
        com.apple.CFSocket.private。其中 CFSocket 线程是处理底层 socket 连接的。\
        NSURLConnectionLoader 这个线程内部会使用 RunLoop 来接收底层 socket 的事件,并通过之前添加的 \
        Source0 通知到上层的 Delegate。" (When a transfer starts, NSURLConnection makes two threads: \
        CFSocket.private handles the socket; NSURLConnectionLoader uses a RunLoop to receive the \
        socket's events and tells the delegate through a Source0 added earlier.) The seed shows no \
        code; the wire format, the delegate's methods and the thread names' truncation are ours.
        """
    let summary = """
        A 'server' thread writes an HTTP response into one end of a socketpair in three writes, \
        40 ms apart, and closes it. Thread 'CFSocket.private' watches the other end with a \
        FileDescriptorSource (a Source1 on Linux's epoll); each read becomes events (response, \
        data, finished) that it queues for the loader, then it signals the loader's Source0 and \
        wakes the loader's loop (a Source0 does not wake a loop by itself). A PermanentThread \
        'URLConnLoader' (NSURLConnectionLoader) keeps its loop alive; the Source0's perform drains \
        the queue and calls the delegate there. The trace names each line's thread (the kernel keeps 15 bytes of a name), and the loader's iteration reports \
        show its loop woken by .wakeUp for each hand-off that finds it asleep.
        """

    /// The response, as the server writes it: head, then the body in two parts.
    static let writes = [
        "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 26\r\n\r\n",
        "abcdefghijklm",
        "nopqrstuvwxyz",
    ]
    static let gap = Duration.milliseconds(40)

    /// What the socket thread hands to the loader.
    enum Event: Sendable, CustomStringConvertible {
        case response(status: Int)
        case data(Int)
        case finished

        var description: String {
            switch self {
            case .response(let status): ".response(\(status))"
            case .data(let count): ".data(\(count) bytes)"
            case .finished: ".finished"
            }
        }
    }

    func run() {
        let trace = TourLog()
        @Sendable func log(_ text: String) { trace.log("\(RunLoop.current.threadName.padding(toLength: 15, withPad: " ", startingAt: 0)) \(text)") }

        var ends: [Int32] = [0, 0]
        guard socketpair(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0, &ends) == 0 else {
            Out.conclusion("skipped: socketpair failed (errno \(errno))")
            return
        }
        let (serverEnd, clientEnd) = (ends[0], ends[1])

        // The loader: a keep-alive thread whose loop holds the Source0 the socket thread signals.
        let loader = PermanentThread(name: "URLConnLoader")
        LabTrace.recordIfTracing(loader.loop)
        let inbox = Mutex<[Event]>([])
        let finished = DispatchSemaphore(value: 0)
        let delegate = LoggingDelegate(log: log)
        let handOff = RunLoopSource {
            let events = inbox.locked { queued in
                defer { queued.removeAll() }
                return queued
            }
            log("  Source0 perform: \(events.count) event(s) -> the delegate")
            for event in events {
                switch event {
                case .response(let status): delegate.didReceiveResponse(status: status)
                case .data(let count): delegate.didReceiveData(count: count)
                case .finished:
                    delegate.didFinishLoading()
                    finished.signal()
                }
            }
        }
        handOff.label = "NSURLConnectionLoader's Source0"
        loader.loop.add(handOff, forMode: .default)
        let reporter = loader.loop.addIterationReporter { report in
            // Only the passes that slept and woke: the hand-offs.
            if report.wakeReason != .none { log("loader's loop woke: .\(report.wakeReason)") }
        }

        // The socket thread: reads, turns bytes into events, hands them over.
        let socketThread = LoopThread(name: "CFSocket.private") { loop in
            let parser = ResponseParser()
            let source: FileDescriptorSource
            do {
                source = try FileDescriptorSource(descriptor: clientEnd, watching: .readable, ownsDescriptor: true) {
                    source, what in
                    var buffer = [UInt8](repeating: 0, count: 4096)
                    let count = buffer.withUnsafeMutableBytes { read(clientEnd, $0.baseAddress, $0.count) }
                    let events = count > 0 ? parser.feed(buffer[0..<count]) : [.finished]
                    log("read \(count) bytes (\(what)) -> queue \(events.map(\.description).joined(separator: ", ")); signal(); wakeUp()")
                    inbox.locked { $0 += events }
                    handOff.signal()
                    loader.loop.wakeUp()
                    if count <= 0 {
                        // End of stream: this connection's socket is done, and so is the thread.
                        source.invalidate()
                    }
                }
            } catch {
                log("cannot watch the socket: \(error)")
                return
            }
            loop.add(source, forMode: .default)
            log("run(): watching the socket")
            loop.run()
            log("run() returned: no source left")
        }
        _ = socketThread.loop

        // The server: three writes, then close.
        let server = LoopThread(name: "server") { _ in
            for (index, text) in Self.writes.enumerated() {
                if index > 0 { usleep(UInt32(Self.gap / .microseconds(1))) }
                let bytes = Array(text.utf8)
                let written = bytes.withUnsafeBytes { write(serverEnd, $0.baseAddress, $0.count) }
                log("write(\(written) bytes)\(index == 0 ? ": the response's head" : ": body part \(index)")")
            }
            usleep(UInt32(Self.gap / .microseconds(1)))
            log("close()")
            close(serverEnd)
        }
        server.join()
        let done = finished.wait(timeout: .now() + .seconds(5)) == .success
        socketThread.join()
        reporter.cancel()
        handOff.invalidate()
        loader.stop()

        Out.subheading("trace (thread name, then what it did)")
        trace.printEvents()
        let texts = trace.events.map(\.text)
        let delegateCalls = texts.filter { $0.contains("delegate: ") }.count
        let handOffs = texts.filter { $0.contains("Source0 perform") }.count
        let socketReads = texts.filter { $0.contains("read ") && $0.hasPrefix("CFSocket") }.count
        let onLoader = texts.filter { $0.contains("delegate: ") }.allSatisfy { $0.hasPrefix("URLConnLoader") }
        Out.subheading(
            "summary: \(socketReads) socket reads on CFSocket.private, \(handOffs) Source0 performs and "
                + "\(delegateCalls) delegate calls, \(onLoader ? "all" : "not all") on URLConnLoader"
                + (done ? "" : "; the finish never arrived"))
        Out.conclusion(
            "the socket thread never calls the delegate: it queues, signals the Source0 and wakes the "
                + "loader's loop, which performs the Source0 in its next pass and calls the delegate on its "
                + "own thread, as the seed describes. A signal without the wakeUp() would leave the Source0 "
                + "pending until something else woke that loop.")
    }

    /// Where the response's head ends (`\r\n\r\n`), if it has arrived.
    static func headEnd(_ bytes: [UInt8]) -> Int? {
        guard bytes.count >= 4 else { return nil }
        for index in 0...(bytes.count - 4)
        where bytes[index] == 13 && bytes[index + 1] == 10 && bytes[index + 2] == 13 && bytes[index + 3] == 10 {
            return index
        }
        return nil
    }
}

/// The connection's delegate (NSURLConnectionDataDelegate's three calls), logging the thread it
/// is called on.
private final class LoggingDelegate: Sendable {
    private let log: @Sendable (String) -> Void
    private let received = Atomic<Int>(0)

    init(log: @escaping @Sendable (String) -> Void) { self.log = log }

    func didReceiveResponse(status: Int) { log("    delegate: connection:didReceiveResponse: (status \(status))") }

    func didReceiveData(count: Int) {
        let total = received.add(count, ordering: .relaxed).newValue
        log("    delegate: connection:didReceiveData: (\(count) bytes, \(total) in all)")
    }

    func didFinishLoading() { log("    delegate: connectionDidFinishLoading: (\(received.load(ordering: .relaxed)) bytes)") }
}

/// Turns the bytes read from the socket into the connection's events: the head (once), then data.
/// Called only on the socket thread; the lock makes it Sendable for the source's handler.
private final class ResponseParser: Sendable {
    private let state = Mutex<(headSeen: Bool, pending: [UInt8])>((false, []))

    /// The events `bytes` complete.
    func feed(_ bytes: ArraySlice<UInt8>) -> [URLConnectionThreads.Event] {
        state.locked { state in
            var events: [URLConnectionThreads.Event] = []
            state.pending += bytes
            if !state.headSeen, let end = URLConnectionThreads.headEnd(state.pending) {
                state.headSeen = true
                let statusLine = String(decoding: state.pending[..<end], as: UTF8.self)
                let status = Int(statusLine.split(separator: " ").dropFirst().first ?? "") ?? 0
                events.append(.response(status: status))
                state.pending.removeFirst(end + 4)
            }
            if state.headSeen, !state.pending.isEmpty {
                events.append(.data(state.pending.count))
                state.pending.removeAll()
            }
            return events
        }
    }
}
