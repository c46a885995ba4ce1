import CBenchSupport
import CoreFoundation
import Foundation
import NIOCore
import NIOPosix
import RunLoopKit

import class RunLoopKit.RunLoop

/// 2. Ping-pong: two loops on two threads bounce a wakeup back and forth.
struct PingPongWorkload: Workload {
    var roundTrips = 100_000
    var operations: (count: Int, name: String)? { (roundTrips, "round trip") }

    var name: String { "pingpong" }
    var title: String { "Ping-pong between two loops" }
    var summary: String {
        "Two loops on two threads bounce a wakeup \(roundTrips.formatted()) times (RunLoopKit and CF: Source0 signal() + wakeUp() of the other loop; NIO: execute onto the other loop; floor: two pthreads with RunLoopKit's policy, an eventfd each written only while its side sleeps in epoll_wait, 5 µs of watching after a wakeup). The spin-off columns: RunLoopKit with wakeUpSpinWindow = .zero on both loops, and the floor without the watching (each side sleeps every time). Microseconds per round trip."
    }
    var metrics: [Metric] { [Metric("round_trip_us", "round trip", .microseconds, .lowerIsBetter)] }
    var implementations: [Impl] { [.runLoopKit, .cf, .nio, .floor, .runLoopKitSpinOff, .floorSpinOff] }
    var headline: String? { "round_trip_us" }
    var probesMachine: Bool { true }

    /// Round trips counted on loop A; the last one records the end time.
    private final class Rally: @unchecked Sendable {
        var count = 0
        var end: UInt64 = 0
        let target: Int
        let done = DispatchSemaphore(value: 0)
        init(target: Int) { self.target = target }
        /// Called on A when the ball is back; true while the rally goes on.
        @inline(__always) func returned() -> Bool {
            count += 1
            if count == target {
                end = cbench_now_ns()
                done.signal()
                return false
            }
            return true
        }
    }

    private func result(_ start: UInt64, _ rally: Rally) -> Measurement {
        ["round_trip_us": seconds(from: start, to: rally.end) * 1e6 / Double(roundTrips)]
    }

    func runRunLoopKit() -> Measurement { runRunLoopKit(spin: true) }
    func runRunLoopKitSpinOff() -> Measurement { runRunLoopKit(spin: false) }

    private func runRunLoopKit(spin: Bool) -> Measurement {
        let a = RunLoopKitHost()
        let b = RunLoopKitHost()
        defer {
            a.shutdown()
            b.shutdown()
        }
        if !spin {
            a.loop.wakeUpSpinWindow = .zero
            b.loop.wakeUpSpinWindow = .zero
        }
        let rally = Rally(target: roundTrips)
        let sources = Box<(onA: RunLoopSource?, onB: RunLoopSource?)>((nil, nil))
        let loopA = a.loop
        let loopB = b.loop
        let onA = RunLoopSource {
            if rally.returned() {
                sources.value.onB!.signal()
                loopB.wakeUp()
            }
        }
        let onB = RunLoopSource {
            sources.value.onA!.signal()
            loopA.wakeUp()
        }
        sources.value = (onA, onB)
        loopA.add(onA, forMode: .default)
        loopB.add(onB, forMode: .default)
        // Make sure both loops run with their sources before the serve.
        a.sync {}
        b.sync {}
        let start = cbench_now_ns()
        onB.signal()
        loopB.wakeUp()
        rally.done.wait()
        onA.invalidate()
        onB.invalidate()
        return result(start, rally)
    }

    func runCF() -> Measurement {
        let a = CFHost()
        let b = CFHost()
        defer {
            a.shutdown()
            b.shutdown()
        }
        let rally = Rally(target: roundTrips)
        let sources = Box<(onA: CFSource0?, onB: CFSource0?)>((nil, nil))
        let loopA = Unchecked(a.loop)
        let loopB = Unchecked(b.loop)
        let onA = CFSource0 {
            if rally.returned() {
                sources.value.onB!.signal()
                CFRunLoopWakeUp(loopB.value)
            }
        }
        let onB = CFSource0 {
            sources.value.onA!.signal()
            CFRunLoopWakeUp(loopA.value)
        }
        sources.value = (onA, onB)
        CFRunLoopAddSource(a.loop, onA.source, kCFRunLoopDefaultMode)
        CFRunLoopAddSource(b.loop, onB.source, kCFRunLoopDefaultMode)
        a.sync {}
        b.sync {}
        let start = cbench_now_ns()
        onB.signal()
        CFRunLoopWakeUp(b.loop)
        rally.done.wait()
        onA.invalidate()
        onB.invalidate()
        sources.value = (nil, nil)
        return result(start, rally)
    }

    func runNIO() -> Measurement {
        let a = NIOHost()
        let b = NIOHost()
        defer {
            a.shutdown()
            b.shutdown()
        }
        let rally = Rally(target: roundTrips)
        let loopA = a.loop
        let loopB = b.loop
        // A named function per side, so each bounce submits a plain closure as the others do.
        let bounce = Box<(@Sendable () -> Void)?>(nil)
        let onA: @Sendable () -> Void = {
            if rally.returned() { loopB.execute(bounce.value!) }
        }
        bounce.value = { loopA.execute(onA) }
        let start = cbench_now_ns()
        loopB.execute(bounce.value!)
        rally.done.wait()
        bounce.value = nil
        return result(start, rally)
    }

    /// The same-policy floor (floors.c: the wakeup and sleeping flags, the eventfd written only to
    /// a sleeping side, and with `spin`, 5 µs of watching after a wakeup).
    private func floor(spin: Bool) -> Measurement {
        let elapsed = cbench_pingpong_policy_floor(roundTrips, spin)
        precondition(elapsed > 0, "the eventfd + epoll ping-pong failed")
        return ["round_trip_us": Double(elapsed) / 1e3 / Double(roundTrips)]
    }

    func runFloor() -> Measurement { floor(spin: true) }
    func runFloorSpinOff() -> Measurement { floor(spin: false) }

    func targets(_ r: WorkloadResults) -> [TargetCheck] {
        guard let mine = r.median(.runLoopKit, "round_trip_us"), let floor = r.median(.floor, "round_trip_us")
        else { return [TargetCheck(target: "≤ 1.5× the C floor", met: false, measured: "no figure")] }
        return [
            TargetCheck(
                target: "≤ 1.5× the C floor", met: mine <= 1.5 * floor,
                measured: String(format: "%.2f× (%.1f µs vs %.1f µs)", mine / floor, mine, floor))
        ]
    }
}
