import CBenchSupport
import CoreFoundation
import Foundation
import NIOCore
import NIOPosix
import RunLoopKit

import class RunLoopKit.RunLoop

/// 9. Memory: bytes per live timer, and per idle loop with its thread.
struct MemoryWorkload: Workload {
    var timers = 100_000
    var loops = 100

    var name: String { "memory" }
    var title: String { "Memory" }
    var summary: String {
        "Bytes per live timer: heap in use (mallinfo2 uordblks + hblkhd) before and after creating and adding \(timers.formatted()) timers 1,000–2,000 s ahead on the loop's thread (NIO: scheduled tasks), divided by \(timers.formatted()). Bytes per idle loop: RSS (/proc/self/statm) before and after starting \(loops) loops, each on its own thread with a keep-alive source (NIO: \(loops) one-thread event loop groups), asleep; divided by \(loops)."
    }
    var metrics: [Metric] {
        [
            Metric("bytes_per_timer", "bytes/live timer", .bytes, .lowerIsBetter),
            Metric("bytes_per_loop", "RSS bytes/idle loop+thread", .bytes, .lowerIsBetter),
        ]
    }

    private var offsets: [Int64] {
        randomOffsets(timers, in: 1_000_000_000_000..<2_000_000_000_000, seed: 0x5EED_0009)
    }

    private func perTimer(_ before: Int, _ after: Int) -> Double { Double(after - before) / Double(timers) }

    private func perLoop(start: () -> Void, stop: () -> Void) -> Double {
        let before = cbench_rss_bytes()
        start()
        let after = cbench_rss_bytes()
        stop()
        return Double(after - before) / Double(loops)
    }

    func runRunLoopKit() -> Measurement {
        let offsets = self.offsets
        let host = RunLoopKitHost()
        let bytes = host.sync { () -> Double in
            let loop = RunLoop.current
            let base = ContinuousClock.now
            let before = cbench_heap_in_use()
            for offset in offsets {
                loop.add(RunLoopTimer(fireAt: base + .nanoseconds(offset)) { _ in }, forMode: .default)
            }
            return perTimer(before, cbench_heap_in_use())
        }
        host.shutdown()
        var hosts: [RunLoopKitHost] = []
        let perLoop = perLoop(
            start: { hosts = (0..<loops).map { _ in RunLoopKitHost() } },
            stop: { hosts.forEach { $0.shutdown() } })
        return ["bytes_per_timer": bytes, "bytes_per_loop": perLoop]
    }

    func runCF() -> Measurement {
        let offsets = self.offsets
        let host = CFHost()
        let bytes = host.sync { () -> Double in
            let loop = CFRunLoopGetCurrent()
            let base = cfNow()
            let before = cbench_heap_in_use()
            for offset in offsets {
                let timer = CFRunLoopTimerCreateWithHandler(kCFAllocatorDefault, base + Double(offset) / 1e9, 0, 0, 0) {
                    _ in
                }
                CFRunLoopAddTimer(loop, timer, kCFRunLoopDefaultMode)
            }
            return perTimer(before, cbench_heap_in_use())
        }
        host.shutdown()
        var hosts: [CFHost] = []
        let perLoop = perLoop(
            start: { hosts = (0..<loops).map { _ in CFHost() } },
            stop: { hosts.forEach { $0.shutdown() } })
        return ["bytes_per_timer": bytes, "bytes_per_loop": perLoop]
    }

    func runNIO() -> Measurement {
        let offsets = self.offsets
        let host = NIOHost()
        let loop = host.loop
        let bytes = host.sync { () -> Double in
            let base = NIODeadline.now()
            let before = cbench_heap_in_use()
            for offset in offsets { loop.scheduleTask(deadline: base + .nanoseconds(offset)) {} }
            return perTimer(before, cbench_heap_in_use())
        }
        host.shutdown()
        var hosts: [NIOHost] = []
        let perLoop = perLoop(
            start: {
                hosts = (0..<loops).map { _ in NIOHost() }
                hosts.forEach { $0.sync {} }  // every loop thread up and back asleep
            },
            stop: { hosts.forEach { $0.shutdown() } })
        return ["bytes_per_timer": bytes, "bytes_per_loop": perLoop]
    }

    func targets(_ r: WorkloadResults) -> [TargetCheck] { [] }
}
