import CBenchSupport
import CoreFoundation
import Foundation
import RunLoopKit

import class RunLoopKit.RunLoop

/// 5. Iteration cost: a Source0 that re-signals itself, so every pass handles one source.
struct IterationWorkload: Workload {
    var iterations = 1_000_000

    var name: String { "iterate" }
    var title: String { "Iteration cost" }
    var summary: String {
        "A Source0 re-signals itself \(iterations.formatted()) times in a loop on its own thread, with no observer and with an all-activities observer (which does nothing); iterations per second of the run."
    }
    var metrics: [Metric] {
        [
            Metric("iter_per_s", "iterations/s, no observer", .perSecond, .higherIsBetter),
            Metric("iter_per_s_observed", "iterations/s, all-activities observer", .perSecond, .higherIsBetter),
            Metric("iter_per_s_watched", "iterations/s, phases watched (RunLoopKit seam)", .perSecond, .higherIsBetter),
            Metric("iter_per_s_reported", "iterations/s, iteration reporter on (RunLoopKit seam)", .perSecond, .higherIsBetter),
        ]
    }
    var implementations: [Impl] { [.runLoopKit, .cf, .floor] }
    var headline: String? { "iter_per_s" }
    /// CPU and allocations per pass: from the run without an observer (set by each run).
    var operations: (count: Int, name: String)? { (iterations, "pass") }

    private final class Spin: @unchecked Sendable {
        var count = 0
        let target: Int
        init(target: Int) { self.target = target }
    }

    /// What of RunLoopKit's instrumentation seam is on: nothing (the default), a phase watch (a
    /// clock read per phase change), or an iteration reporter that does nothing (a report per pass).
    enum Seam { case idle, watched, reported }

    private func rlk(observed: Bool, seam: Seam = .idle) -> Timed {
        let iterations = self.iterations
        return BenchThread.run {
            let loop = RunLoop.current
            let token: RunLoop.InstrumentationToken? =
                switch seam {
                case .idle: nil
                case .watched: loop.watchPhases()
                case .reported: loop.addIterationReporter { _ in }
                }
            defer { token?.cancel() }
            let spin = Spin(target: iterations)
            let me = Box<RunLoopSource?>(nil)
            let source = RunLoopSource {
                spin.count += 1
                if spin.count < spin.target { me.value!.signal() } else { RunLoop.current.stop() }
            }
            me.value = source
            loop.add(source, forMode: .default)
            let observer = RunLoopObserver(activities: .allActivities) { _, _ in }
            if observed { loop.add(observer, forMode: .default) }
            source.signal()
            let run = timed { loop.run(mode: .default, for: .seconds(600)) }
            precondition(spin.count == iterations, "RunLoopKit stopped after \(spin.count) iterations")
            observer.invalidate()
            source.invalidate()
            me.value = nil
            return run
        }
    }

    private func cf(observed: Bool) -> Timed {
        let iterations = self.iterations
        return BenchThread.run {
            let loop = CFRunLoopGetCurrent()
            let spin = Spin(target: iterations)
            let me = Box<CFSource0?>(nil)
            let source = CFSource0 {
                spin.count += 1
                if spin.count < spin.target { me.value!.signal() } else { CFRunLoopStop(CFRunLoopGetCurrent()) }
            }
            me.value = source
            CFRunLoopAddSource(loop, source.source, kCFRunLoopDefaultMode)
            let observer = CFRunLoopObserverCreateWithHandler(
                kCFAllocatorDefault, CFOptionFlags(0x0FFF_FFFF), true, 0
            ) { _, _ in }
            if observed { CFRunLoopAddObserver(loop, observer, kCFRunLoopDefaultMode) }
            source.signal()
            let run = timed { CFRunLoopRunInMode(kCFRunLoopDefaultMode, 600, false) }
            precondition(spin.count == iterations, "CF stopped after \(spin.count) iterations")
            CFRunLoopObserverInvalidate(observer)
            source.invalidate()
            me.value = nil
            return run
        }
    }

    /// Iterations per second of `run`, and (from the run without an observer) CPU and
    /// allocations per pass.
    private func figures(plain: Timed, observed: Timed) -> Measurement {
        var m: Measurement = [
            "iter_per_s": Double(iterations) / plain.seconds, "iter_per_s_observed": Double(iterations) / observed.seconds,
            Self.cpuKey: Double(plain.cpuNs) / Double(iterations),
        ]
        if plain.allocations >= 0 { m[Self.allocsKey] = Double(plain.allocations) / Double(iterations) }
        return m
    }

    func runRunLoopKit() -> Measurement {
        var m = figures(plain: rlk(observed: false), observed: rlk(observed: true))
        m["iter_per_s_watched"] = Double(iterations) / rlk(observed: false, seam: .watched).seconds
        m["iter_per_s_reported"] = Double(iterations) / rlk(observed: false, seam: .reported).seconds
        return m
    }

    func runCF() -> Measurement { figures(plain: cf(observed: false), observed: cf(observed: true)) }

    /// The same-policy floor (floors.c): per pass two observer callouts (when observed), a look
    /// at the timers, the source taken and performed, the wakeup request taken, the inbox looked
    /// at; function pointers instead of closures, no mode, no bookkeeping.
    func runFloor() -> Measurement {
        let iterations = self.iterations
        func floor(_ observed: Bool) -> Timed {
            BenchThread.run {
                var ns: UInt64 = 0
                var run = timed { ns = cbench_iterate_policy_floor(iterations, observed) }
                precondition(ns > 0, "the empty-pass floor failed")
                run.seconds = Double(ns) / 1e9
                return run
            }
        }
        return figures(plain: floor(false), observed: floor(true))
    }

    func targets(_ r: WorkloadResults) -> [TargetCheck] {
        [
            .ratio("with an all-activities observer ≥ 3× CF", r.advantage("iter_per_s_observed", over: .cf), atLeast: 3),
            .ratio("within 1.2× the same-policy floor", r.advantage("iter_per_s", over: .floor), atLeast: 1 / 1.2),
        ]
    }
}
