import Foundation
import Glibc
import RunLoopKit
import class RunLoopKit.RunLoop
import RunLoopMonitor
import Synchronization
import CAllocationCounter

// What a stall monitor must do in a real program, checked here in a process of its own so that
// CI runs it built both ways: in debug (RunLoopMonitorTests launch it) and in release (-O, no
// frame pointers). Each scenario prints `ok: …` or `FAIL: …`; the probe exits 1 on any failure.

/// Sleeps in glibc's usleep: a blocked stall's own function, which the report must name through
/// libc's sleep frames.
@inline(never)
func probeSleepInUsleep(_ microseconds: UInt32) -> (result: Int32, errno: Int32) {
    let result = usleep(microseconds)
    return (result, errno)
}

/// sleep(3) for `seconds`.
@inline(never)
func probeSleepInSleep(_ seconds: UInt32) -> UInt32 {
    sleep(seconds)
}

/// Busy for `duration` (a task's own function: the loop is inline, not in a helper).
@inline(never)
func probeTaskOne(_ duration: Duration) -> Double {
    let deadline = ContinuousClock.now + duration
    var x = 1.0
    while ContinuousClock.now < deadline {
        for i in 0..<1000 { x = x * 1.000001 + Double(i & 7) }
    }
    return x
}

/// The same work as ``probeTaskOne(_:)``, under another name.
@inline(never)
func probeTaskTwo(_ duration: Duration) -> Double {
    let deadline = ContinuousClock.now + duration
    var x = 2.0
    while ContinuousClock.now < deadline {
        for i in 0..<1000 { x = x * 1.000001 + Double(i & 7) }
    }
    return x
}

/// The calling thread's CPU time (its CLOCK_THREAD_CPUTIME_ID clock).
func threadCPUTime() -> Duration {
    var now = timespec()
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &now)
    return .seconds(now.tv_sec) + .nanoseconds(now.tv_nsec)
}

/// A handler as servers write them: a blocking call, then standard-library code the optimizer
/// inlines after it (`ContinuousClock.now`, arithmetic). In a release build the line table does not
/// cover the return address into this function, so a blame that needs a source file named its
/// caller (`closure #N in …`).
@inline(never)
func blockingHandler(_ microseconds: UInt32) {
    usleep(microseconds)
    lastHandled.store(ContinuousClock.now.hashValue, ordering: .relaxed)
}
let lastHandled = Atomic<Int>(0)

/// A short nap in usleep: the back-off scenario's identical stalls.
@inline(never)
func probeNap() { _ = usleep(150_000) }

/// Events of one monitor, and a way to wait for them.
final class ProbeEvents: Sendable {
    private let events = Mutex<[StallEvent]>([])
    private let arrived = DispatchSemaphore(value: 0)

    func append(_ event: StallEvent) {
        events.locked { $0.append(event) }
        arrived.signal()
    }

    var all: [StallEvent] { events.locked { $0 } }

    /// Waits until `count` ended reports came, up to `timeout`.
    func waitForEnded(_ count: Int, timeout: Duration = .seconds(20)) -> [StallReport] {
        let deadline = ContinuousClock.now + timeout
        while ended.count < count, ContinuousClock.now < deadline { _ = arrived.wait(timeout: .now() + .milliseconds(100)) }
        return ended
    }

    var began: [StallReport] { all.compactMap { if case .began(let report) = $0 { report } else { nil } } }
    var ended: [StallReport] { all.compactMap { if case .ended(let report) = $0 { report } else { nil } } }
    var summaries: [StallReport] { all.compactMap { if case .suppressed(let report) = $0 { report } else { nil } } }
}

enum Trust {
    nonisolated(unsafe) static var failures = 0

    static func check(_ condition: Bool, _ what: String, _ detail: @autoclosure () -> String = "") {
        if condition {
            say("ok: \(what)")
        } else {
            failures += 1
            say("FAIL: \(what) \(detail())")
        }
    }

