import Foundation
import RunLoopKit
import RunLoopLabNetwork
import Synchronization

import class RunLoopKit.RunLoop

/// Experiment 4 (seeds 000, 001): AFNetworking's network thread, a keep-alive thread whose run
/// loop owns the sockets: a TCP echo server (``TCPEchoServer``) whose listening socket and client
/// sockets are `FileDescriptorSource`s on that one loop.
struct NetworkThread: Experiment {
    let title = "The network thread: a TCP echo server on one keep-alive loop"
    let seed = Seed.cite(0, 1)
    let seedSays = """
        Seeds 000/001 (拓展: AFNetworking): AFNetworking makes one thread named "AFNetworking", adds \
        an NSMachPort to its loop and runs it, so that NSURLConnection's delegate callbacks arrive \
        on that background thread; work reaches it through performSelector:onThread:. The TCP echo \
        server, its clients and their sizes are ours (NSURLConnection's own two threads are \
        experiment 21).
        """
    let summary = """
        AFNetworking keeps one thread alive with a run loop and does its socket I/O there. Here that \
        thread's loop watches a listening socket and every client socket as FileDescriptorSources \
        (TCPEchoServer on 127.0.0.1). Clients on other threads connect: A sends a message; C sends \
        half a message and disconnects; A is still served; B sends 1 MiB, and as the server's sockets \
        have a 64 KiB send buffer, the kernel takes only part of some echoes: the rest waits in the \
        connection's output buffer, its source watching .writable until it drains. Then the main thread calls stop(): every socket is closed \
        and the thread's run() returns, its mode now empty.
        """

    /// Per-connection bytes the server read, and the thread ids its callbacks ran on.
    private final class Tally: Sendable {
        let received = Mutex<[TCPEchoServer.ConnectionID: Int]>([:])
        let threads = Mutex<Set<Int>>([])
        let callbacks = SharedCounter()
        let closed = DispatchSemaphore(value: 0)
    }

    func run() {
        let trace = TourLog()
        let tally = Tally()
        let published = Mutex<Result<TCPEchoServer, any Error>?>(nil)
        let ready = DispatchSemaphore(value: 0)
        let thread = LoopThread(name: "network") { loop in
            let result = Result { () throws -> TCPEchoServer in
                try TCPEchoServer(on: loop, sendBufferSize: 64 * 1024) { event in
                    tally.callbacks.increment()
                    tally.threads.locked { _ = $0.insert(EchoClient.threadID()) }
                    switch event {
                    case .received(let id, let count):
                        tally.received.locked { $0[id, default: 0] += count }
                    case .closed:
                        trace.log("network: \(event)")
                        tally.closed.signal()
                    case .accepted:
                        trace.log("network: \(event)")
                    }
                }
            }
            published.locked { $0 = result }
            ready.signal()
            guard case .success(let server) = result else { return }
            trace.log("network: thread \(EchoClient.threadID()) listens on 127.0.0.1:\(server.port), calls run()")
            loop.run()
            trace.log("network: run() returned: stop() left its mode empty")
        }
        ready.wait()
        let server: TCPEchoServer
        switch published.locked({ $0 })! {
        case .success(let value): server = value
        case .failure(let error):
            Out.conclusion("the server could not start: \(error)")
            thread.join()
            return
        }
        let main = EchoClient.threadID()
        let openBeforeStop = Mutex(0)
        let stop = {
            openBeforeStop.locked { $0 = server.statistics.open }
            trace.log("main:    stop() (\(Self.connections(openBeforeStop.locked { $0 })) open)")
            server.stop()
        }
        do throws(EchoClient.Failure) {
            let clientA = try EchoClient(port: server.port)
            let hello = Array("hello, network thread".utf8)
            let echoed = try clientA.roundTrip(hello)
            trace.log("main:    client A (thread \(main)) got back \"\(String(decoding: echoed, as: UTF8.self))\"")

            do {
                let clientC = try EchoClient(port: server.port)
                try clientC.send(Array(repeating: UInt8(ascii: "c"), count: 100))
                trace.log("main:    client C sent 100 bytes of a 200-byte message and disconnects")
            }
            if tally.closed.wait(timeout: .now() + 1) == .timedOut {
                trace.log("main:    the server did not report C's disconnection within 1 s")
            }

            let again = try clientA.roundTrip(Array("still there?".utf8))
            trace.log("main:    client A got back \"\(String(decoding: again, as: UTF8.self))\" after C left")

            let bigResult = Mutex<Result<(Int, Duration, Bool), EchoClient.Failure>?>(nil)
            let bigDone = DispatchSemaphore(value: 0)
            let port = server.port
            Thread.detachNewThread {
                let started = ContinuousClock.now
                let outcome = Result { () throws(EchoClient.Failure) in
                    let clientB = try EchoClient(port: port)
                    let message = [UInt8](unsafeUninitializedCapacity: 1 << 20) { buffer, count in
                        for index in buffer.indices {
                            buffer[index] = UInt8(truncatingIfNeeded: index &* 31 &+ index >> 8)
                        }
                        count = buffer.count
                    }
                    let echoed = try clientB.roundTrip(message)
                    let intact = echoed.count == message.count && memcmp(echoed, message, message.count) == 0
                    return (EchoClient.threadID(), ContinuousClock.now - started, intact)
                }
                bigResult.locked { $0 = outcome }
                bigDone.signal()
            }
            if bigDone.wait(timeout: .now() + 5) == .timedOut {
                trace.log("main:    client B did not finish within 5 s")
            } else {
                // B has closed its socket: let the server report it before stopping.
                _ = tally.closed.wait(timeout: .now() + 1)
                switch bigResult.locked({ $0 })! {
                case .success(let (tid, took, intact)):
                    trace.log(
                        "main:    client B (thread \(tid)) got 1 MiB back \(intact ? "intact" : "CORRUPTED") in \(TourLog.ms(took))"
                    )
                case .failure(let failure):
                    trace.log("main:    client B failed: \(failure)")
                }
            }
            stop()  // client A is still connected
        } catch {
            trace.log("main:    a client failed: \(error)")
            stop()
        }
        thread.join()
        let statistics = server.statistics
        trace.printEvents()

        let threads = tally.threads.locked { $0 }
        let received = tally.received.locked { $0 }.sorted { $0.key.rawValue < $1.key.rawValue }
        Out.conclusion(
            "\(tally.callbacks.count) server callbacks, all on thread(s) \(threads.sorted()): the network thread, "
                + "never the clients' threads")
        Out.conclusion(
            "bytes read per connection: "
                + received.map { "\($0.key) \($0.value)" }.joined(separator: ", ")
                + "; \(statistics.bytesEchoed) of \(statistics.bytesReceived) bytes echoed; output waited for "
                + ".writable \(Self.times(statistics.writableWaits)); C's disconnection disturbed no one, and "
                + "stop() closed the listener and \(Self.connections(openBeforeStop.locked { $0 })) still open")
    }

    /// `1 time`, `2 times`.
    private static func times(_ count: Int) -> String { count == 1 ? "1 time" : "\(count) times" }

    /// `1 connection`, `2 connections`.
    private static func connections(_ count: Int) -> String {
        count == 1 ? "1 connection" : "\(count) connections"
    }
}
