// GLibProbe: GLib scenarios on a process's main thread, run by Tests/RunLoopGLibTests.
//
// RunLoop.main drives GLib's global default context (GTK's), as a GLib application's `main`
// does; a test never owns the main thread (Swift Testing runs tests on worker threads), the
// default context is the process's one (g_idle_add and g_timeout_add name it), and a stall
// monitor or fork() is best kept to a process of its own. So the tests launch this program:
//
//     GLibProbe wakeup      a worker's g_idle_add and g_main_context_invoke end RunLoop.main's run
//     GLibProbe mainqueue   DispatchQueue.main and the main actor while the bridge drives GLib
//     GLibProbe stall       a GLib callback that blocks 300 ms, as the stall monitor reports it
//     GLibProbe fork        attach in a child of fork()
//     GLibProbe lifecycle   attach and invalidate many times: no descriptor left behind
//
// It prints `key=value` lines and exits 0; every run is bounded (a few seconds at most).

#if GLib
import CGLib
import Dispatch
import Glibc
import RunLoopGLib
import RunLoopKit
import RunLoopMonitor
import Synchronization

/// Prints `key=value` at once (the test reads standard output after the exit).
func report(_ key: String, _ value: Any) {
    print("\(key)=\(value)")
    fflush(nil)
}

func nowNs() -> Int64 { RunLoop.clockNanoseconds }

/// A counter or time stamp that closures sent to other threads and queues share.
final class Shared: Sendable {
    private let value = Atomic<Int64>(0)
    init() {}
    func set(_ newValue: Int64) { value.store(newValue, ordering: .relaxed) }
    @discardableResult
    func increment() -> Int64 { value.add(1, ordering: .relaxed).newValue }
    var get: Int64 { value.load(ordering: .relaxed) }
}

/// A closure as a GLib callback (retained by the source, released by its destroy notify).
final class Callback: Sendable {
    let body: @Sendable () -> Bool
    init(_ body: @escaping @Sendable () -> Bool) { self.body = body }
}

enum Callbacks {
    static let call: GSourceFunc = { data in Unmanaged<Callback>.fromOpaque(data!).takeUnretainedValue().body() ? 1 : 0 }
    static let release: GDestroyNotify = { data in Unmanaged<Callback>.fromOpaque(data!).release() }
}

func box(_ body: @escaping @Sendable () -> Bool) -> UnsafeMutableRawPointer {
    Unmanaged.passRetained(Callback(body)).toOpaque()
}

@discardableResult
func addTimeout(_ milliseconds: UInt32, name: String? = nil, _ body: @escaping @Sendable () -> Bool) -> UInt32 {
    let source = g_timeout_source_new(milliseconds)!
    g_source_set_callback(source, Callbacks.call, box(body), Callbacks.release)
    if let name { g_source_set_name(source, name) }
    let id = g_source_attach(source, nil)
    g_source_unref(source)
    return id
}

@discardableResult
func addIdle(priority: Int32, _ body: @escaping @Sendable () -> Bool) -> UInt32 {
    g_idle_add_full(priority, Callbacks.call, box(body), Callbacks.release)
}

func attachMain() -> GLibBridge {
    do {
        return try GLibBridge.attach(to: .main)
    } catch {
        report("error", "attach: \(error)")
        exit(1)
    }
}

/// A worker thread (a pthread: no Foundation).
func onWorker(after milliseconds: Int, _ body: @escaping @Sendable () -> Void) {
    final class Work: Sendable {
        let body: @Sendable () -> Void
        let delay: Int
        init(_ body: @escaping @Sendable () -> Void, _ delay: Int) {
            self.body = body
            self.delay = delay
        }
    }
    var thread = pthread_t()
    let work = Unmanaged.passRetained(Work(body, milliseconds)).toOpaque()
    pthread_create(
        &thread, nil,
        { raw in
            let work = Unmanaged<Work>.fromOpaque(raw!).takeRetainedValue()
            usleep(useconds_t(work.delay * 1000))
            work.body()
            return nil
        }, work)
    pthread_detach(thread)
}

// MARK: - Scenarios

