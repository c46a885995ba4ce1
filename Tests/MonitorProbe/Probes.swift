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
            case .suppressed: break
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

    static func forkWithRunningMonitors() {
        let worker = PermanentThread(name: "fork-loop")
        let stalls = StallMonitor(loop: worker.loop, threshold: .milliseconds(50), sampleInterval: .milliseconds(5), logger: nil)
        let cpu = CPUMonitor(threshold: 0.5, window: .milliseconds(20), sustainedWindows: 2, logger: nil)
        stalls.start { _ in }
        cpu.start { _ in }
        // The monitors are busy (a stall being sampled) at the fork.
        try? worker.execute { _ = probeCrunchNumbers(until: .now + .milliseconds(300)) }
        usleep(100_000)
        let child = fork()
        if child == 0 {
            stalls.stop()
            cpu.stop()
            let line = "child stopped its monitors\n"
            _ = line.withCString { write(1, $0, strlen($0)) }
            _exit(0)
        }
        var status: Int32 = 0
        var waited = 0
        while waitpid(child, &status, WNOHANG) == 0 {
            waited += 1
            if waited > 1000 {  // 10 s: the child hangs
                kill(child, SIGKILL)
                waitpid(child, &status, 0)
                say("child hung")
                exit(1)
            }
            usleep(10_000)
        }
        say("child exit \((status & 0x7f) == 0 ? (status >> 8) & 0xff : -(status & 0x7f))")
        stalls.stop()
        cpu.stop()
        worker.stop()
        say("done")
    }
}
