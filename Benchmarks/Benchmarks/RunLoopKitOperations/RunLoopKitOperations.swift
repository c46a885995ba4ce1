import Benchmark
import Dispatch
import Foundation
import RunLoopKit
import Synchronization

import class RunLoopKit.RunLoop

// RunLoopKit's steady-state operations measured by package-benchmark (ordo-one/benchmark), the
// harness swift-nio and others publish with: CPU time, allocations (its malloc interposer, every
// thread), syscalls, context switches and wall time per operation. runloop-bench's interleaved
// side-by-side run gives the ratios against CFRunLoop, SwiftNIO and the C floors; this gives the
// per-operation counters in the form the field reads them.
//
//   swift package --package-path Benchmarks benchmark --target RunLoopKitOperations
//
// Each benchmark does `benchmark.scaledIterations` operations inside one measurement, so every
// counter is per operation once divided by the scaling factor (`scalingFactor: .kilo`: the
// figures are per 1,000 operations).

let benchmarks: @Sendable () -> Void = {
    let metrics: [BenchmarkMetric] = [
        .wallClock, .cpuTotal, .mallocCountTotal, .syscalls, .contextSwitches, .throughput,
    ]
    Benchmark.defaultConfiguration = .init(
        metrics: metrics, timeUnits: .nanoseconds, warmupIterations: 3, scalingFactor: .kilo,
        maxDuration: .seconds(3), maxIterations: 200)

    // A block handed to a loop thread from another thread (the caller's `perform`); the loop
    // thread runs it. One operation: one perform and one block run.
    Benchmark("submit: perform from another thread, block run on the loop") { benchmark in
        let host = LoopHost()
        defer { host.shutdown() }
        let count = benchmark.scaledIterations.count
        let sink = Sink(target: count)
        let loop = host.loop
        benchmark.startMeasurement()
        for _ in benchmark.scaledIterations { loop.perform { sink.hit() } }
        sink.done.wait()
        benchmark.stopMeasurement()
    }

    // A message sent to a MessagePort on a loop thread and handled there.
    Benchmark("port: MessagePort.send from another thread, handled on the loop") { benchmark in
        let host = LoopHost()
        defer { host.shutdown() }
        let count = benchmark.scaledIterations.count
        let sink = Sink(target: count)
        let port = MessagePort<Int> { _ in sink.hit() }
        host.loop.add(port, forMode: .default)
        benchmark.startMeasurement()
        for message in benchmark.scaledIterations {
            do { try port.send(message) } catch { fatalError("MessagePort refused a message: \(error)") }
        }
        sink.done.wait()
        benchmark.stopMeasurement()
        port.invalidate()
    }

    // A repeating timer firing on its loop's thread: the timer is made once, so an operation is
    // one fire (a wakeup of the loop by its timerfd, the handler called).
    Benchmark("fire: a repeating 20 µs timer fires") { benchmark in
        let count = benchmark.scaledIterations.count
        let fires = Counter()
        let timer = RunLoopTimer(after: .microseconds(20), repeating: .microseconds(20)) { timer in
            fires.value += 1
            if fires.value == count {
                timer.invalidate()
                RunLoop.current.stop()
            }
        }
        let loop = RunLoop.current
        loop.add(timer, forMode: .default)
        benchmark.startMeasurement()
        loop.run(mode: .default, for: .seconds(600))
        benchmark.stopMeasurement()
        precondition(fires.value == count, "\(fires.value) of \(count) fires")
    }

    // One pass of the loop: a version-0 source re-signals itself, so each pass handles it.
    Benchmark("iterate: one pass handling a signalled source") { benchmark in
        let count = benchmark.scaledIterations.count
        let passes = Counter()
        let me = SourceSlot()
        let source = RunLoopSource {
            passes.value += 1
            if passes.value < count { me.source?.signal() } else { RunLoop.current.stop() }
        }
        me.source = source
        let loop = RunLoop.current
        loop.add(source, forMode: .default)
        source.signal()
        benchmark.startMeasurement()
        loop.run(mode: .default, for: .seconds(600))
        benchmark.stopMeasurement()
        source.invalidate()
        me.source = nil
        precondition(passes.value == count, "\(passes.value) of \(count) passes")
    }
}

/// A counter bumped on one thread (the loop's) and read there or after the run returned on it.
/// `@unchecked Sendable`: only the thread that runs the loop touches `value`, and the benchmark
/// thread reads it after that loop's run has returned on that same thread.
final class Counter: @unchecked Sendable {
    var value = 0
}

/// The source that re-signals itself. `@unchecked Sendable`: set and read on the benchmark's
/// thread only (the loop runs there).
final class SourceSlot: @unchecked Sendable {
    var source: RunLoopSource?
}

/// Counts operations on the loop's thread; the last one signals `done`. `@unchecked Sendable`:
/// `count` is touched only on the loop's thread; `done` is a semaphore.
final class Sink: @unchecked Sendable {
    private var count = 0
    let target: Int
    let done = DispatchSemaphore(value: 0)
    init(target: Int) { self.target = target }
    func hit() {
        count += 1
        if count == target { done.signal() }
    }
}

/// A loop running on a thread of its own, kept alive by a source, until `shutdown()`.
final class LoopHost: Sendable {
    let loop: RunLoop
    private let exited = DispatchSemaphore(value: 0)

    init() {
        let ready = DispatchSemaphore(value: 0)
        let slot = Mutex<RunLoop?>(nil)
        let exited = self.exited
        let thread = Thread {
            let loop = RunLoop.current
            let keepAlive = RunLoopSource {}
            loop.add(keepAlive, forMode: .default)
            slot.withLock { $0 = loop }
            loop.perform { ready.signal() }
            loop.run()
            keepAlive.invalidate()
            exited.signal()
        }
        thread.start()
        ready.wait()
        loop = slot.withLock { $0! }
    }

    func shutdown() {
        loop.perform { RunLoop.current.stop() }
        exited.wait()
    }
}
