import Foundation
import Glibc
import RunLoopKit
import RunLoopMonitor

/// Keeps the CPU busy until `deadline`: the function a stall report must name.
@inline(never)
func probeCrunchNumbers(until deadline: ContinuousClock.Instant) -> Double {
    var x = 1.0
    while ContinuousClock.now < deadline {
        for i in 0..<1000 { x = x * 1.000001 + Double(i & 7) }
    }
    return x
}

/// Blocks in the kernel for `duration`: the caller a blocked stall report must name.
@inline(never)
func probeBlockingRead(for duration: Duration) {
    let deadline = ContinuousClock.now + duration
    while ContinuousClock.now < deadline {
        var request = timespec(tv_sec: 0, tv_nsec: 20_000_000)
        nanosleep(&request, nil)  // EINTR (a capture signal) just goes round again
    }
}

enum Probes {
    static func stall() {
        let worker = PermanentThread(name: "probe-loop")
        let monitor = StallMonitor(loop: worker.loop, threshold: .milliseconds(100), sampleInterval: .milliseconds(20), logger: nil)
        let ended = DispatchSemaphore(value: 0)
        monitor.start { event in
            switch event {
            case .began(let report): printJSON("began", report)
            case .ended(let report):
                printJSON("ended", report)
                ended.signal()
            }
        }
        try? worker.execute { _ = probeCrunchNumbers(until: .now + .milliseconds(400)) }
        ended.wait()
        try? worker.execute { probeBlockingRead(for: .milliseconds(400)) }
        ended.wait()
        monitor.stop()
        worker.stop()
        say("done")
    }

    static func hang(directory: String) {
        let store = try! StallReportStore(directory: directory)
        let worker = PermanentThread(name: "hung-loop")
        let monitor = StallMonitor(loop: worker.loop, threshold: .milliseconds(100), sampleInterval: .milliseconds(20), store: store, logger: nil)
        monitor.start { event in
            // The began line is on disk (the store writes before the handler runs): die now, as a
            // process killed by the system mid-hang would.
            if case .began = event {
                say("began")
                kill(getpid(), SIGKILL)
            }
        }
        try? worker.execute { _ = probeCrunchNumbers(until: .now + .seconds(3600)) }
        while true { sleep(10) }
    }
}
