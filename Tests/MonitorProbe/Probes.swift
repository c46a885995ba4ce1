import Foundation
import Glibc
import RunLoopKit
import RunLoopMonitor
import Synchronization

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

/// A handler that prints each began and ended report as a JSON line and signals `ended` after each
/// ended one.
func printingEvents(signalling ended: DispatchSemaphore) -> @Sendable (StallEvent) -> Void {
    { event in
        switch event {
        case .began(let report): printJSON("began", report)
        case .ended(let report):
            printJSON("ended", report)
            ended.signal()
        case .suppressed: break
        }
    }
}

enum Probes {
    static func stall() {
        let worker = PermanentThread(name: "probe-loop")
        let monitor = StallMonitor(loop: worker.loop, threshold: .milliseconds(100), sampleInterval: .milliseconds(20), logger: nil)
        let ended = DispatchSemaphore(value: 0)
        monitor.start(printingEvents(signalling: ended))
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
        monitor.start { _ in }
        try? worker.execute { _ = probeCrunchNumbers(until: .now + .seconds(3600)) }
        // Die once the began line is on disk with names (a report made before the symbol tables
        // were loaded is stored again once they are), as a process killed by the system mid-hang
        // would.
        while (try? store.reports())?.contains(where: \.isSymbolicated) != true { usleep(10_000) }
        say("began")
        kill(getpid(), SIGKILL)
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

extension Probes {
    /// A CPU monitor that runs `count` windows (at once, through its test hook, with a handler set),
    /// then reports a spinning thread through its handler and stops: in a debug build neither the
    /// handler call nor the stop may overflow the stack however many windows ran.
    static func cpuWindows(_ count: Int) {
        let monitor = CPUMonitor(threshold: 0.2, window: .milliseconds(10), sustainedWindows: 1, logger: nil)
        let windowsDone = Atomic<Bool>(false)
        let hot = DispatchSemaphore(value: 0)
        monitor.start { _ in
            // Reports before the windows are done (the scanning main thread itself) do not count.
            if windowsDone.load(ordering: .acquiring) { hot.signal() }
        }
        monitor.runWindowsForTesting(count)
        windowsDone.store(true, ordering: .releasing)
        say("windows done")
        let spin = Atomic<Bool>(true)
        let spinner = Thread { while spin.load(ordering: .relaxed) { _ = probeCrunchNumbers(until: .now + .milliseconds(5)) } }
        spinner.start()
        let reported = hot.wait(timeout: .now() + .seconds(30)) == .success
        spin.store(false, ordering: .relaxed)
        say(reported ? "hot reported" : "no hot report in 30 s")
        monitor.stop()
        say("stopped")
    }

    /// A monitor with a store in `directory` and a stall: once the began line is on disk the
    /// process exits without an ended line, as one killed mid-stall would (a namespace's first
    /// process, pid 1, ignores the SIGKILL it sends itself, so `hang` cannot be used there).
    static func began(directory: String) {
        let store = try! StallReportStore(directory: directory)
        let worker = PermanentThread(name: "hung-loop")
        let monitor = StallMonitor(loop: worker.loop, threshold: .milliseconds(100), sampleInterval: .milliseconds(20), store: store, logger: nil)
        monitor.start { event in
            if case .began(let report) = event {
                say("began pid \(report.processID)")
                _exit(0)
            }
        }
        try? worker.execute { _ = probeCrunchNumbers(until: .now + .seconds(3600)) }
        while true { sleep(10) }
    }

    /// Runs this probe with `arguments` as the first process (pid 1) of a new PID namespace
    /// (`unshare --pid --fork --mount-proc`, util-linux; needs root or a user namespace). Exits with
    /// the namespace's status, 77 when `unshare` cannot run.
    static func inNewPIDNamespace(_ arguments: [String]) -> Never {
        var path = [CChar](repeating: 0, count: Int(PATH_MAX) + 1)
        let length = readlink("/proc/self/exe", &path, path.count - 1)
        guard length > 0 else { exit(77) }
        let exe = String(decoding: path[0..<length].map { UInt8(bitPattern: $0) }, as: UTF8.self)
        let argv = ["unshare", "--pid", "--fork", "--mount-proc", exe] + arguments
        var cArguments = argv.map { strdup($0) }
        cArguments.append(nil)
        execv("/usr/bin/unshare", &cArguments)
        FileHandle.standardError.write(Data("cannot run /usr/bin/unshare: \(String(cString: strerror(errno)))\n".utf8))
        exit(77)
    }

    /// A real torn line: a `began` line of a dead process, then a `began` line the file-size limit
    /// (RLIMIT_FSIZE, SIGXFSZ ignored) cuts short, then the first report's acknowledgement and a
    /// third report. Prints whether the cut write threw, then the ids `reports()` and
    /// `unfinished()` return.
    static func tornWrite(directory: String) {
        let store = try! StallReportStore(directory: directory)
        func report(_ id: String) -> StallReport {
            // Int32.max is above any pid_max: never a running process.
            StallReport(
                id: id, processID: Int32.max, threadName: "t", threadID: 1, mode: "m", phase: "blocks", startedAt: Date(),
                duration: .milliseconds(300), threadCPUTime: .zero, cpuMeasuredOver: .zero, stacks: [], sampleCount: 0)
        }
        try! store.record(.began(report("a")))
        signal(SIGXFSZ, SIG_IGN)
        let fileSize = __rlimit_resource_t(RLIMIT_FSIZE.rawValue)
        var saved = rlimit()
        getrlimit(fileSize, &saved)
        var info = stat()
        stat(store.fileURL.path, &info)
        var limited = saved
        limited.rlim_cur = rlim_t(info.st_size) + 40  // room for part of the next line only
        setrlimit(fileSize, &limited)
        do {
            try store.record(.began(report("b")))
            say("cut write: no error")
        } catch {
            say("cut write: \(error)")
        }
        setrlimit(fileSize, &saved)
        try! store.acknowledge([report("a")])
        try! store.record(.began(report("c")))
        say("reports: \(try! store.reports().map(\.id).joined(separator: ","))")
        say("unfinished: \(try! store.unfinished().map(\.id).joined(separator: ","))")
    }

    /// Writes `count` `began` lines with ids `<tag>-<i>` to a store in `directory` that rotates
    /// at 4 KiB and keeps 1000 files (so every line is kept): run by two processes at once, the
    /// lines of both must all be there, whole. Prints "wrote N".
    static func storeWrite(directory: String, count: Int, tag: String) {
        let store = try! StallReportStore(directory: URL(fileURLWithPath: directory), maximumBytes: 4096, retainedFiles: 100)
        for index in 0..<count {
            let report = StallReport(
                id: "\(tag)-\(index)", processID: Int32.max, threadName: "t", threadID: 1, mode: "m", phase: "blocks",
                startedAt: Date(), duration: .milliseconds(300), threadCPUTime: .zero, cpuMeasuredOver: .zero, stacks: [],
                sampleCount: 0)
            try! store.record(.began(report))
        }
        say("wrote \(count)")
    }
}