    static func ms(_ duration: Duration) -> String {
        "\(duration.components.seconds * 1000 + duration.components.attoseconds / 1_000_000_000_000_000) ms"
    }

    static func run(only: String?) {
        let scenarios: [(String, () -> Void)] = [
            ("reads", kernelReads), ("usleep", usleepBlock), ("sleep", sleepInTimer), ("tasks", twoTasks), ("exit", busyTimerThenExit),
            ("backoff", backoff), ("inlined", inlinedAfterTheCall),
        ]
        for (name, scenario) in scenarios where only == nil || only == name { scenario() }
        say(failures == 0 ? "done" : "done with \(failures) failures")
        exit(failures == 0 ? 0 : 1)
    }

    /// process_vm_readv works here (its flags argument is a full-width zero: an `int` 0 passed to
    /// the variadic syscall() left garbage in the upper half, EINVAL, in every release build), so
    /// threads that never registered their stack get the bounded walk, and blocked threads the
    /// parked one.
    static func kernelReads() {
        check(ThreadStack.parkedThreadsReadWithoutSignal, "reads: blocked threads are read without a signal")
        // Under ThreadSanitizer the handler uses backtrace() (the sanitizer defers signals and
        // hands the handler a stale context), so the bounded walk is off there by design.
        guard !underThreadSanitizer else { return }
        check(ThreadStack.boundedUnwindAvailable, "reads: the bounded unwinder is available")
        check(ThreadStack.boundedUnwindAvailableForUnpreparedThreads, "reads: process_vm_readv reads this process's stacks")
    }

    /// A block that sleeps 500 ms in usleep, sampled every 10 ms: the sleep lasts its full time
    /// (the monitor never interrupts it), and the report names the block's function, lasts at
    /// least 495 ms, and shows the thread idle.
    static func usleepBlock() {
        let worker = PermanentThread(name: "usleep-loop")
        let events = ProbeEvents()
        let monitor = StallMonitor(
            loop: worker.loop, name: "usleep loop", threshold: .milliseconds(100), sampleInterval: .milliseconds(10),
            backoff: .none, logger: nil)
        monitor.start { events.append($0) }
        let outcome = Mutex<(Int32, Int32, Duration)?>(nil)
        try? worker.execute {
            let start = ContinuousClock.now
            let (result, error) = probeSleepInUsleep(500_000)
            outcome.locked { $0 = (result, error, ContinuousClock.now - start) }
        }
        let ended = events.waitForEnded(1)
        monitor.stop()
        worker.stop()
        guard let report = ended.first, let (result, error, slept) = outcome.locked({ $0 }) else {
            check(false, "usleep: a stall was reported", "\(events.all.count) events")
            return
        }
        check(result == 0 && slept >= .milliseconds(495), "usleep: the block slept its full 500 ms", "(usleep \(result), errno \(error), \(ms(slept)))")
        check(report.stuckIn?.contains("probeSleepInUsleep") == true, "usleep: stuckIn names the block's function", "(\(report.stuckIn ?? "nil"))")
        check(report.duration >= .milliseconds(495), "usleep: the report lasts at least 495 ms", "(\(ms(report.duration)))")
        check(report.cpuRatio < 0.1, "usleep: CPU under 10 % of the stall", "(\(Int(report.cpuRatio * 100)) %)")
        check(report.item == "block" && report.loop == "usleep loop", "usleep: the report names the item and the loop", "(\(report.item), \(report.loop))")
        say("usleep: stuck in \(report.stuckIn ?? "?") for \(ms(report.duration)), \(report.sampleCount) samples, CPU \(ms(report.threadCPUTime))")
    }

