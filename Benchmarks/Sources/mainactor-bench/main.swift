import CBenchSupport
import CoreFoundation
import Dispatch
import Foundation
import NIOCore
import NIOPosix
import RunLoopConcurrency
import RunLoopKit

import class RunLoopKit.RunLoop

// One process per main-actor executor (the choice is process-wide and made at the top of main):
//   mainactor-bench runloopkit   RunLoop.main is the main actor's executor (RunLoopConcurrency)
//   mainactor-bench platform     the platform's: libdispatch's main queue, drained by CFRunLoop's
//                                main loop (what a Foundation program on Linux runs)
//   mainactor-bench nio          an actor pinned to a SwiftNIO event loop (NIO's executor)
// Prints `key=value` lines: hop calls per second from the global pool, and the lateness of a
// 1 ms Task.sleep on the executor (p50, p99, in microseconds).

let calls = 200_000
let sleeps = 400
let hops = 20_000

/// What the measurements call: a hop onto the executor under test and back.
protocol Target: Sendable {
    func hop() async
    func sleepLateness(_ clock: SleepClock) async -> Double
}

enum SleepClock: Sendable { case continuous, mainLoop }

@MainActor var mainCounter = 0

struct MainActorTarget: Target {
    @MainActor func hop() async { mainCounter &+= 1 }

    @MainActor func sleepLateness(_ clock: SleepClock) async -> Double {
        let start = cbench_now_ns()
        switch clock {
        case .continuous: try? await Task.sleep(for: .milliseconds(1))
        case .mainLoop: try? await Task.sleep(for: .milliseconds(1), clock: RunLoop.main.clock)
        }
        return Double(cbench_now_ns() - start) / 1_000 - 1_000
    }
}

actor NIOActor {
    /// The event loop itself as the executor (NIOPosix's loops are NIOSerialEventLoopExecutors):
    /// `EventLoop.executor` on an existential makes a new wrapper each time, which an unowned
    /// executor reference must not point to.
    let executor: any SerialExecutor
    var counter = 0
    init(loop: any EventLoop) {
        guard let executor = loop as? any SerialExecutor else { fatalError("this NIO event loop is no SerialExecutor") }
        self.executor = executor
    }
    nonisolated var unownedExecutor: UnownedSerialExecutor { executor.asUnownedSerialExecutor() }
    func hop() { counter &+= 1 }
    func sleepLateness() async -> Double {
        let start = cbench_now_ns()
        try? await Task.sleep(for: .milliseconds(1))
        return Double(cbench_now_ns() - start) / 1_000 - 1_000
    }
}

struct NIOTarget: Target {
    let actor: NIOActor
    func hop() async { await actor.hop() }
    func sleepLateness(_ clock: SleepClock) async -> Double { await actor.sleepLateness() }
}

func percentile(_ values: [Double], _ p: Double) -> Double {
    let sorted = values.sorted()
    return sorted[min(sorted.count - 1, Int(Double(sorted.count) * p))]
}

func report(_ key: String, _ value: Double) { print("\(key)=\(value)") }

/// The measurements, from a task on the global pool.
func measure(_ target: some Target, clocks: [SleepClock]) async {
    // Warm-up.
    for _ in 0..<1_000 { await target.hop() }
    let start = cbench_now_ns()
    await withTaskGroup(of: Void.self) { group in
        for _ in 0..<2 {
            group.addTask { for _ in 0..<(calls / 2) { await target.hop() } }
        }
    }
    report("calls_per_s", Double(calls) / (Double(cbench_now_ns() - start) / 1e9))
    // One hop at a time from one pool task: the round trip's latency (there and back), which the
    // throughput above hides (two callers keep the executor busy).
    var latencies: [Double] = []
    latencies.reserveCapacity(hops)
    for _ in 0..<hops {
        let before = cbench_now_ns()
        await target.hop()
        latencies.append(Double(cbench_now_ns() - before) / 1_000)
    }
    report("hop_p50_us", percentile(latencies, 0.5))
    report("hop_p99_us", percentile(latencies, 0.99))
    for clock in clocks {
        var lateness: [Double] = []
        for _ in 0..<sleeps { lateness.append(await target.sleepLateness(clock)) }
        let suffix = clock == .mainLoop ? "_loopclock" : ""
        report("sleep_p50_us" + suffix, percentile(lateness, 0.5))
        report("sleep_p99_us" + suffix, percentile(lateness, 0.99))
    }
}

@main struct MainActorBench {
    static func main() {
        alarm(120)
        switch CommandLine.arguments.dropFirst().first {
        case "runloopkit":
            RunLoopConcurrency.installMainExecutor()
            Task.detached {
                await measure(MainActorTarget(), clocks: [.continuous, .mainLoop])
                RunLoopConcurrency.stopMain()
            }
            exit(RunLoopConcurrency.runMain())
        case "platform":
            Task.detached {
                await measure(MainActorTarget(), clocks: [.continuous])
                exit(0)
            }
            CFRunLoopRun()
        case "nio":
            let group = MultiThreadedEventLoopGroup(numberOfThreads: 1)
            let target = NIOTarget(actor: NIOActor(loop: group.next()))
            let done = DispatchSemaphore(value: 0)
            Task.detached {
                await measure(target, clocks: [.continuous])
                done.signal()
            }
            done.wait()
            try? group.syncShutdownGracefully()
        default:
            print("usage: mainactor-bench runloopkit|platform|nio")
            exit(2)
        }
    }
}