/// A worker's g_idle_add (GLib's default context) and g_main_context_invoke end RunLoop.main's
/// 5 s run, with nothing else pending; the invoked function runs on the main thread.
func wakeup() {
    let bridge = attachMain()
    let sent = Atomic<Int64>(0)
    let ran = Atomic<Int64>(0)
    onWorker(after: 100) {
        sent.store(nowNs(), ordering: .relaxed)
        addIdle(priority: G_PRIORITY_DEFAULT) {
            ran.store(nowNs(), ordering: .relaxed)
            RunLoop.main.stop()
            return false
        }
    }
    report("idle_run", RunLoop.main.run(mode: .default, for: .seconds(5)))
    report("idle_us", (ran.load(ordering: .relaxed) - sent.load(ordering: .relaxed)) / 1000)
    let onMain = Atomic<Bool>(false)
    onWorker(after: 100) {
        sent.store(nowNs(), ordering: .relaxed)
        g_main_context_invoke_full(
            nil, G_PRIORITY_DEFAULT, Callbacks.call,
            box {
                ran.store(nowNs(), ordering: .relaxed)
                onMain.store(getpid() == crlg_gettid(), ordering: .relaxed)
                RunLoop.main.stop()
                return false
            }, Callbacks.release)
    }
    report("invoke_run", RunLoop.main.run(mode: .default, for: .seconds(5)))
    report("invoke_us", (ran.load(ordering: .relaxed) - sent.load(ordering: .relaxed)) / 1000)
    report("invoke_on_main", onMain.load(ordering: .relaxed))
    bridge.invalidate()
}

/// DispatchQueue.main.async and Task { @MainActor } from a worker run within a few milliseconds
/// while the bridge drives GLib (a 16 ms GLib timeout ticking), and a 100-step self-re-enqueuing
/// main-queue chain completes within the same run; then, beside a HIGH GLib idle that never
/// finishes, the main queue and a loop timer keep running.
func mainQueue() {
    let bridge = attachMain()
    let ticks = Shared()
    addTimeout(16) {
        ticks.increment()
        return true
    }
    let asyncSent = Shared()
    let asyncRan = Shared()
    let actorSent = Shared()
    let actorRan = Shared()
    let chainSteps = Shared()
    let chainStart = Shared()
    let chainEnd = Shared()
    onWorker(after: 100) {
        asyncSent.set(nowNs())
        DispatchQueue.main.async { asyncRan.set(nowNs()) }
    }
    onWorker(after: 200) {
        actorSent.set(nowNs())
        Task { @MainActor in actorRan.set(nowNs()) }
    }
    @Sendable func step() {
        if chainSteps.increment() == 100 {
            chainEnd.set(nowNs())
            RunLoop.main.stop()
        } else {
            DispatchQueue.main.async { step() }
        }
    }
    onWorker(after: 300) {
        chainStart.set(nowNs())
        DispatchQueue.main.async { step() }
    }
    report("run", RunLoop.main.run(mode: .default, for: .seconds(5)))
    report("async_us", (asyncRan.get - asyncSent.get) / 1000)
    report("actor_us", (actorRan.get - actorSent.get) / 1000)
    report("chain_steps", chainSteps.get)
    report("chain_us", (chainEnd.get - chainStart.get) / 1000)
    report("glib_ticks", ticks.get)

    // A HIGH idle that always continues: GLib's lower priorities starve (GLib's rule), the loop's
    // timer and the main queue do not.
    let high = Shared()
    let low = Shared()
    let highID = addIdle(priority: G_PRIORITY_HIGH) {
        high.increment()
        return true
    }
    let lowID = addIdle(priority: G_PRIORITY_DEFAULT_IDLE) {
        low.increment()
        return true
    }
    let timerFires = Shared()
    let timer = RunLoopTimer(after: .milliseconds(20), repeating: .milliseconds(20)) { _ in timerFires.increment() }
    RunLoop.main.add(timer, forMode: .default)
    let queued = Shared()
    @Sendable func again() {
        queued.increment()
        DispatchQueue.main.async { again() }
    }
    DispatchQueue.main.async { again() }
    RunLoop.main.run(mode: .default, for: .milliseconds(300))
    g_source_remove(highID)
    g_source_remove(lowID)
    timer.invalidate()
    report("starve_high", high.get)
    report("starve_low", low.get)
    report("starve_timer", timerFires.get)
    report("starve_queue", queued.get)
    bridge.invalidate()
}

