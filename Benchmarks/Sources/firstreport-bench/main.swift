// One fresh process's first stall report (the `firstreport` workload of runloop-bench runs it once
// per repetition): a StallMonitor (threshold 100 ms, sample interval 20 ms) starts, and at once a
// loop's block spins 300 ms. Prints `began_ms=…` (from the block's start to the began report's
// delivery), `began_late_ms=…` (that, less the threshold), `ended_ms=…` (to the ended report's
// delivery, less the block's 300 ms) and `began_symbolicated=0|1`.
import Foundation
import RunLoopKit
import RunLoopMonitor
import Synchronization

@inline(never)
func spin(until deadline: ContinuousClock.Instant) -> Double {
    var x = 1.0
    while ContinuousClock.now < deadline { for i in 0..<1000 { x = x * 1.000001 + Double(i & 7) } }
    return x
}

func milliseconds(_ duration: Duration) -> Double {
    Double(duration.components.seconds) * 1000 + Double(duration.components.attoseconds) / 1e15
}

let worker = PermanentThread(name: "first-report")
let monitor = StallMonitor(loop: worker.loop, threshold: .milliseconds(100), sampleInterval: .milliseconds(20), backoff: .none, logger: nil)
let started = Mutex<ContinuousClock.Instant?>(nil)
let done = DispatchSemaphore(value: 0)
monitor.start { event in
    let since = started.withLock { $0 }.map { ContinuousClock.now - $0 } ?? .zero
    switch event {
    case .began(let report):
        print("began_ms=\(milliseconds(since))")
        print("began_late_ms=\(milliseconds(since) - 100)")
        print("began_symbolicated=\(report.isSymbolicated ? 1 : 0)")
    case .ended:
        print("ended_ms=\(milliseconds(since) - 300)")
        done.signal()
    case .suppressed: break
    }
}
try worker.execute {
    started.withLock { $0 = ContinuousClock.now }
    _ = spin(until: .now + .milliseconds(300))
}
done.wait()
monitor.stop()
worker.stop()
