import Foundation
import Glibc
import RunLoopKit
import RunLoopMonitor
import Synchronization

/// Stalls while the process has no descriptor left (an accept storm fills the table exactly when
/// stalls matter): a 1 s blocked callout (`usleep`) and a 0.6 s busy one on a watched loop.
enum Descriptors {
    /// `whenFull` is "watching" (the table fills after the monitor has looked at the loop) or
    /// "start" (it is full before the monitor starts: nothing could be opened for it). Prints
    /// each event as a JSON line, "usleep returned R after MS ms", then "done".
    static func stallsWithNoDescriptorLeft(whenFull: String) {
        let worker = PermanentThread(name: "emfile-loop")
        let monitor = StallMonitor(loop: worker.loop, threshold: .milliseconds(100), sampleInterval: .milliseconds(20), backoff: .none, logger: nil)
        var filler: [Int32] = []
        if whenFull == "start" { filler = fillDescriptorTable() }
        let ended = DispatchSemaphore(value: 0)
        monitor.start(printingEvents(signalling: ended))
        if whenFull == "watching" {
            // A short stall first: the monitor has then looked at the loop (and kept its thread's
            // files) before the table fills.
            try? worker.execute { _ = probeCrunchNumbers(until: .now + .milliseconds(200)) }
            ended.wait()
            filler = fillDescriptorTable()
            say("table full")
        }
        try? worker.execute {
            let start = ContinuousClock.now
            let result = usleep(1_000_000)
            let took = ContinuousClock.now - start
            say("usleep returned \(result) after \(took.components.seconds * 1000 + took.components.attoseconds / 1_000_000_000_000_000) ms")
        }
        ended.wait()
        try? worker.execute { _ = probeCrunchNumbers(until: .now + .milliseconds(600)) }
        ended.wait()
        for fd in filler { close(fd) }
        monitor.stop()
        worker.stop()
        say("done")
    }

    /// Opens descriptors until the table is full (EMFILE); returns them.
    static func fillDescriptorTable() -> [Int32] {
        var limit = rlimit()
        getrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit)
        // A lower soft limit keeps the filler small (a test machine's hard limit may be 1 M).
        limit.rlim_cur = min(limit.rlim_cur, 4096)
        setrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit)
        var fds: [Int32] = []
        fds.reserveCapacity(Int(limit.rlim_cur))
        while true {
            let fd = dup(0)
            if fd < 0 { break }
            fds.append(fd)
        }
        let full = errno == EMFILE
        say(full ? "descriptors exhausted after \(fds.count)" : "dup failed otherwise: errno \(errno)")
        return fds
    }
}

/// The first reports of a fresh process: how long after the stall's start its `began` and
/// `ended` reports come (the symbol tables are not loaded yet). Prints
/// "first began after MS ms, stuck in NAME" and "first ended after MS ms (stall MS ms), stuck in NAME".
enum FirstReport {
    static func measure() {
        let worker = PermanentThread(name: "first-loop")
        let monitor = StallMonitor(loop: worker.loop, threshold: .milliseconds(100), sampleInterval: .milliseconds(20), backoff: .none, logger: nil)
        let started = Mutex<ContinuousClock.Instant?>(nil)
        let done = DispatchSemaphore(value: 0)
        monitor.start { event in
            let now = ContinuousClock.now
            let since = started.locked { $0 }.map { now - $0 } ?? .zero
            let ms = since.components.seconds * 1000 + since.components.attoseconds / 1_000_000_000_000_000
            switch event {
            case .began(let report): say("first began after \(ms) ms, stuck in \(report.stuckIn ?? "nil")")
            case .ended(let report):
                say("first ended after \(ms) ms (stall \(Trust.ms(report.duration))), stuck in \(report.stuckIn ?? "nil")")
                done.signal()
            case .suppressed: break
            }
        }
        try? worker.execute {
            started.locked { $0 = ContinuousClock.now }
            _ = probeCrunchNumbers(until: .now + .milliseconds(300))
        }
        done.wait()
        monitor.stop()
        worker.stop()
        say("done")
    }
}
