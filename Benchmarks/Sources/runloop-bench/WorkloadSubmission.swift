import CBenchSupport
import CoreFoundation
import Foundation
import NIOCore
import NIOPosix
import RunLoopKit

import class RunLoopKit.RunLoop

/// 1. Cross-thread submission: another thread submits blocks that each wake the loop.
struct SubmissionWorkload: Workload {
    var blocks = 1_000_000
    var operations: (count: Int, name: String)? { (blocks, "block") }

    var name: String { "submit" }
    var title: String { "Cross-thread submission" }
    var summary: String {
        "Another thread submits \(blocks.formatted()) blocks, each waking the loop (RunLoopKit perform, CF CFRunLoopPerformBlock + CFRunLoopWakeUp, NIO execute); blocks per second from the first submit to the last block run."
    }
    var metrics: [Metric] {
        [
            Metric("blocks_per_s", "blocks/s", .perSecond, .higherIsBetter),
            // How the run went: a loop that keeps up with its producer takes a few blocks per
            // pass (lockstep), one that falls behind takes thousands; see BENCHMARKS.md.
            Metric("blocks_per_pass", "blocks per pass (RunLoopKit: the loop's passes)", .count, .higherIsBetter),
        ]
    }

    /// The counter the blocks bump on the loop's thread; the last one records the end time.
    private final class Sink: @unchecked Sendable {
        var count = 0
        var end: UInt64 = 0
        let target: Int
        let done = DispatchSemaphore(value: 0)
        init(target: Int) { self.target = target }
        @inline(__always) func hit() {
            count += 1
            if count == target {
                end = cbench_now_ns()
                done.signal()
            }
        }
    }

    private func measure(_ submit: (Sink) -> Void) -> Measurement {
        let sink = Sink(target: blocks)
        let start = cbench_now_ns()
        submit(sink)
        sink.done.wait()
        return ["blocks_per_s": Double(blocks) / seconds(from: start, to: sink.end)]
    }

    func runRunLoopKit() -> Measurement { runRunLoopKit(spin: true) }
    func runRunLoopKitSpinOff() -> Measurement { runRunLoopKit(spin: false) }

    private func runRunLoopKit(spin: Bool) -> Measurement {
        let host = RunLoopKitHost()
        defer { host.shutdown() }
        let loop = host.loop
        if !spin { loop.wakeUpSpinWindow = .zero }
        let passesBefore = loop.phaseSnapshot.generation
        var m = measure { sink in
            for _ in 0..<blocks { loop.perform { sink.hit() } }
        }
        let passes = loop.phaseSnapshot.generation - passesBefore
        m["blocks_per_pass"] = Double(blocks) / Double(max(passes, 1))
        return m
    }

    func runCF() -> Measurement {
        let host = CFHost()
        defer { host.shutdown() }
        let loop = host.loop
        return measure { sink in
            for _ in 0..<blocks {
                CFRunLoopPerformBlock(loop, kCFRunLoopDefaultMode) { sink.hit() }
                CFRunLoopWakeUp(loop)
            }
        }
    }

    func runNIO() -> Measurement {
        let host = NIOHost()
        defer { host.shutdown() }
        let loop = host.loop
        return measure { sink in
            for _ in 0..<blocks { loop.execute { sink.hit() } }
        }
    }

    var implementations: [Impl] { [.runLoopKit, .cf, .nio, .floor, .runLoopKitSpinOff, .floorSpinOff] }
    var headline: String? { "blocks_per_s" }
    var probesMachine: Bool { true }

    /// The same-policy floor (floors.c): a buffer under RunLoopKit's spin lock, swapped whole by the consumer, the
    /// same wakeups and spin, a function call per item (no closure, no allocation, no pass).
    func runFloor() -> Measurement { ["blocks_per_s": submissionFloorPerSecond(blocks)] }
    func runFloorSpinOff() -> Measurement { ["blocks_per_s": submissionFloorPerSecond(blocks, spin: false)] }

    func targets(_ r: WorkloadResults) -> [TargetCheck] {
        [
            .ratio("≥ 1.5× NIO", r.advantage("blocks_per_s", over: .nio), atLeast: 1.5),
            .ratio("≥ 6× CF", r.advantage("blocks_per_s", over: .cf), atLeast: 6),
            .ratio("within 1.2× the same-policy floor", r.advantage("blocks_per_s", over: .floor), atLeast: 1 / 1.2),
        ]
    }
}

/// Items per second through the same-policy submission floor (floors.c): submit's and port's floor.
func submissionFloorPerSecond(_ items: Int, spin: Bool = true) -> Double {
    let ns = cbench_submit_policy_floor(items, spin)
    precondition(ns > 0, "the submission floor failed")
    return Double(items) / (Double(ns) / 1e9)
}

extension TargetCheck {
    /// A "RunLoopKit is at least `bound` times better" target.
    static func ratio(_ target: String, _ advantage: Double?, atLeast bound: Double) -> TargetCheck {
        guard let advantage else { return TargetCheck(target: target, met: false, measured: "no figure") }
        return TargetCheck(target: target, met: advantage >= bound, measured: String(format: "%.2f×", advantage))
    }
}
