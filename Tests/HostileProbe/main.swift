// HostileProbe: hostile scenarios that must run in a process of their own.
//
// Test support for Tests/RunLoopKitTests/Hostile. Some scenarios change process-wide state
// (the descriptor limit, every free descriptor, fork()), some hang or trap on a broken library
// (a thread-exit teardown that deadlocks, a Duration that traps on a NaN date, an arithmetic
// overflow in the timer code), and some count the process's descriptors exactly. None of that may
// happen inside the test process, where it would disturb the suites running in parallel or take
// the whole run down. So the tests launch this program, one scenario per launch:
//
//     HostileProbe <scenario> [arguments]
//
// A scenario prints `key: value` lines, unbuffered, as it goes (a probe that traps or is killed
// keeps what it printed), then `done`, and exits 0. Every wait is bounded: a scenario that would
// hang on a broken library prints what it saw (`...finished: false`) and exits; an alarm ends a
// probe that hangs anyway (and the test kills it after its own timeout).

import CAllocationCounter
import CRunLoopKit
import Dispatch
import Glibc
import RunLoopKit
import Synchronization
import SystemPackage

#if canImport(FoundationEssentials)
import FoundationEssentials
#else
import Foundation
#endif

// MARK: - Output

/// Writes one line to standard output at once.
@Sendable func emit(_ line: String) {
    var text = line + "\n"
    text.withUTF8 { bytes in
        var offset = 0
        while offset < bytes.count {
            let written = write(1, bytes.baseAddress! + offset, bytes.count - offset)
            if written < 0 {
                if errno == EINTR { continue }
                return
            }
            offset += written
        }
    }
}

/// Milliseconds since `startNs` (a `crlk_boottime_ns()` reading), with one decimal.
@Sendable func millisecondsSince(_ startNs: Int64) -> Double {
    (Double(crlk_boottime_ns() - startNs) / 100_000).rounded() / 10
}

// MARK: - Threads and events

/// A pthread running one closure; ``join(timeout:)`` sees its full exit (thread-local
/// destructors, and so a run loop's teardown, included) or gives up.
final class ProbeThread: Sendable {
    private let exited = DispatchSemaphore(value: 0)

    init(name: String, _ body: @escaping @Sendable () -> Void) {
        let thread = Self.start(name: name, body)
        let exited = self.exited
        let joiner = Self.start(name: "hp-joiner") {
            pthread_join(thread, nil)
            exited.signal()
        }
        pthread_detach(joiner)
    }

    /// Waits for the thread's exit; false if it has not exited within `seconds`.
    func join(seconds: Double) -> Bool {
        guard exited.wait(timeout: .now() + seconds) == .success else { return false }
        exited.signal()
        return true
    }

    private static func start(name: String, _ body: @escaping @Sendable () -> Void) -> pthread_t {
        let box = Unmanaged.passRetained(Body(name: name, body)).toOpaque()
        var thread = pthread_t()
        let status = pthread_create(
            &thread, nil,
            { raw in
                let body = Unmanaged<Body>.fromOpaque(raw!).takeRetainedValue()
                _ = crlk_set_thread_name(body.name)
                body.body()
                return nil
            }, box)
        precondition(status == 0, "pthread_create failed: \(status)")
        return thread
    }

    private final class Body: Sendable {
        let name: String
        let body: @Sendable () -> Void
        init(name: String, _ body: @escaping @Sendable () -> Void) {
            self.name = name
            self.body = body
        }
    }
}

/// A one-shot event with bounded waits.
final class Event: Sendable {
    private let semaphore = DispatchSemaphore(value: 0)
    private let fired = Atomic<Bool>(false)

    func fire() {
        if !fired.exchange(true, ordering: .acquiringAndReleasing) { semaphore.signal() }
    }

    var isFired: Bool { fired.load(ordering: .acquiring) }

    /// Waits until fired; false after `seconds`.
    func wait(seconds: Double) -> Bool {
        guard semaphore.wait(timeout: .now() + seconds) == .success else { return false }
        semaphore.signal()
        return true
    }
}

/// A counter shared between threads.
final class Counter: Sendable {
    private let value = Atomic<Int>(0)
    @discardableResult
    func increment() -> Int { value.add(1, ordering: .relaxed).newValue }
    var count: Int { value.load(ordering: .relaxed) }
}

/// A value handed from one thread to another.
final class Slot<Value: Sendable>: Sendable {
    private let value = Mutex<Value?>(nil)
    private let ready = Event()
    func set(_ newValue: Value) {
        value.locked { $0 = newValue }
        ready.fire()
    }
    func wait(seconds: Double) -> Value? {
        guard ready.wait(seconds: seconds) else { return nil }
        return value.locked { $0 }
    }
}