/// The GLib callback that blocks: what a stall report must name.
@inline(never)
func glibProbeBlockingCallback(_ data: gpointer?) -> gboolean {
    let deadline = nowNs() + 300_000_000
    while nowNs() < deadline {
        var request = timespec(tv_sec: 0, tv_nsec: 10_000_000)
        nanosleep(&request, nil)
    }
    return 0
}

/// A GLib callback that blocks 300 ms, reported by a StallMonitor watching RunLoop.main: its
/// function, and as the item the GLib source's name.
func stall() {
    let bridge = attachMain()
    let monitor = StallMonitor(loop: .main, threshold: .milliseconds(100), sampleInterval: .milliseconds(20))
    let reports = Mutex<[StallReport]>([])
    monitor.start { event in
        if case .ended(let report) = event {
            reports.locked { $0.append(report) }
            RunLoop.main.perform { RunLoop.main.stop() }
            RunLoop.main.wakeUp()
        }
    }
    let source = g_timeout_source_new(50)!
    g_source_set_callback(source, glibProbeBlockingCallback, nil, nil)
    g_source_set_name(source, "rlk-probe blocking timeout")
    g_source_attach(source, nil)
    g_source_unref(source)
    report("run", RunLoop.main.run(mode: .default, for: .seconds(10)))
    monitor.stop()
    for stall in reports.locked({ $0 }) {
        report("item", stall.item)
        report("phase", stall.phase)
        report("stuck_in", stall.stuckIn ?? "?")
        report("duration_ms", Int(stall.duration.components.seconds * 1000 + stall.duration.components.attoseconds / 1_000_000_000_000_000))
    }
    bridge.invalidate()
}

/// Attach in a child of fork() is refused; the parent's bridge, invalidated in the child, does
/// nothing there; the parent's bridge goes on driving GLib.
func forkScenario() {
    let bridge = attachMain()
    let child = fork()
    if child == 0 {
        var outcome = "attached"
        do {
            let other = try GLibBridge.attach(to: .current)
            other.invalidate()
        } catch {
            outcome = error == .forkedChild ? "forkedChild" : "\(error)"
        }
        bridge.invalidate()
        let line = "child_attach=\(outcome)\nchild_invalidate=ok\n"
        _ = line.withCString { write(1, $0, strlen($0)) }
        _exit(0)
    }
    var status: Int32 = 0
    waitpid(child, &status, 0)
    report("child_status", status)
    let fired = Atomic<Bool>(false)
    addTimeout(10) {
        fired.store(true, ordering: .relaxed)
        RunLoop.main.stop()
        return false
    }
    RunLoop.main.run(mode: .default, for: .seconds(5))
    report("parent_fired", fired.load(ordering: .relaxed))
    report("parent_attached", bridge.isAttached)
    bridge.invalidate()
}

/// The process's open descriptors.
func openDescriptors() -> Int {
    guard let directory = opendir("/proc/self/fd") else { return -1 }
    defer { closedir(directory) }
    var count = 0
    while readdir(directory) != nil { count += 1 }
    return count
}

/// Attach and invalidate 50 times (each bridge drives a timeout first): the descriptors are the
/// same after as after the first cycle (which makes the main loop's own epoll set for its mode).
func lifecycle() {
    func cycle() {
        let bridge = attachMain()
        addTimeout(1) {
            RunLoop.main.stop()
            return false
        }
        RunLoop.main.run(mode: .default, for: .seconds(5))
        bridge.invalidate()
    }
    cycle()
    let before = openDescriptors()
    for _ in 0..<50 { cycle() }
    report("fds_before", before)
    report("fds_after", openDescriptors())
    report("owner_after", g_main_context_is_owner(g_main_context_default()) != 0)
}

let scenario = CommandLine.arguments.dropFirst().first ?? ""
switch scenario {
case "wakeup": wakeup()
case "mainqueue": mainQueue()
case "stall": stall()
case "fork": forkScenario()
case "lifecycle": lifecycle()
default:
    report("error", "unknown scenario '\(scenario)' (wakeup, mainqueue, stall, fork, lifecycle)")
    exit(2)
}
report("done", true)
#else
print("GLibProbe needs the package trait GLib")
#endif
