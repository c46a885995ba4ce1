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
    var implementations: [Impl] { [.runLoopKit, .cf] }

    private final class Spin: @unchecked Sendable {
        var count = 0
        let target: Int
        init(target: Int) { self.target = target }
    }

    /// What of RunLoopKit's instrumentation seam is on: nothing (the default), a phase watch (a
    /// clock read per phase change), or an iteration reporter that does nothing (a report per pass).
    enum Seam { case idle, watched, reported }

    private func rlk(observed: Bool, seam: Seam = .idle) -> Double {
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
            let start = cbench_now_ns()
            loop.run(mode: .default, for: .seconds(600))
            let elapsed = seconds(from: start, to: cbench_now_ns())
            precondition(spin.count == iterations, "RunLoopKit stopped after \(spin.count) iterations")
            observer.invalidate()
            source.invalidate()
            me.value = nil
            return Double(iterations) / elapsed
        }
    }

    private func cf(observed: Bool) -> Double {
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
            let start = cbench_now_ns()
            CFRunLoopRunInMode(kCFRunLoopDefaultMode, 600, false)
            let elapsed = seconds(from: start, to: cbench_now_ns())
            precondition(spin.count == iterations, "CF stopped after \(spin.count) iterations")
            CFRunLoopObserverInvalidate(observer)
            source.invalidate()
            me.value = nil
            return Double(iterations) / elapsed
        }
    }

    func runRunLoopKit() -> Measurement {
        [
            "iter_per_s": rlk(observed: false), "iter_per_s_observed": rlk(observed: true),
            "iter_per_s_watched": rlk(observed: false, seam: .watched),
            "iter_per_s_reported": rlk(observed: false, seam: .reported),
        ]
    }

    func runCF() -> Measurement {
        ["iter_per_s": cf(observed: false), "iter_per_s_observed": cf(observed: true)]
    }

    func targets(_ r: WorkloadResults) -> [TargetCheck] {
        [.ratio("with an all-activities observer ≥ 3× CF", r.advantage("iter_per_s_observed", over: .cf), atLeast: 3)]
    }
}