    /// ``blockingHandler(_:)`` (usleep, then inlined standard-library code) in a loop's block and in
    /// a serial queue's work item: both reports blame the handler, not its caller.
    static func inlinedAfterTheCall() {
        let worker = PermanentThread(name: "inlined-loop")
        let queue = DispatchQueue(label: "inlined-queue")
        let heartbeat = HeartbeatStallSource(queue: queue, name: "inlined queue", interval: .milliseconds(10))
        let events = ProbeEvents()
        let monitor = StallMonitor(loop: worker.loop, threshold: .milliseconds(100), sampleInterval: .milliseconds(10), backoff: .none, logger: nil)
        monitor.watch(heartbeat)
        monitor.start { events.append($0) }
        try? worker.execute { blockingHandler(300_000) }
        _ = events.waitForEnded(1)
        // The queue has answered heartbeats (its thread is known) before the handler blocks it.
        queue.sync {}
        usleep(50_000)
        queue.async { blockingHandler(300_000) }
        let ended = events.waitForEnded(2)
        monitor.stop()
        worker.stop()
        check(ended.count == 2, "inlined: a loop's and a queue's stalls are reported", "(\(ended.count) ended)")
        for report in ended {
            check(
                report.stuckIn?.hasPrefix("blockingHandler") == true,
                "inlined: \(report.loop) blames the handler, not its caller", "(\(report.stuckIn ?? "nil"))")
        }
    }

    /// sleep(2) in a timer callout: the sleep lasts 2 s, and so does the stall.
    static func sleepInTimer() {
        let worker = PermanentThread(name: "sleep-loop")
        let events = ProbeEvents()
        let monitor = StallMonitor(
            loop: worker.loop, threshold: .milliseconds(200), sampleInterval: .milliseconds(10), backoff: .none, logger: nil)
        monitor.start { events.append($0) }
        let outcome = Mutex<(UInt32, Duration)?>(nil)
        let timer = RunLoopTimer(after: .milliseconds(1)) { _ in
            let start = ContinuousClock.now
            let left = probeSleepInSleep(2)
            outcome.locked { $0 = (left, ContinuousClock.now - start) }
        }
        timer.label = "two-second timer"
        worker.loop.add(timer, forMode: .default)
        let ended = events.waitForEnded(1)
        monitor.stop()
        worker.stop()
        guard let report = ended.first, let (left, slept) = outcome.locked({ $0 }) else {
            check(false, "sleep: a stall was reported")
            return
        }
        check(left == 0 && slept >= .seconds(2), "sleep: sleep(2) slept its full 2 s", "(left \(left), \(ms(slept)))")
        check(report.duration >= .seconds(2), "sleep: the stall lasts at least 2 s", "(\(ms(report.duration)))")
        check(report.item == "two-second timer" && report.phase == "timers", "sleep: the report names the timer", "(\(report.item), \(report.phase))")
        check(report.stuckIn?.contains("probeSleepInSleep") == true || report.stuckIn?.contains("closure") == true,
              "sleep: stuckIn names the timer's code", "(\(report.stuckIn ?? "nil"))")
    }

    /// Two 300 ms tasks queued together: two stalls, each naming its own function.
    static func twoTasks() {
        let worker = PermanentThread(name: "tasks-loop")
        let events = ProbeEvents()
        let monitor = StallMonitor(
            loop: worker.loop, threshold: .milliseconds(100), sampleInterval: .milliseconds(10), backoff: .none, logger: nil)
        monitor.start { events.append($0) }
        // Both queued before the loop runs either: one pass runs them as two blocks.
        try? worker.execute {
            worker.loop.perform { _ = probeTaskOne(.milliseconds(300)) }
            worker.loop.perform { _ = probeTaskTwo(.milliseconds(300)) }
        }
        let ended = events.waitForEnded(2)
        monitor.stop()
        worker.stop()
        check(ended.count == 2, "tasks: two stalls reported", "(\(ended.count): \(ended.map { ms($0.duration) }))")
        guard ended.count == 2 else { return }
        check(ended[0].stuckIn?.contains("probeTaskOne") == true && ended[1].stuckIn?.contains("probeTaskTwo") == true,
              "tasks: each names its own function", "(\(ended.map { $0.stuckIn ?? "nil" }))")
        // Each task ends 300 ms after it starts by the wall clock; a report is at most two sample
        // intervals longer, plus however late the monitor's thread runs (room for a loaded machine).
        check(ended.allSatisfy { $0.duration >= .milliseconds(290) && $0.duration < .milliseconds(1000) },
              "tasks: each lasts its own 300 ms", "(\(ended.map { ms($0.duration) }))")
    }

