import CBenchSupport
import CoreFoundation
import Foundation
import RunLoopKit
import RunLoopScheduling
import Synchronization

import class RunLoopKit.RunLoop

/// 18. `setNeedsCommit` at 10,000 calls per iteration over 1,000 keys: CommitCoalescer against
/// the ASDK-style coalescer an app writes on CFRunLoop (a beforeWaiting | exit observer and a
/// keyed dictionary under a lock).
struct CommitWorkload: Workload {
    var iterations = 50
    var callsPerIteration = 10_000
    var keys = 1_000

    var name: String { "commit" }
    var title: String { "setNeedsCommit at 10,000 calls per iteration" }
    var summary: String {
        "Each iteration a source makes \(callsPerIteration.formatted()) setNeedsCommit(key:_:) calls over \(keys.formatted()) Int keys (each key 10 times; the keys, as AnyHashable, and one closure made beforehand, so the caller allocates nothing: boxing an Int as AnyHashable at each call allocates); the commit at beforeWaiting runs each key's latest work once; a last observer signals the source and wakes the loop for the next iteration. \(iterations) timed iterations after 5 warm-up ones. CFRunLoop: the coalescer the seeds' ASDK code leads to (a beforeWaiting | exit observer at 2,000,000 in the common modes; a Mutex around a [AnyHashable: closure] dictionary and the keys' order). Per call: the calls' time over their count; allocations: mallocs on the loop's thread during the calls and the commit, per iteration."
    }
    var metrics: [Metric] {
        [
            Metric("ns_per_call", "setNeedsCommit, per call", .nanoseconds, .lowerIsBetter),
            Metric("commit_us", "commit of 1,000 keys", .microseconds, .lowerIsBetter),
            Metric("allocs_per_iteration", "allocations per iteration", .count, .lowerIsBetter),
        ]
    }
    var implementations: [Impl] { [.runLoopKit, .cf] }

    /// Timings, touched only on the loop's thread; read after it is joined.
    private final class Tally: @unchecked Sendable {
        var iteration = 0
        var callNs: UInt64 = 0
        var commitNs: UInt64 = 0
        var commitStart: UInt64 = 0
        var allocations = 0
        var ran = 0
        var timed: Bool { iteration > 5 }
    }

    private func figures(_ tally: Tally) -> Measurement {
        [
            "ns_per_call": Double(tally.callNs) / Double(iterations * callsPerIteration),
            "commit_us": Double(tally.commitNs) / Double(iterations) / 1e3,
            "allocs_per_iteration": Double(tally.allocations) / Double(iterations),
        ]
    }

    func runRunLoopKit() -> Measurement {
        let (iterations, calls, keys) = (iterations, callsPerIteration, keys)
        return figures(
            BenchThread.run {
                let loop = RunLoop.current
                let tally = Tally()
                let coalescer = CommitCoalescer(loop: loop)
                let work: @Sendable () -> Void = { tally.ran += 1 }
                let hashable = Unchecked((0..<keys).map { AnyHashable($0) })
                let source = RunLoopSource {
                    tally.iteration += 1
                    if tally.timed { cbench_alloc_counter_start() }
                    let start = cbench_now_ns()
                    for call in 0..<calls { coalescer.setNeedsCommit(key: hashable.value[call % keys], work) }
                    if tally.timed { tally.callNs += cbench_now_ns() - start }
                }
                loop.add(source, forMode: .default)
                let before = RunLoopObserver(activities: .beforeWaiting, order: CommitCoalescer.defaultOrder - 1) { _, _ in
                    tally.commitStart = cbench_now_ns()
                }
                let after = RunLoopObserver(activities: .beforeWaiting, order: Int.max) { _, _ in
                    guard tally.iteration > 0 else { return }
                    if tally.timed {
                        tally.commitNs += cbench_now_ns() - tally.commitStart
                        tally.allocations += cbench_alloc_counter_stop()
                    }
                    if tally.iteration == iterations + 5 {
                        RunLoop.current.stop()
                    } else {
                        source.signal()
                        RunLoop.current.wakeUp()
                    }
                }
                loop.add(before, forMode: .default)
                loop.add(after, forMode: .default)
                source.signal()
                loop.run(mode: .default, for: .seconds(600))
                precondition(tally.ran == (iterations + 5) * keys, "\(tally.ran) commits ran")
                for item in [before, after] { item.invalidate() }
                source.invalidate()
                coalescer.invalidate()
                return tally
            })
    }

