// gtk-bench MODE: a GTK 4 window under Xvfb (a display of its own), its main thread run one way:
//
//   bridge    RunLoop.main drives GTK through RunLoopGLib's GLibBridge (and serves the main queue)
//   tickler   g_main_loop_run, the main queue drained by a 50 ms g_timeout (swift-cross-ui's
//             "main run loop tickler", PR #141)
//   glibloop  g_main_loop_run, the main queue served by a GSource on its eventfd
//             (_dispatch_get_main_queue_handle_4CF / _dispatch_main_queue_callback_4CF)
//   loopalone RunLoop.main without the bridge (GTK not driven): RunLoopKit's own figure
//
// It measures (1) the latency of DispatchQueue.main.async blocks posted by a worker thread, one
// at a time, 1 to 60 ms apart (random: no phase lock with the tickler's 50 ms), p50 and p99; and
// (2) the main thread's wakeups per second with the window presented and idle: its voluntary
// context switches (each sleep that ended) over 2 s, from /proc/thread-self/status. It prints
// `key=value` lines for the `gtk` workload of runloop-bench.

#if GTK
import CBenchGtk
import Dispatch
import Foundation
import Glibc
import RunLoopGLib
import RunLoopKit
import Synchronization

import class RunLoopKit.RunLoop

func fail(_ why: String) -> Never {
    print("error=\(why)")
    exit(1)
}

let mode = CommandLine.arguments.dropFirst().first ?? ""
guard ["bridge", "tickler", "glibloop", "loopalone"].contains(mode) else {
    fail("usage: gtk-bench bridge|tickler|glibloop|loopalone")
}
alarm(120)

// MARK: Xvfb (-displayfd picks a free display; -terminate ends it with its last client)

var ends: [Int32] = [0, 0]
guard pipe(&ends) == 0 else { fail("pipe") }
var actions = posix_spawn_file_actions_t()
posix_spawn_file_actions_init(&actions)
posix_spawn_file_actions_adddup2(&actions, ends[1], 3)
posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0)
posix_spawn_file_actions_addopen(&actions, 2, "/dev/null", O_WRONLY, 0)
let xvfbArguments = ["Xvfb", "-displayfd", "3", "-screen", "0", "640x480x24", "-nolisten", "tcp", "-terminate"]
let argv: [UnsafeMutablePointer<CChar>?] = xvfbArguments.map { strdup($0) } + [nil]
var spawned: pid_t = 0
guard posix_spawnp(&spawned, "Xvfb", &actions, nil, argv, environ) == 0 else { fail("cannot start Xvfb (apt-get install xvfb)") }
let xvfb = spawned
close(ends[1])
var displayNumber = ""
var byte: UInt8 = 0
var poller = pollfd(fd: ends[0], events: Int16(POLLIN), revents: 0)
while !displayNumber.hasSuffix("\n") {
    guard poll(&poller, 1, 20_000) > 0, read(ends[0], &byte, 1) == 1 else {
        kill(xvfb, SIGKILL)
        fail("Xvfb did not start")
    }
    displayNumber.append(Character(UnicodeScalar(byte)))
}
func stopXvfb(_ pid: pid_t) {
    kill(pid, SIGTERM)
    var status: Int32 = 0
    waitpid(pid, &status, 0)
}
setenv("DISPLAY", ":" + displayNumber.trimmingCharacters(in: .whitespacesAndNewlines), 1)
setenv("GDK_BACKEND", "x11", 1)
setenv("GSK_RENDERER", "cairo", 1)
setenv("NO_AT_BRIDGE", "1", 1)
setenv("GTK_A11Y", "none", 1)
guard gtk_init_check() != 0 else {
    stopXvfb(xvfb)
    fail("gtk_init_check failed")
}

// MARK: The window and the main thread's loop

let window = gtk_window_new()!
gtk_window_set_title(cbg_window(window), "gtk-bench")
gtk_window_set_default_size(cbg_window(window), 320, 200)
gtk_window_set_child(cbg_window(window), gtk_label_new("gtk-bench: an idle window"))
gtk_window_present(cbg_window(window))