/// Polls `predicate` every 0.1 ms for at most `seconds`; returns whether it held.
func poll(seconds: Double, _ predicate: () -> Bool) -> Bool {
    let deadline = crlk_boottime_ns() + Int64(seconds * 1e9)
    while !predicate() {
        if crlk_boottime_ns() >= deadline { return predicate() }
        usleep(100)
    }
    return true
}

// MARK: - Descriptors

enum Descriptors {
    /// Lowers the soft descriptor limit (to at most 256) and opens `/dev/null` until the process
    /// has no descriptor left; returns the descriptors opened to fill it.
    static func exhaust() -> [Int32] {
        var limit = rlimit()
        getrlimit(__rlimit_resource_t(RLIMIT_NOFILE.rawValue), &limit)
        let wanted = rlim_t(max(64, test_count_open_fds() + 48))
        if limit.rlim_cur > wanted {
            limit.rlim_cur = wanted
            setrlimit(__rlimit_resource_t(RLIMIT_NOFILE.rawValue), &limit)
        }
        var fillers: [Int32] = []
        fillers.reserveCapacity(300)
        while true {
            let fd = open("/dev/null", O_RDONLY | O_CLOEXEC)
            if fd < 0 { break }
            fillers.append(fd)
        }
        let probe = eventfd(0, Int32(EFD_CLOEXEC))
        emit("descriptors exhausted: \(probe < 0 && errno == EMFILE)")
        if probe >= 0 { close(probe) }
        return fillers
    }

    static func release(_ fillers: [Int32]) {
        for fd in fillers { close(fd) }
    }

    /// Raises the soft descriptor limit to at least `count` (within the hard limit).
    static func raiseLimit(to count: Int) {
        var limit = rlimit()
        getrlimit(__rlimit_resource_t(RLIMIT_NOFILE.rawValue), &limit)
        if limit.rlim_cur < rlim_t(count) {
            limit.rlim_cur = min(limit.rlim_max, rlim_t(count))
            setrlimit(__rlimit_resource_t(RLIMIT_NOFILE.rawValue), &limit)
        }
    }
}

/// A pipe: (read end, write end), both close-on-exec.
func makePipe() -> (Int32, Int32) {
    var fds: [Int32] = [-1, -1]
    precondition(pipe(&fds) == 0, "pipe failed: errno \(errno)")
    for fd in fds { _ = fcntl(fd, F_SETFD, FD_CLOEXEC) }
    return (fds[0], fds[1])
}

func writeByte(_ fd: Int32) {
    var byte: UInt8 = 0x2A
    _ = write(fd, &byte, 1)
}

/// The wait status's parts (WIFEXITED / WEXITSTATUS / WTERMSIG are macros Swift does not import).
func describeWaitStatus(_ status: Int32) -> String {
    let signal = status & 0x7f
    return signal == 0 ? "exited \((status >> 8) & 0xff)" : "signalled \(signal)"
}

// MARK: - Scenarios

enum Scenarios {
    // MARK: Finding 2: fire dates far in the past

    /// A 10 ms repeating timer created with a fire date 10^10 s in the past: it fires at once,
    /// then every 10 ms; no arithmetic overflow.
    static func pastFireDateCreated() {
        let thread = ProbeThread(name: "hp-past-create") {
            let loop = RunLoop.current
            let passes = Counter()
            loop.add(RunLoopObserver(activities: .beforeTimers) { _, _ in passes.increment() }, forMode: .default)
            let fires = Counter()
            let firstFirePass = Atomic<Int>(-1)
            let start = crlk_boottime_ns()
            let firstFireMs = Mutex<Double>(-1)
            let beforeCreation = ContinuousClock.now
            let timer = RunLoopTimer(fireAt: .now - .seconds(1e10), interval: .milliseconds(10)) { _ in
                if fires.increment() == 1 {
                    firstFirePass.store(passes.count, ordering: .relaxed)
                    firstFireMs.locked { $0 = millisecondsSince(start) }
                }
            }
            // Reported as given (far in the past, saturated), as CoreFoundation reports it; the
            // firing is clamped to the creation.
            emit("fireDate reported in the past: \(timer.fireDate < beforeCreation - .seconds(1_000_000))")
            loop.add(timer, forMode: .default)
            loop.run(mode: .default, for: .milliseconds(105))
            emit("run returned after ms: \(millisecondsSince(start))")
            emit("fires in 105 ms: \(fires.count)")
            emit("first fire in pass: \(firstFirePass.load(ordering: .relaxed))")
            emit("first fire after ms: \(firstFireMs.locked { $0 })")
            timer.invalidate()
        }
        emit("loop thread finished: \(thread.join(seconds: 10))")
    }