    /// A one-shot timer busy for 600 ms, then the run ends and the thread exits: the stall ended
    /// because the loop moved on, and the CPU seen up to the last sample is reported.
    static func busyTimerThenExit() {
        let events = ProbeEvents()
        let made = DispatchSemaphore(value: 0)
        let go = DispatchSemaphore(value: 0)
        let loopCell = Mutex<RunLoop?>(nil)
        let usedCPU = Mutex<Duration>(.zero)
        let thread = Thread {
            let loop = RunLoop.current
            loopCell.locked { $0 = loop }
            made.signal()
            go.wait()
            let timer = RunLoopTimer(after: .zero) { _ in
                let before = threadCPUTime()
                _ = probeTaskOne(.milliseconds(600))
                usedCPU.locked { $0 = threadCPUTime() - before }
            }
            loop.add(timer, forMode: .default)
            loop.run(mode: .default, for: .seconds(10))
        }
        thread.start()
        made.wait()
        let loop = loopCell.locked { $0 }!
        let monitor = StallMonitor(loop: loop, threshold: .milliseconds(100), sampleInterval: .milliseconds(10), backoff: .none, logger: nil)
        monitor.start { events.append($0) }
        go.signal()
        let ended = events.waitForEnded(1)
        monitor.stop()
        guard let report = ended.first else {
            check(false, "exit: a stall was reported")
            return
        }
        check(report.endReason == .movedOn, "exit: the stall ended movedOn", "(\(report.endReason?.rawValue ?? "nil"))")
        // What the thread really used (its own CPU clock around the work): on a quiet machine
        // nearly all of the 600 ms; on a loaded one (the whole test suite in parallel on 2 cores)
        // less. The report must show at least 70 % of the duration when the thread had the CPU,
        // and at least 70 % of what it used in any case.
        let used = usedCPU.locked { $0 }
        if used >= report.duration * 0.9 {
            check(report.threadCPUTime >= report.duration * 0.7, "exit: CPU at least 70 % of the duration",
                  "(CPU \(ms(report.threadCPUTime)) of \(ms(report.duration)))")
        }
        check(report.threadCPUTime >= used * 0.7, "exit: CPU at least 70 % of what the thread used",
              "(reported \(ms(report.threadCPUTime)), used \(ms(used)), duration \(ms(report.duration)))")
    }

    /// Six identical 150 ms stalls: all six reported with back-off off; with it on, the 1st, 2nd,
    /// 3rd and 5th are, and the two held back are counted in a delivered report.
    static func backoff() {
        backoff(busy: false)
        backoff(busy: true)
    }

    /// Six identical 150 ms stalls, blocked in usleep or busy in one function (whose samples land
    /// anywhere in it and in the clock it reads): the back-off tells them apart by function, not by
    /// the exact instruction.
    static func backoff(busy: Bool) {
        let what = busy ? "busy" : "blocked"
        // Busy stalls are reported, not checked: their signature is the first sample's functions,
        // and a first sample can land in a standard-library specialization inside the executable
        // (or a sanitizer's runtime), which gives that stall a signature of its own. Measured here:
        // 4 of 6 reported in 10 of 11 runs, 5 of 6 in the other (before, with exact addresses,
        // about 9 of 10 busy stalls were reported).
        for rule in [StallMonitor.Backoff.none, .standard] {
            let worker = PermanentThread(name: "backoff-loop")
            let events = ProbeEvents()
            let monitor = StallMonitor(
                loop: worker.loop, threshold: .milliseconds(60), sampleInterval: .milliseconds(10), backoff: rule, logger: nil)
            monitor.start { events.append($0) }
            for _ in 0..<6 {
                _ = try? worker.executeAndWait { if busy { _ = probeTaskOne(.milliseconds(150)) } else { probeNap() } }
                usleep(30_000)  // the monitor sees the loop asleep between them
            }
            monitor.stop()
            worker.stop()
            let began = events.began
            let counted = began.count + began.reduce(0) { $0 + $1.suppressedSimilar } + events.summaries.reduce(0) { $0 + $1.suppressedSimilar }
            if busy {
                say("backoff \(rule == .none ? "off" : "on"), busy: \(began.count) of 6 reported, \(counted) counted (information, not checked)")
                continue
            }
            if rule == .none {
                check(began.count == 6 && events.ended.count == 6, "backoff off, \(what): 6 stalls, 6 reports", "(\(began.count) began, \(events.ended.count) ended)")
            } else {
                check(began.count == 4, "backoff on, \(what): the 1st, 2nd, 3rd and 5th reported", "(\(began.count) began)")
                check(counted == 6, "backoff on, \(what): every held-back stall is counted in a delivered report",
                      "(\(began.map(\.suppressedSimilar)) + summaries \(events.summaries.map(\.suppressedSimilar)))")
            }
        }
    }
}