/// GLib's main loop object. `@unchecked Sendable`: `g_main_loop_quit` may be called from any
/// thread (GLib documents GMainLoop as thread-safe), and the worker only asks the main queue to
/// call it on the main thread anyway.
struct GLibLoop: @unchecked Sendable {
    let loop: OpaquePointer
}
let glibLoop = GLibLoop(loop: g_main_loop_new(nil, 0)!)
/// Runs the main thread's loop for `seconds` (or until `stopLoop`).
func runLoop(seconds: Double, _ glibLoop: GLibLoop) {
    switch mode {
    case "bridge", "loopalone":
        RunLoop.main.run(mode: .default, for: .seconds(seconds))
    default:
        let timeout = g_timeout_add(UInt32(seconds * 1000), { loop in
            g_main_loop_quit(OpaquePointer(loop))
            return 0
        }, UnsafeMutableRawPointer(glibLoop.loop))
        g_main_loop_run(glibLoop.loop)
        _ = timeout
    }
}
@Sendable func stopLoop(_ glibLoop: GLibLoop) {
    if mode == "bridge" || mode == "loopalone" { RunLoop.main.stop() } else { g_main_loop_quit(glibLoop.loop) }
}

var bridge: GLibBridge?
switch mode {
case "bridge":
    do { bridge = try GLibBridge.attach(to: .main) } catch { fail("GLibBridge.attach: \(error)") }
case "loopalone":
    // RunLoop.main with no bridge: GTK is not driven (the window is never drawn); the main
    // queue's latency on RunLoopKit alone, for comparison.
    break
case "tickler":
    // swift-cross-ui's tickler: every 50 ms the main queue gets a chance to drain.
    g_timeout_add(50, { _ in
        _dispatch_main_queue_callback_4CF(nil)
        return 1
    }, nil)
default:
    // A GSource on the main queue's eventfd, as GTK 4's macOS backend serves the main queue.
    let handle = _dispatch_get_main_queue_handle_4CF()
    let source = g_unix_fd_source_new(handle, G_IO_IN)!
    let callback: @convention(c) (Int32, GIOCondition, gpointer?) -> gboolean = { fd, _, _ in
        var value: UInt64 = 0
        _ = read(fd, &value, 8)
        _dispatch_main_queue_callback_4CF(nil)
        return 1
    }
    g_source_set_callback(source, unsafeBitCast(callback, to: GSourceFunc.self), nil, nil)
    g_source_attach(source, nil)
}

// Settle: the window mapped and drawn.
runLoop(seconds: 0.5, glibLoop)

@Sendable func now() -> UInt64 {
    var time = timespec()
    clock_gettime(CLOCK_MONOTONIC, &time)
    return UInt64(time.tv_sec) * 1_000_000_000 + UInt64(time.tv_nsec)
}

// MARK: (1) main-queue latency

// 1 to 60 ms apart, at random: the posts land at any phase of the tickler's 50 ms period (a
// worker that posts right after each block ran would be clocked by it).
let samples = 100
let latencies = Mutex<[Double]>([])
let worker = Thread {
    var generator = SystemRandomNumberGenerator()
    for _ in 0..<samples {
        usleep(UInt32.random(in: 1_000...60_000, using: &generator))
        let ran = DispatchSemaphore(value: 0)
        let sent = now()
        DispatchQueue.main.async {
            let latency = Double(now() - sent) / 1000
            latencies.withLock { $0.append(latency) }
            ran.signal()
        }
        ran.wait()
    }
    DispatchQueue.main.async { stopLoop(glibLoop) }
}
worker.start()
runLoop(seconds: 60, glibLoop)
let sorted = latencies.withLock { $0 }.sorted()
guard sorted.count == samples else { fail("only \(sorted.count) of \(samples) blocks ran") }
print("latency_p50_us=\(sorted[sorted.count / 2])")
print("latency_p99_us=\(sorted[min(sorted.count - 1, Int(Double(sorted.count) * 0.99))])")

// MARK: (2) idle wakeups

func voluntarySwitches() -> Int {
    let status = (try? String(contentsOfFile: "/proc/thread-self/status", encoding: .utf8)) ?? ""
    let line = status.split(separator: "\n").first { $0.hasPrefix("voluntary_ctxt_switches") }
    return Int(line?.split(separator: "\t").last?.trimmingCharacters(in: .whitespaces) ?? "") ?? -1
}
runLoop(seconds: 0.5, glibLoop)
let before = voluntarySwitches()
let idleStart = now()
runLoop(seconds: 2, glibLoop)
let idleSeconds = Double(now() - idleStart) / 1e9
print("idle_wakeups_per_s=\(Double(voluntarySwitches() - before) / idleSeconds)")

bridge?.invalidate()
gtk_window_destroy(cbg_window(window))
stopXvfb(xvfb)
#else
print("skip=gtk-bench was built without the trait GTK (swift build --package-path Benchmarks --traits GTK)")
#endif