    /// The same fire date set from another thread while the loop sleeps on a 10 ms repeating timer
    /// due in an hour: the loop wakes, fires it at once, then every 10 ms.
    static func pastFireDateSet() {
        let published = Slot<(RunLoop, RunLoopTimer)>()
        let setAt = Atomic<Int64>(0)
        let firesInWindow = Counter()
        let firstFireMs = Mutex<Double>(-1)
        let thread = ProbeThread(name: "hp-past-set") {
            let loop = RunLoop.current
            loop.add(RunLoopSource {}, forMode: .default)
            let timer = RunLoopTimer(fireAt: .now + .seconds(3600), interval: .milliseconds(10)) { timer in
                let set = setAt.load(ordering: .acquiring)
                guard set != 0 else { return }
                let sinceSet = crlk_boottime_ns() - set
                if sinceSet <= 105_000_000 {
                    if firesInWindow.increment() == 1 { firstFireMs.locked { $0 = Double(sinceSet) / 1e6 } }
                }
                if sinceSet >= 150_000_000 {
                    timer.invalidate()
                    RunLoop.current.stop()
                }
            }
            loop.add(timer, forMode: .default)
            published.set((loop, timer))
            let result = loop.run(mode: .default, for: .seconds(5))
            emit("run result: \(result)")
        }
        guard let (loop, timer) = published.wait(seconds: 10) else {
            emit("loop published: false")
            return
        }
        emit("loop asleep before the set: \(poll(seconds: 5) { loop.isWaiting })")
        let beforeSet = ContinuousClock.now
        setAt.store(crlk_boottime_ns(), ordering: .releasing)
        timer.fireDate = .now - .seconds(1e10)
        // Reported as given until it fires (CoreFoundation's _nextFireDate). It fires at once, on
        // the loop's thread, maybe before this read: then it reports its schedule's next point,
        // and its handler (which runs before the date moves) has counted the fire.
        let reported = timer.fireDate
        let firedAlready = firesInWindow.count > 0
        emit("fireDate reported in the past: \(reported < beforeSet - .seconds(1_000_000) || firedAlready)")
        emit("loop thread finished: \(thread.join(seconds: 6))")
        emit("fires within 105 ms of the set: \(firesInWindow.count)")
        emit("first fire after the set ms: \(firstFireMs.locked { $0 })")
    }

    /// Ends a thread running `while !stopped { run(mode:before:) }` and says whether it finished.
    /// A block, not stop() + wakeUp(): a stop() that lands between two runs of the `while` is
    /// dropped (as in CoreFoundation), and a wakeUp() then is ignored; the block runs inside the
    /// next run and ends it.
    static func stopKeepAlive(_ loop: RunLoop, _ stopped: borrowing Atomic<Bool>, _ thread: ProbeThread) {
        stopped.store(true, ordering: .releasing)
        loop.perform { RunLoop.current.stop() }
        emit("loop thread finished: \(thread.join(seconds: 3))")
    }

    // MARK: Finding 3: non-finite and huge dates

    /// `entry` (run-until, run-before, accept-input) called with `value` (nan, inf, -inf, 1e30).
    static func date(entry: String, value: String) {
        let interval: Double
        switch value {
        case "nan": interval = .nan
        case "inf": interval = .infinity
        case "-inf": interval = -.infinity
        case "1e30": interval = 1e30
        default:
            emit("unknown date \(value)")
            return
        }
        let farFuture = interval > 0  // NaN compares false: it counts as a past date
        let thread = ProbeThread(name: "hp-date") {
            let loop = RunLoop.current
            let entries = Counter()
            let sleeps = Counter()
            loop.add(
                RunLoopObserver(activities: [.entry, .beforeWaiting]) { _, activity in
                    if activity == .entry { entries.increment() } else { sleeps.increment() }
                }, forMode: .default)
            let fired = Event()
            // Timed from the timer's creation, which its 20 ms count from (under a sanitizer the
            // set-up below takes milliseconds).
            let start = crlk_boottime_ns()
            // A one-shot 20 ms timer: it ends a run without limit (stop(); for run(until:), the
            // mode becomes empty when it has fired) and must not fire in a one-pass run.
            loop.add(
                RunLoopTimer(after: .milliseconds(20)) { _ in
                    fired.fire()
                    RunLoop.current.stop()
                }, forMode: .default)
            // run(until:) repeats its runs until the date: with a date without limit it returns only
            // once the mode is empty, so it gets no keep-alive source then.
            if entry != "run-until" || !farFuture { loop.add(RunLoopSource {}, forMode: .default) }
            let date = Date(timeIntervalSinceReferenceDate: interval)
            emit("calling \(entry) with \(value)")
            switch entry {
            case "run-until": loop.run(until: date)
            case "run-before": emit("run(mode:before:) returned: \(loop.run(mode: .default, before: date))")
            case "accept-input": loop.acceptInput(mode: .default, before: date)
            default: emit("unknown entry \(entry)")
            }
            emit("returned after ms: \(millisecondsSince(start))")
            emit("timer fired: \(fired.isFired)")
            emit("runs entered: \(entries.count)")
            emit("sleeps: \(sleeps.count)")
        }
        emit("loop thread finished: \(thread.join(seconds: 10))")
    }