/// Scenarios of the probe's hostile-use findings.
enum Hostile {
    /// fork() while another thread captures stacks in a loop (of a running thread that blocks the
    /// signal, so each capture holds the capture lock for its whole timeout) and symbolicates
    /// them: each of 20 children captures its own stack and starts and stops a stall monitor.
    static func forkWhileCapturing() {
        let stop = Atomic<Bool>(false)
        let spinnerID = Atomic<Int32>(0)
        let spinner = Thread {
            var set = sigset_t()
            sigemptyset(&set)
            sigaddset(&set, ThreadStack.signalNumber)
            pthread_sigmask(SIG_BLOCK, &set, nil)
            spinnerID.store(ProbeThreads.currentID(), ordering: .releasing)
            while !stop.load(ordering: .relaxed) { _ = probeCrunchNumbers(until: .now + .milliseconds(1)) }
        }
        spinner.start()
        while spinnerID.load(ordering: .acquiring) == 0 { usleep(1000) }
        let capturer = Thread {
            while !stop.load(ordering: .relaxed) {
                _ = try? ThreadStack.captureAddresses(threadID: spinnerID.load(ordering: .relaxed), timeout: .milliseconds(20))
                if let own = try? ThreadStack.captureAddresses(threadID: ProbeThreads.currentID()) {
                    _ = ThreadStack.symbolicate(own)
                }
            }
        }
        capturer.start()
        usleep(50_000)
        var healthy = 0
        for index in 0..<20 {
            usleep(UInt32(3_000 + index * 1_700))
            let child = fork()
            if child == 0 {
                var ok = false
                if let frames = try? ThreadStack.capture(threadID: ProbeThreads.currentID()), !frames.isEmpty {
                    // ThreadSanitizer does not support starting threads in a child of a
                    // multi-threaded process: there, the child's capture is the check.
                    guard !underThreadSanitizer else { _exit(0) }
                    let worker = PermanentThread(name: "child-loop")
                    let monitor = StallMonitor(loop: worker.loop, threshold: .milliseconds(50), sampleInterval: .milliseconds(10), logger: nil)
                    monitor.start { _ in }
                    _ = try? worker.executeAndWait { usleep(1_000) }
                    monitor.stop()
                    worker.stop()
                    ok = true
                }
                _exit(ok ? 0 : 3)
            }
            var status: Int32 = 0
            var waited = 0
            while waitpid(child, &status, WNOHANG) == 0 && waited < 1000 {
                usleep(10_000)
                waited += 1
            }
            if waited >= 1000 {
                kill(child, SIGKILL)
                waitpid(child, &status, 0)
                say("child \(index) hung")
            } else if (status & 0x7f) == 0 && (status >> 8) & 0xff == 0 {
                healthy += 1
            } else {
                say("child \(index) status \(status)")
            }
        }
        stop.store(true, ordering: .relaxed)
        usleep(100_000)
        say("children ok \(healthy)/20")
        exit(healthy == 20 ? 0 : 1)
    }

