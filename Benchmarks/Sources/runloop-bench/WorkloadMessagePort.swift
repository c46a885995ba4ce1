import CBenchSupport
import CoreFoundation
import Foundation
import NIOCore
import NIOPosix
import RunLoopKit
import Synchronization

import class RunLoopKit.RunLoop

/// MessagePort throughput: one sender thread sends messages (an `Int` each) to a loop on another
/// thread. RunLoopKit `MessagePort.send` (the port is a version-1 source on the loop), SwiftNIO
/// `EventLoop.execute` with the `Int` captured, CF `CFRunLoopPerformBlock` + `CFRunLoopWakeUp`
/// (CF has no typed in-process port; a block per message is the usual way to hand a value to
/// a CFRunLoop thread). The floor is the submission floor (floors.c).
struct MessagePortWorkload: Workload {
    var messages = 1_000_000
    var operations: (count: Int, name: String)? { (messages, "message") }

    var name: String { "port" }
    var title: String { "MessagePort throughput" }
    var summary: String {
        "One thread sends \(messages.formatted()) Int messages to a loop thread (RunLoopKit MessagePort.send, NIO execute, CF CFRunLoopPerformBlock + CFRunLoopWakeUp); messages per second from the first send to the last message handled. The handler checks the order; a watchdog wakes a loop that delivered nothing for 2 s (counted)."
    }
    var metrics: [Metric] {
        [
            Metric("messages_per_s", "messages/s", .perSecond, .higherIsBetter),
            Metric("watchdog_wakeups", "watchdog wakeups", .count, .lowerIsBetter),
        ]
    }

    /// Counts messages on the loop's thread (only there); the last one records the end time.
    /// Read by the sender after `done` is signalled (the semaphore orders the reads); `progress`
    /// is the watchdog's view from the sender's thread.
    private final class Sink: @unchecked Sendable {
        var count = 0
        var outOfOrder = 0
        var end: UInt64 = 0
        let progress = Atomic<Int>(0)
        let target: Int
        let done = DispatchSemaphore(value: 0)
        init(target: Int) { self.target = target }
        @inline(__always) func receive(_ message: Int) {
            if message != count { outOfOrder += 1 }
            count += 1
            progress.store(count, ordering: .relaxed)
            if count == target {
                end = cbench_now_ns()
                done.signal()
            }
        }
    }

    /// Sends with `send`, then waits for the last message. A watchdog wakes the loop with `wake`
    /// when two checks 2 s apart see no progress with messages outstanding (a lost wakeup: without
    /// it the repetition would never end); such a repetition's time includes the stall, and the
    /// wakeups are counted as a metric and logged.
    private func measure(_ name: String, wake: () -> Void, _ send: (Sink) -> Void) -> Measurement {
        let sink = Sink(target: messages)
        let start = cbench_now_ns()
        send(sink)
        var wakeups = 0
        var seen = -1
        while sink.done.wait(timeout: .now() + 2) == .timedOut {
            let now = sink.progress.load(ordering: .relaxed)
            if now == seen {
                wakeups += 1
                FileHandle.standardError.write(
                    Data(
                        "  [port] \(name): no message delivered for 2 s (\(now) of \(messages)); watchdog wakes the loop\n"
                            .utf8))
                wake()
            }
            seen = now
        }
        precondition(sink.outOfOrder == 0, "\(sink.outOfOrder) messages out of order")
        return [
            "messages_per_s": Double(messages) / seconds(from: start, to: sink.end),
            "watchdog_wakeups": Double(wakeups),
        ]
    }

    func runRunLoopKit() -> Measurement { runRunLoopKit(spin: true) }
    func runRunLoopKitSpinOff() -> Measurement { runRunLoopKit(spin: false) }

    private func runRunLoopKit(spin: Bool) -> Measurement {
        let host = RunLoopKitHost()
        defer { host.shutdown() }
        let loop = host.loop
        if !spin { loop.wakeUpSpinWindow = .zero }
        var port: MessagePort<Int>?
        let result = measure("RunLoopKit", wake: { loop.wakeUp() }) { sink in
            let receiver = MessagePort<Int> { message in sink.receive(message) }
            port = receiver
            loop.add(receiver, forMode: .default)
            for message in 0..<messages {
                do { try receiver.send(message) } catch {
                    fatalError("MessagePort refused message \(message): \(error)")
                }
            }
        }
        port?.invalidate()
        return result
    }

    func runCF() -> Measurement {
        let host = CFHost()
        defer { host.shutdown() }
        let loop = host.loop
        return measure("CFRunLoop", wake: { CFRunLoopWakeUp(loop) }) { sink in
            for message in 0..<messages {
                CFRunLoopPerformBlock(loop, kCFRunLoopDefaultMode) { sink.receive(message) }
                CFRunLoopWakeUp(loop)
            }
        }
    }

    func runNIO() -> Measurement {
        let host = NIOHost()
        defer { host.shutdown() }
        let loop = host.loop
        return measure("SwiftNIO", wake: {}) { sink in
            for message in 0..<messages { loop.execute { sink.receive(message) } }
        }
    }

    var implementations: [Impl] { [.runLoopKit, .cf, .nio, .floor, .runLoopKitSpinOff, .floorSpinOff] }
    var headline: String? { "messages_per_s" }
    var probesMachine: Bool { true }

    /// The same-policy floor: the submission floor (floors.c), whose items are what a message is to
    /// a port, a value handed to the loop's thread and a call there (no order check).
    func runFloor() -> Measurement { ["messages_per_s": submissionFloorPerSecond(messages)] }
    func runFloorSpinOff() -> Measurement { ["messages_per_s": submissionFloorPerSecond(messages, spin: false)] }

    func targets(_ r: WorkloadResults) -> [TargetCheck] {
        [.ratio("within 1.2× the same-policy floor", r.advantage("messages_per_s", over: .floor), atLeast: 1 / 1.2)]
    }

    func notes(_ r: WorkloadResults) -> [String] {
        Impl.allCases.compactMap { impl in
            guard let samples = r.stats[impl]?["watchdog_wakeups"]?.samples else { return nil }
            let stalled = samples.filter { $0 > 0 }.count
            guard stalled > 0 else { return nil }
            return
                "\(impl.rawValue) stalled (a lost wakeup: the loop slept with messages queued) in \(stalled) of \(samples.count) repetitions; their figures include the 2 to 4 s before the watchdog woke the loop."
        }
    }
}