    // MARK: Finding 5: a loop made while the process is out of descriptors

    /// A thread's loop made with no descriptor free: a 20 ms timer and blocks still run, the
    /// keep-alive pattern does not spin, a waiting perform returns, and a descriptor source added
    /// once descriptors are free is watched.
    static func exhaustedLoop() {
        let fillers = Descriptors.exhaust()
        let published = Slot<RunLoop>()
        let stopped = Atomic<Bool>(false)
        let fires = Counter()
        let blocks = Counter()
        let returns = Counter()
        let thread = ProbeThread(name: "hp-exhausted") {
            let loop = RunLoop.current
            loop.add(
                RunLoopTimer(after: .milliseconds(20), repeating: .milliseconds(20)) { _ in fires.increment() },
                forMode: .default)
            for _ in 0..<10 { loop.perform { blocks.increment() } }
            published.set(loop)
            while !stopped.load(ordering: .acquiring) {
                loop.run(mode: .default, before: .distantFuture)
                returns.increment()
            }
        }
        guard let loop = published.wait(seconds: 10) else {
            emit("loop published: false")
            return
        }
        for _ in 0..<10 { loop.perform { blocks.increment() } }
        // A measurement window, not a wait for an event: how often the keep-alive pattern's runs
        // return (and the timer fires) in 300 ms of real time.
        let returnsBefore = returns.count
        let firesBefore = fires.count
        usleep(300_000)
        emit("run returns in 300 ms: \(returns.count - returnsBefore)")
        emit("timer fires in 300 ms: \(fires.count - firesBefore)")
        emit("blocks run: \(poll(seconds: 2) { blocks.count == 20 } ? 20 : blocks.count)")
        emit("still exhausted: \(eventfd(0, Int32(EFD_CLOEXEC)) < 0)")

        let waited = Event()
        let ranInside = Event()
        let performer = ProbeThread(name: "hp-performer") {
            do {
                try loop.perform(inModes: [.default], waitUntilDone: true) { ranInside.fire() }
            } catch {
                emit("perform waitUntilDone threw: \(error)")
            }
            waited.fire()
        }
        emit("perform waitUntilDone returned: \(waited.wait(seconds: 3))")
        emit("perform waitUntilDone block ran: \(ranInside.isFired)")
        _ = performer

        Descriptors.release(fillers)
        let (readEnd, writeEnd) = makePipe()
        let handled = Event()
        do {
            let source = try FileDescriptorSource(descriptor: readEnd) { source, _ in
                var byte: UInt8 = 0
                _ = read(source.descriptor, &byte, 1)
                handled.fire()
            }
            loop.add(source, forMode: .default)
            writeByte(writeEnd)
            emit("descriptor source handled after release: \(handled.wait(seconds: 3))")
            source.invalidate()
        } catch {
            emit("descriptor source failed: \(error)")
        }
        stopKeepAlive(loop, stopped, thread)
        close(readEnd)
        close(writeEnd)
    }