    /// Captures of a C library's kind of thread: a PTHREAD_STACK_MIN stack with about 5.5 KiB
    /// left, spinning, so each capture's signal handler runs on what is left, below the kernel's
    /// signal frame (about 3 KiB on a CPU with AVX-512 state to save). The handler keeps its walk's
    /// tables off the stack and fits (it worked with 5 KiB left here); when it kept them on the
    /// stack it needed more than 7 KiB in all, and the capture killed the process (SIGSEGV on the
    /// guard page).
    static func smallStack() {
        // AddressSanitizer's redzones make every frame of the handler and of the thread's own
        // descent larger: the stack budget this checks means nothing there.
        if underAddressSanitizer {
            say("skipped under AddressSanitizer")
            exit(0)
        }
        let stop = UnsafeMutablePointer<Atomic<Int32>>.allocate(capacity: 1)
        stop.initialize(to: Atomic(0))
        let tid = UnsafeMutablePointer<Atomic<Int32>>.allocate(capacity: 1)
        tid.initialize(to: Atomic(0))
        var thread = pthread_t()
        let started = test_start_small_stack_spinner(5_632, OpaquePointer(stop), OpaquePointer(tid), &thread)
        guard started == 0 else {
            say("cannot start the thread: \(started)")
            exit(1)
        }
        while tid.pointee.load(ordering: .acquiring) == 0 { usleep(1_000) }
        var captured = 0
        for _ in 0..<50 where (try? ThreadStack.captureAddresses(threadID: tid.pointee.load(ordering: .relaxed)))?.addresses.isEmpty == false {
            captured += 1
        }
        stop.pointee.store(1, ordering: .relaxed)
        pthread_join(thread, nil)
        say("captured \(captured)/50")
        exit(captured == 50 ? 0 : 1)
    }

    /// The capture signal's disposition changed behind ThreadStack's back: reset to its default
    /// (a send would kill the process), then taken by another handler. Each capture of a running
    /// thread is a clear error, and the process lives.
    static func handlerReplaced() {
        let stop = Atomic<Bool>(false)
        let spinnerID = Atomic<Int32>(0)
        let spinner = Thread {
            spinnerID.store(ProbeThreads.currentID(), ordering: .releasing)
            while !stop.load(ordering: .relaxed) { _ = probeCrunchNumbers(until: .now + .milliseconds(1)) }
        }
        spinner.start()
        while spinnerID.load(ordering: .acquiring) == 0 { usleep(1000) }
        try? ThreadStack.install()
        let before = try? ThreadStack.captureAddresses(threadID: spinnerID.load(ordering: .relaxed))
        say("installed: \(before == nil ? "no stack" : "stack")")
        signal(ThreadStack.signalNumber, SIG_DFL)
        do {
            _ = try ThreadStack.captureAddresses(threadID: spinnerID.load(ordering: .relaxed))
            say("default: captured")
        } catch {
            say("default: \(error)")
        }
        signal(ThreadStack.signalNumber) { _ in }
        do {
            _ = try ThreadStack.captureAddresses(threadID: spinnerID.load(ordering: .relaxed))
            say("foreign: captured")
        } catch {
            say("foreign: \(error)")
        }
        stop.store(true, ordering: .relaxed)
        say("alive")
    }
}

/// Whether this process runs under ThreadSanitizer (its runtime is linked in).
let underThreadSanitizer = dlsym(dlopen(nil, RTLD_NOW), "__tsan_init") != nil

/// Whether this process runs under AddressSanitizer.
let underAddressSanitizer = dlsym(dlopen(nil, RTLD_NOW), "__asan_init") != nil

/// The calling thread's kernel id.
enum ProbeThreads {
    static func currentID() -> Int32 { Int32(truncatingIfNeeded: syscall_gettid()) }
}

@_silgen_name("gettid")
func syscall_gettid() -> pid_t
