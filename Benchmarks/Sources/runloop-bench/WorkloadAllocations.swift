import CBenchSupport
import CoreFoundation
import Foundation
import RunLoopKit

import class RunLoopKit.RunLoop

/// 8. Heap allocations per steady-state iteration, counted on the loop's thread.
struct AllocationWorkload: Workload {
    var warmUp = 1_000
    var sourceIterations = 10_000
    var timerWarmUp = 50
    var timerFires = 1_000
    var timerIntervalNs: Int64 = 200_000

    var name: String { "alloc" }
    var title: String { "Allocations per steady-state iteration" }
    var summary: String {
        "mallocs on the loop's thread (a malloc/calloc/realloc/memalign interposer in CBenchSupport), after a warm-up: a Source0 re-signalling itself (\(warmUp.formatted()) passes of warm-up, \(sourceIterations.formatted()) counted), and a \(timerIntervalNs / 1000) µs repeating timer (\(timerWarmUp) fires of warm-up, \(timerFires.formatted()) counted, each a sleep and a wakeup)."
    }
    var metrics: [Metric] {
        [
            Metric("source_allocs", "allocs/iteration, Source0 loop", .count, .lowerIsBetter),
            Metric("timer_allocs", "allocs/iteration, timer loop", .count, .lowerIsBetter),
        ]
    }
    var implementations: [Impl] { [.runLoopKit, .cf] }

    private final class Tally: @unchecked Sendable {
        var count = 0
        var allocations = 0
    }

    func runRunLoopKit() -> Measurement {
        precondition(cbench_alloc_counter_available(), "allocation counting is not available in this build")
        let (warmUp, counted) = (self.warmUp, self.sourceIterations)
        let perSourcePass = BenchThread.run { () -> Double in
            let tally = Tally()
            let me = Box<RunLoopSource?>(nil)
            let source = RunLoopSource {
                tally.count += 1
                if tally.count == warmUp { cbench_alloc_counter_start() }
                if tally.count == warmUp + counted {
                    tally.allocations = cbench_alloc_counter_stop()
                    RunLoop.current.stop()
                } else {
                    me.value!.signal()
                }
            }
            me.value = source
            RunLoop.current.add(source, forMode: .default)
            source.signal()
            RunLoop.current.run(mode: .default, for: .seconds(60))
            source.invalidate()
            me.value = nil
            return Double(tally.allocations) / Double(counted)
        }
        let (timerWarmUp, fires, interval) = (self.timerWarmUp, self.timerFires, self.timerIntervalNs)
        let perTimerPass = BenchThread.run { () -> Double in
            let tally = Tally()
            let timer = RunLoopTimer(after: .nanoseconds(interval), repeating: .nanoseconds(interval)) { timer in
                tally.count += 1
                if tally.count == timerWarmUp { cbench_alloc_counter_start() }
                if tally.count == timerWarmUp + fires {
                    tally.allocations = cbench_alloc_counter_stop()
                    timer.invalidate()
                    RunLoop.current.stop()
                }
            }
            RunLoop.current.add(timer, forMode: .default)
            RunLoop.current.run(mode: .default, for: .seconds(60))
            return Double(tally.allocations) / Double(fires)
        }
        return ["source_allocs": perSourcePass, "timer_allocs": perTimerPass]
    }

    func runCF() -> Measurement {
        precondition(cbench_alloc_counter_available(), "allocation counting is not available in this build")
        let (warmUp, counted) = (self.warmUp, self.sourceIterations)
        let perSourcePass = BenchThread.run { () -> Double in
            let tally = Tally()
            let me = Box<CFSource0?>(nil)
            let source = CFSource0 {
                tally.count += 1
                if tally.count == warmUp { cbench_alloc_counter_start() }
                if tally.count == warmUp + counted {
                    tally.allocations = cbench_alloc_counter_stop()
                    CFRunLoopStop(CFRunLoopGetCurrent())
                } else {
                    me.value!.signal()
                }
            }
            me.value = source
            CFRunLoopAddSource(CFRunLoopGetCurrent(), source.source, kCFRunLoopDefaultMode)
            source.signal()
            CFRunLoopRunInMode(kCFRunLoopDefaultMode, 60, false)
            source.invalidate()
            me.value = nil
            return Double(tally.allocations) / Double(counted)
        }
        let (timerWarmUp, fires, interval) = (self.timerWarmUp, self.timerFires, Double(self.timerIntervalNs) / 1e9)
        let perTimerPass = BenchThread.run { () -> Double in
            let tally = Tally()
            let timer = CFRunLoopTimerCreateWithHandler(kCFAllocatorDefault, cfNow() + interval, interval, 0, 0) {
                timer in
                tally.count += 1
                if tally.count == timerWarmUp { cbench_alloc_counter_start() }
                if tally.count == timerWarmUp + fires {
                    tally.allocations = cbench_alloc_counter_stop()
                    CFRunLoopTimerInvalidate(timer)
                    CFRunLoopStop(CFRunLoopGetCurrent())
                }
            }
            CFRunLoopAddTimer(CFRunLoopGetCurrent(), timer, kCFRunLoopDefaultMode)
            CFRunLoopRunInMode(kCFRunLoopDefaultMode, 60, false)
            return Double(tally.allocations) / Double(fires)
        }
        return ["source_allocs": perSourcePass, "timer_allocs": perTimerPass]
    }

    func targets(_ r: WorkloadResults) -> [TargetCheck] {
        ["source_allocs", "timer_allocs"].map { key in
            let label = key == "source_allocs" ? "Source0 loop" : "timer loop"
            guard let s = r.stats[.runLoopKit]?[key] else {
                return TargetCheck(target: "0 allocations per iteration, \(label)", met: false, measured: "no figure")
            }
            return TargetCheck(
                target: "0 allocations per iteration, \(label)", met: s.max == 0,
                measured: String(format: "%.3f (max %.3f)", s.median, s.max))
        }
    }
}