    /// 40 threads make their loops with no descriptor free; each gets a 20 ms repeating timer
    /// (3 fires wanted) and 10 blocks (5 from itself, 5 from the main thread), and stops its loop
    /// once all came. Descriptors stay exhausted throughout.
    static func exhaustedForty() {
        final class Progress: Sendable {
            let fires = Counter()
            let blocks = Counter()
            var done: Bool { fires.count >= 3 && blocks.count >= 10 }
        }
        let fillers = Descriptors.exhaust()
        let threadCount = 40
        let abort = Atomic<Bool>(false)
        let timersDone = Counter()
        let blocksRun = Counter()
        let finished = Counter()
        let loops = Mutex<[(RunLoop, Progress)]>([])
        var threads: [ProbeThread] = []
        for index in 0..<threadCount {
            threads.append(
                ProbeThread(name: "hp-ex40-\(index)") {
                    let loop = RunLoop.current
                    let progress = Progress()
                    loop.add(RunLoopSource {}, forMode: .default)
                    loop.add(
                        RunLoopTimer(after: .milliseconds(20), repeating: .milliseconds(20)) { timer in
                            if progress.fires.increment() == 3 {
                                timersDone.increment()
                                timer.invalidate()
                            }
                            if progress.done { RunLoop.current.stop() }
                        }, forMode: .default)
                    for _ in 0..<5 {
                        loop.perform {
                            blocksRun.increment()
                            progress.blocks.increment()
                            if progress.done { RunLoop.current.stop() }
                        }
                    }
                    loops.locked { $0.append((loop, progress)) }
                    while !progress.done && !abort.load(ordering: .acquiring) {
                        loop.run(mode: .default, before: .distantFuture)
                    }
                    finished.increment()
                })
        }
        let allPublished = poll(seconds: 10) { loops.locked { $0.count } == threadCount }
        emit("threads with a loop: \(loops.locked { $0.count })")
        for (loop, progress) in loops.locked({ $0 }) {
            for _ in 0..<5 {
                loop.perform {
                    blocksRun.increment()
                    progress.blocks.increment()
                    if progress.done { RunLoop.current.stop() }
                }
            }
        }
        let allDone = allPublished && poll(seconds: 6) { finished.count == threadCount }
        if !allDone {
            abort.store(true, ordering: .releasing)
            for (loop, _) in loops.locked({ $0 }) {
                loop.stop()
                loop.wakeUp()
            }
        }
        emit("all delivered within 6 s: \(allDone)")
        emit("timers that fired 3 times: \(timersDone.count)")
        emit("blocks run: \(blocksRun.count) of \(threadCount * 10)")
        let joined = threads.allSatisfy { $0.join(seconds: 5) }
        emit("threads finished: \(joined)")
        Descriptors.release(fillers)
    }

    // MARK: Finding 6: a descriptor source added while its mode's epoll set cannot be made

    static func exhaustedDescriptorSource() {
        let published = Slot<RunLoop>()
        let stopped = Atomic<Bool>(false)
        let thread = ProbeThread(name: "hp-exhaust-fd") {
            let loop = RunLoop.current
            loop.add(RunLoopSource {}, forMode: .default)
            published.set(loop)
            while !stopped.load(ordering: .acquiring) { loop.run(mode: .default, before: .distantFuture) }
        }
        guard let loop = published.wait(seconds: 10) else {
            emit("loop published: false")
            return
        }
        emit("loop asleep: \(poll(seconds: 5) { loop.isWaiting })")
        let (readEnd, writeEnd) = makePipe()
        let handled = Event()
        let source: FileDescriptorSource
        do {
            source = try FileDescriptorSource(descriptor: readEnd) { source, _ in
                var byte: UInt8 = 0
                _ = read(source.descriptor, &byte, 1)
                handled.fire()
            }
        } catch {
            emit("descriptor source failed: \(error)")
            return
        }
        let fillers = Descriptors.exhaust()
        loop.add(source, forMode: .default)
        emit("source in the mode: \(loop.contains(source, inMode: .default))")
        Descriptors.release(fillers)
        let start = crlk_boottime_ns()
        writeByte(writeEnd)
        let wasHandled = handled.wait(seconds: 5)
        emit("handled after release: \(wasHandled)")
        if wasHandled { emit("handled after ms: \(millisecondsSince(start))") }
        source.invalidate()
        stopKeepAlive(loop, stopped, thread)
        close(readEnd)
        close(writeEnd)
    }

    // MARK: Review: a loop without descriptors, inside one long run