    /// The coalescer an app writes on CFRunLoop after the seeds' ASDK code.
    private final class HandWritten: Sendable {
        /// `@unchecked Sendable`: `AnyHashable` is not `Sendable`; the keys here are the
        /// workload's `Int`s, and the struct only moves between the lock and the loop's thread.
        struct Pending: @unchecked Sendable {
            var order: [AnyHashable] = []
            var works: [AnyHashable: @Sendable () -> Void] = [:]
        }
        let pending = Mutex(Pending())

        func setNeedsCommit(key: AnyHashable, _ work: @escaping @Sendable () -> Void) {
            pending.withLock { pending in
                if pending.works.updateValue(work, forKey: key) == nil { pending.order.append(key) }
            }
        }

        func commit() {
            let batch = pending.withLock { pending -> Pending in
                defer { pending = Pending() }
                return pending
            }
            for key in batch.order { batch.works[key]?() }
        }
    }

    func runCF() -> Measurement {
        let (iterations, calls, keys) = (iterations, callsPerIteration, keys)
        return figures(
            BenchThread.run {
                let loop = CFRunLoopGetCurrent()!
                let tally = Tally()
                let coalescer = HandWritten()
                let work: @Sendable () -> Void = { tally.ran += 1 }
                let hashable = Unchecked((0..<keys).map { AnyHashable($0) })
                let commit = CFRunLoopObserverCreateWithHandler(
                    nil, CFRunLoopActivity.beforeWaiting.rawValue | CFRunLoopActivity.exit.rawValue, true, 2_000_000
                ) { _, _ in coalescer.commit() }
                CFRunLoopAddObserver(loop, commit, kCFRunLoopCommonModes)
                let source = CFSource0 {
                    tally.iteration += 1
                    if tally.timed { cbench_alloc_counter_start() }
                    let start = cbench_now_ns()
                    for call in 0..<calls { coalescer.setNeedsCommit(key: hashable.value[call % keys], work) }
                    if tally.timed { tally.callNs += cbench_now_ns() - start }
                }
                CFRunLoopAddSource(loop, source.source, kCFRunLoopDefaultMode)
                let before = CFRunLoopObserverCreateWithHandler(
                    nil, CFRunLoopActivity.beforeWaiting.rawValue, true, 2_000_000 - 1
                ) { _, _ in tally.commitStart = cbench_now_ns() }
                let after = CFRunLoopObserverCreateWithHandler(nil, CFRunLoopActivity.beforeWaiting.rawValue, true, Int.max) {
                    _, _ in
                    guard tally.iteration > 0 else { return }
                    if tally.timed {
                        tally.commitNs += cbench_now_ns() - tally.commitStart
                        tally.allocations += cbench_alloc_counter_stop()
                    }
                    if tally.iteration == iterations + 5 {
                        CFRunLoopStop(CFRunLoopGetCurrent())
                    } else {
                        source.signal()
                        CFRunLoopWakeUp(CFRunLoopGetCurrent())
                    }
                }
                CFRunLoopAddObserver(loop, before, kCFRunLoopDefaultMode)
                CFRunLoopAddObserver(loop, after, kCFRunLoopDefaultMode)
                source.signal()
                CFRunLoopRunInMode(kCFRunLoopDefaultMode, 600, false)
                precondition(tally.ran == (iterations + 5) * keys, "\(tally.ran) commits ran")
                for observer in [commit, before, after] { CFRunLoopObserverInvalidate(observer) }
                source.invalidate()
                return tally
            })
    }

    func targets(_ r: WorkloadResults) -> [TargetCheck] {
        guard let mine = r.median(.runLoopKit, "ns_per_call"), let cf = r.median(.cf, "ns_per_call") else {
            return [TargetCheck(target: "setNeedsCommit per call ≤ the hand-written coalescer's", met: false, measured: "no figure")]
        }
        return [
            TargetCheck(
                target: "setNeedsCommit per call ≤ the hand-written CF coalescer's", met: mine <= cf,
                measured: String(format: "%.0f ns vs %.0f ns", mine, cf))
        ]
    }
}