    /// A loop made while out of descriptors, inside one long run (it sleeps on its futex): a 5 ms
    /// timer added from another thread fires on time (its sleep is cut short); once descriptors
    /// are freed, the loop opens its own during that same run and then sleeps in epoll, passing
    /// only when its 20 ms timer is due (it used to wait on a stale epoll number and spin).
    static func exhaustedLongRun() {
        let published = Slot<RunLoop>()
        let passes = Counter()
        let timerFired = Event()
        let fillers = Descriptors.exhaust()
        let thread = ProbeThread(name: "hp-exhaust-long") {
            let loop = RunLoop.current
            loop.add(RunLoopSource {}, forMode: .default)
            loop.add(RunLoopObserver(activities: .afterWaiting) { _, _ in passes.increment() }, forMode: .default)
            published.set(loop)
            loop.run(mode: .default, for: .seconds(3))
        }
        guard let loop = published.wait(seconds: 10) else {
            emit("loop published: false")
            return
        }
        emit("loop asleep: \(poll(seconds: 5) { loop.isWaiting })")
        let added = crlk_boottime_ns()
        loop.add(RunLoopTimer(after: .milliseconds(5)) { _ in timerFired.fire() }, forMode: .default)
        emit("timer fired: \(timerFired.wait(seconds: 2))")
        emit("timer fired after ms: \(Double(crlk_boottime_ns() - added) / 1e6)")
        Descriptors.release(fillers)
        loop.add(RunLoopTimer(after: .milliseconds(20), repeating: .milliseconds(20)) { _ in }, forMode: .default)
        // The loop notices free descriptors within its 100 ms retry; then 300 ms of a 20 ms timer.
        usleep(150_000)
        let before = passes.count
        usleep(300_000)
        emit("passes in 300 ms: \(passes.count - before)")
        loop.perform { RunLoop.current.stop() }
        emit("loop thread finished: \(thread.join(seconds: 5))")
    }

    // MARK: Finding 7: /dev/null and /dev/zero with ownsDescriptor

    static func devNullAndZero() {
        let before = test_count_open_fds()
        var rejected: [String: Int] = ["/dev/null": 0, "/dev/zero": 0]
        var otherErrors: [String] = []
        var callerCloses = 0
        for _ in 0..<100 {
            for path in ["/dev/null", "/dev/zero"] {
                let fd = open(path, O_RDONLY | O_CLOEXEC)
                do {
                    let source = try FileDescriptorSource(descriptor: fd, ownsDescriptor: true) { _, _ in }
                    _ = source
                } catch Errno.notPermitted {
                    rejected[path, default: 0] += 1
                } catch {
                    otherErrors.append("\(error)")
                }
                if close(fd) == 0 { callerCloses += 1 }
            }
        }
        let after = test_count_open_fds()
        emit("/dev/null rejected with notPermitted: \(rejected["/dev/null"]!) of 100")
        emit("/dev/zero rejected with notPermitted: \(rejected["/dev/zero"]!) of 100")
        emit("other errors: \(otherErrors.count)")
        emit("caller's close succeeded: \(callerCloses) of 200")
        emit("descriptors leaked: \(after - before)")
    }

    // MARK: Findings 8, 9: re-entering the dying loop from a cancel callback at thread exit

    /// onCancel, run by the thread-exit teardown, performs a block on its own loop and waits.
    static func teardownPerformWait() {
        let thread = ProbeThread(name: "hp-teardown-pw") {
            let loop = RunLoop.current
            let source = RunLoopSource(
                onCancel: { cancelled, _ in
                    guard cancelled === loop else { return }
                    let ran = Event()
                    emit("onCancel: perform waitUntilDone on the dying loop")
                    do throws(RunLoop.PerformError) {
                        try cancelled.perform(inModes: [.default], waitUntilDone: true) { ran.fire() }
                        emit("perform returned; block ran: \(ran.isFired)")
                    } catch {
                        emit("perform threw: \(error == .threadExited ? "threadExited" : "\(error)")")
                    }
                }, perform: {})
            loop.add(source, forMode: .default)
            loop.run(mode: .default, for: .milliseconds(1))
        }
        emit("thread joined: \(thread.join(seconds: 5))")
    }

    /// onCancel, run by the thread-exit teardown, uses a LoopBound of the dying loop.
    static func teardownLoopBound() {
        let thread = ProbeThread(name: "hp-teardown-lb") {
            let loop = RunLoop.current
            let bound = LoopBound(0, on: loop)
            let source = RunLoopSource(
                onCancel: { _, _ in
                    emit("onCancel: touching a LoopBound of the dying loop")
                    bound.value += 1
                    emit("LoopBound value in onCancel: \(bound.value)")
                    emit("LoopBound accessible in onCancel: \(bound.isAccessible)")
                }, perform: {})
            loop.add(source, forMode: .default)
            loop.run(mode: .default, for: .milliseconds(1))
        }
        emit("thread joined: \(thread.join(seconds: 5))")
    }

    /// onCancel, run by the thread-exit teardown, asks for RunLoop.current.
    static func teardownCurrent() {
        let before = test_count_open_fds()
        let thread = ProbeThread(name: "hp-teardown-cur") {
            let loop = RunLoop.current
            let source = RunLoopSource(
                onCancel: { cancelled, _ in
                    let fdsBefore = test_count_open_fds()
                    let current = RunLoop.current
                    let fdsAfter = test_count_open_fds()
                    emit("current in onCancel is the dying loop: \(current === cancelled && cancelled === loop)")
                    emit("current.isCurrent in onCancel: \(current.isCurrent)")
                    emit("descriptors opened by RunLoop.current in onCancel: \(fdsAfter - fdsBefore)")
                }, perform: {})
            loop.add(source, forMode: .default)
            loop.run(mode: .default, for: .milliseconds(1))
        }
        emit("thread joined: \(thread.join(seconds: 5))")
        emit("descriptors left after the thread exited: \(test_count_open_fds() - before)")
    }

    /// A thread exits while its descriptor sources' handlers hold (through a table) the sources
    /// themselves, and a port's handler holds the port: the teardown invalidates them, so the
    /// owned descriptors are closed although the cycles keep the objects alive.
    static func threadExitHandlerCycle() {
        final class Table: Sendable {
            let items = Mutex<[AnyObject & Sendable]>([])
        }
        let table = Table()
        let before = test_count_open_fds()
        let thread = ProbeThread(name: "hp-exit-cycle") {
            let loop = RunLoop.current
            for _ in 0..<10 {
                var ends: [Int32] = [0, 0]
                pipe(&ends)
                let reader = try! FileDescriptorSource(descriptor: ends[0], ownsDescriptor: true) { source, _ in
                    table.items.locked { _ = $0.contains { $0 === source } }
                }
                let writer = try! FileDescriptorSource(descriptor: ends[1], watching: [], ownsDescriptor: true) {
                    source, _ in table.items.locked { _ = $0.contains { $0 === source } }
                }
                table.items.locked { $0 += [reader, writer] }
                loop.add(reader, forMode: .default)
                loop.add(writer, forMode: .common)
            }
            let port = MessagePort<Int> { _ in table.items.locked { _ = $0.count } }
            table.items.locked { $0.append(port) }
            loop.add(port, forMode: .default)
            emit("descriptors opened on the thread: \(test_count_open_fds() - before)")
            loop.run(mode: .default, for: .milliseconds(1))
        }
        emit("thread joined: \(thread.join(seconds: 5))")
        emit("descriptors left after the thread exited: \(test_count_open_fds() - before)")
        let invalid = table.items.locked { items in
            items.filter { item in
                if let source = item as? FileDescriptorSource { return !source.isValid }
                if let port = item as? MessagePort<Int> { return !port.isValid }
                return false
            }.count
        }
        emit("items invalidated by the thread's exit: \(invalid) of 21")
    }

    // MARK: Finding 10: fork

    /// The parent and its forked child each run a 50 ms repeating timer for 1.5 s at the same time,
    /// each on its own loop; the child's RunLoop.current is a new loop.
    static func fork() {
        // A parent or child whose loop shares kernel objects with the other process can sleep
        // forever (each steals the other's timer expirations): both end by alarm, well before the
        // test's own timeout.
        alarm(15)
        let preFork = RunLoop.current
        let parentFires = Counter()
        // The parent's timer, and a pass on its loop, so that its kernel descriptors are in use.
        let parentTimer = RunLoopTimer(after: .milliseconds(50), repeating: .milliseconds(50)) { _ in
            parentFires.increment()
        }
        preFork.add(parentTimer, forMode: .default)
        preFork.run(mode: .default, for: .zero)
        let pid = Glibc.fork()
        if pid < 0 {
            emit("fork failed: errno \(errno)")
            return
        }
        if pid == 0 {
            alarm(10)
            let current = RunLoop.current
            emit("child: current is the pre-fork loop: \(current === preFork)")
            let childFires = Counter()
            let timer = RunLoopTimer(after: .milliseconds(50), repeating: .milliseconds(50)) { _ in
                childFires.increment()
            }
            current.add(timer, forMode: .default)
            let start = crlk_boottime_ns()
            let result = current.run(mode: .default, for: .milliseconds(1500))
            emit("child: run result: \(result)")
            emit("child: run returned after ms: \(millisecondsSince(start))")
            emit("child: timer fires: \(childFires.count)")
            _exit(0)
        }
        let firesBefore = parentFires.count
        let start = crlk_boottime_ns()
        let result = preFork.run(mode: .default, for: .milliseconds(1500))
        emit("parent: run result: \(result)")
        emit("parent: run returned after ms: \(millisecondsSince(start))")
        emit("parent: timer fires: \(parentFires.count - firesBefore)")
        parentTimer.invalidate()
        emit("parent: child status: \(waitForChild(pid, seconds: 10))")
    }

    /// A loop object made before fork() used in the child: the child is stopped with a message
    /// naming fork.
    static func forkStale() {
        alarm(15)
        let preFork = RunLoop.current
        preFork.add(RunLoopTimer(after: .seconds(3600), repeating: .seconds(3600)) { _ in }, forMode: .default)
        preFork.run(mode: .default, for: .zero)
        let pid = Glibc.fork()
        if pid < 0 {
            emit("fork failed: errno \(errno)")
            return
        }
        if pid == 0 {
            alarm(10)
            emit("child: running the pre-fork loop")
            let result = preFork.run(mode: .default, for: .milliseconds(200))
            emit("child: pre-fork loop's run returned: \(result)")
            _exit(0)
        }
        emit("parent: child status: \(waitForChild(pid, seconds: 10))")
    }

    /// Waits (bounded) for a child; kills it when the time is up.
    static func waitForChild(_ pid: pid_t, seconds: Double) -> String {
        var status: Int32 = 0
        let deadline = crlk_boottime_ns() + Int64(seconds * 1e9)
        while true {
            let done = waitpid(pid, &status, WNOHANG)
            if done == pid { return describeWaitStatus(status) }
            if done < 0 && errno != EINTR { return "waitpid failed: errno \(errno)" }
            if crlk_boottime_ns() >= deadline {
                kill(pid, SIGKILL)
                _ = waitpid(pid, &status, 0)
                return "timed out (killed)"
            }
            usleep(1000)
        }
    }

    // MARK: Lower: invalidating many descriptor sources

    static func invalidateManyDescriptorSources(count: Int) {
        Descriptors.raiseLimit(to: count + 256)
        let outcome = Slot<String>()
        let thread = ProbeThread(name: "hp-inval-10k") {
            let loop = RunLoop.current
            var sources: [FileDescriptorSource] = []
            sources.reserveCapacity(count)
            for _ in 0..<count {
                let fd = eventfd(0, Int32(EFD_CLOEXEC | EFD_NONBLOCK))
                guard fd >= 0 else { break }
                guard let source = try? FileDescriptorSource(descriptor: fd, ownsDescriptor: true, handler: { _, _ in })
                else { break }
                sources.append(source)
            }
            emit("sources made: \(sources.count)")
            let addStart = crlk_boottime_ns()
            for source in sources { loop.add(source, forMode: .default) }
            emit("added in ms: \(millisecondsSince(addStart))")
            // Bounded: a quadratic invalidation gives up after 10 s and says how far it got.
            let start = crlk_boottime_ns()
            var invalidated = 0
            for source in sources {
                source.invalidate()
                invalidated += 1
                if invalidated % 256 == 0 && crlk_boottime_ns() - start > 10_000_000_000 { break }
            }
            outcome.set("invalidated \(invalidated) in ms: \(millisecondsSince(start))")
            for source in sources { source.invalidate() }
        }
        if let line = outcome.wait(seconds: 60) { emit(line) }
        emit("loop thread finished: \(thread.join(seconds: 30))")
    }
}

// MARK: - Main

// A probe that hangs anyway ends with SIGALRM (the test kills it after its own timeout too).
alarm(45)
let arguments = Array(CommandLine.arguments.dropFirst())
switch arguments.first {
case "past-fire-date-created": Scenarios.pastFireDateCreated()
case "past-fire-date-set": Scenarios.pastFireDateSet()
case "date" where arguments.count == 3: Scenarios.date(entry: arguments[1], value: arguments[2])
case "exhausted-loop": Scenarios.exhaustedLoop()
case "exhausted-40": Scenarios.exhaustedForty()
case "exhausted-fd-source": Scenarios.exhaustedDescriptorSource()
case "exhausted-long-run": Scenarios.exhaustedLongRun()
case "dev-null": Scenarios.devNullAndZero()
case "teardown-perform-wait": Scenarios.teardownPerformWait()
case "teardown-loop-bound": Scenarios.teardownLoopBound()
case "teardown-current": Scenarios.teardownCurrent()
case "thread-exit-cycle": Scenarios.threadExitHandlerCycle()
case "fork": Scenarios.fork()
case "fork-stale": Scenarios.forkStale()
case "invalidate-descriptor-sources": Scenarios.invalidateManyDescriptorSources(count: 10_000)
default:
    emit("usage: HostileProbe <scenario> (see Tests/HostileProbe/main.swift)")
    exit(2)
}
emit("done")
exit(0)
