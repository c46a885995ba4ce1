// GTKProbe: one GTK 4 scenario on this process's main thread, on an Xvfb display of its own.
//
// Test support for Tests/RunLoopGTKTests (the GTK tests, 10 and 13 to 15 of the GLib bridge's
// notes). GTK is initialised once per process and on its main thread, and a test never has the
// main thread, so each test launches this program:
//
//     GTKProbe mainqueue [--executor]   DispatchQueue.main and the main actor with GTK up
//                                       (--executor: RunLoopConcurrency.installMainExecutor())
//     GTKProbe frameclock               tick-callback frames, a queued draw, passes when idle
//     GTKProbe drag DIR                 the xdotool drag of the scroll bar (screenshots into DIR)
//     GTKProbe nested                   pointer motion delivered while the loop runs nested
//
// It starts Xvfb (-displayfd picks a free display; killed by its pid at the end, and -terminate
// ends it if this process dies first), starts GTK on it, attaches GLibBridge to RunLoop.main,
// prints `key=value` lines and `done=true`, and exits 0. Without Xvfb or xdotool it prints
// `skip=<why>` and exits 0; a failure prints `error=<why>` and exits 1. alarm() bounds it.

#if GTK
import CGtk
import Dispatch
import Foundation
import GTKScrollDemo
import Glibc
import RunLoopConcurrency
import RunLoopGLib
import RunLoopKit
import Synchronization

import class RunLoopKit.RunLoop

func report(_ key: String, _ value: Any) {
    print("\(key)=\(value)")
    fflush(nil)
}

/// The Xvfb of this run, killed by `fail` and at the end.
let xvfb = Mutex<VirtualDisplay?>(nil)

func fail(_ why: String) -> Never {
    report("error", why)
    xvfb.locked { $0 }?.stop()
    exit(1)
}

let arguments = Array(CommandLine.arguments.dropFirst())
let scenario = arguments.first ?? ""
if arguments.contains("--executor") { RunLoopConcurrency.installMainExecutor() }
alarm(90)

for tool in ["Xvfb", "xdotool", "import", "compare"] where ToolProcess.find(tool) == nil {
    report("skip", "\(tool) is not installed (Debian: apt-get install xvfb xdotool imagemagick)")
    exit(0)
}
do {
    let display = try VirtualDisplay()
    xvfb.locked { $0 = display }
    report("display", display.name)
    try GTK.start(display: display.name)
} catch {
    fail("\(error)")
}

func nowNs() -> Int64 {
    var now = timespec()
    clock_gettime(CLOCK_MONOTONIC, &now)
    return Int64(now.tv_sec) * 1_000_000_000 + Int64(now.tv_nsec)
}

/// A number shared with other threads and `@Sendable` closures.
final class Shared: Sendable {
    private let value = Atomic<Int64>(0)
    var get: Int64 { value.load(ordering: .acquiring) }
    func set(_ new: Int64) { value.store(new, ordering: .releasing) }
    /// Adds 1; returns the new value.
    @discardableResult
    func increment() -> Int64 { value.add(1, ordering: .acquiringAndReleasing).newValue }
}

/// Latencies collected on the main thread and read after the run.
final class Samples: Sendable {
    private let values = Mutex<[Int64]>([])
    func append(_ value: Int64) { values.locked { $0.append(value) } }
    var all: [Int64] { values.locked { $0 } }
}

/// A GTK window shown and drawn, the bridge attached.
func showWindow() -> (GLibBridge, ScrollWindow, MainLoopDriver) {
    let bridge: GLibBridge
    do {
        bridge = try GLibBridge.attach(to: .main)
    } catch {
        fail("GLibBridge.attach: \(error)")
    }
    RunLoop.main.addCommonMode(.tracking)
    let window = ScrollWindow()
    let driver = MainLoopDriver()
    window.present()
    let shown = driver.run(for: .seconds(10)) { window.isMapped && window.draws > 0 && window.xWindow != 0 }
    if !shown { fail("the window was not shown within 10 s") }
    // Let the first frames settle: what follows measures an idle window.
    driver.run(for: .milliseconds(300))
    return (bridge, window, driver)
}

/// Milliseconds, one decimal.
func ms(_ ns: Int64) -> String { String(format: "%.2f", Double(ns) / 1e6) }

// MARK: - Test 10: the main queue and the main actor with GTK up

func mainQueue() {
    let (bridge, window, _) = showWindow()
    defer {
        window.destroy()
        bridge.invalidate()
    }
    // Worker posts, one at a time, each after the last has run: latency from the post to the
    // block (the loop asleep in between: nothing else is due in a GTK window at rest).
    let samples = 20
    let asyncLatencies = Samples()
    let actorLatencies = Samples()
    let worker = Thread {
        for index in 0..<(2 * samples) {
            usleep(10_000)
            let ran = DispatchSemaphore(value: 0)
            let sent = nowNs()
            if index % 2 == 0 {
                DispatchQueue.main.async {
                    let latency = nowNs() - sent
                    asyncLatencies.append(latency)
                    ran.signal()
                }
            } else {
                Task { @MainActor in
                    let latency = nowNs() - sent
                    actorLatencies.append(latency)
                    ran.signal()
                }
            }
            if ran.wait(timeout: .now() + 5) == .timedOut { break }
        }
        DispatchQueue.main.async { RunLoop.main.stop() }
    }
    worker.start()
    report("posts_run", RunLoop.main.run(mode: .default, for: .seconds(30)))
    for (name, latencies) in [("async", asyncLatencies.all), ("actor", actorLatencies.all)] {
        let sorted = latencies.sorted()
        report("\(name)_count", sorted.count)
        if let last = sorted.last {
            report("\(name)_p50_ms", ms(sorted[sorted.count / 2]))
            report("\(name)_max_ms", ms(last))
        }
    }

    // A 100-step chain on the main queue, each step queueing the next: one run of the loop.
    let steps = Shared()
    let chainStart = nowNs()
    let chainEnd = Shared()
    @Sendable func step() {
        if steps.increment() == 100 {
            chainEnd.set(nowNs())
            RunLoop.main.stop()
        } else {
            DispatchQueue.main.async { step() }
        }
    }
    DispatchQueue.main.async { step() }
    report("chain_run", RunLoop.main.run(mode: .default, for: .seconds(5)))
    report("chain_steps", steps.get)
    report("chain_ms", ms(chainEnd.get - chainStart))

    // The same chain on the main actor.
    let actorSteps = Shared()
    let actorStart = nowNs()
    let actorEnd = Shared()
    @Sendable func actorStep() {
        if actorSteps.increment() == 100 {
            actorEnd.set(nowNs())
            RunLoop.main.stop()
        } else {
            Task { @MainActor in actorStep() }
        }
    }
    Task { @MainActor in actorStep() }
    report("actor_chain_run", RunLoop.main.run(mode: .default, for: .seconds(5)))
    report("actor_chain_steps", actorSteps.get)
    report("actor_chain_ms", ms(actorEnd.get - actorStart))
}

// MARK: - Test 13: the frame clock, a queued draw, an idle window

/// Counts the loop's wakeups (afterWaiting) and passes (beforeTimers) in the common modes.
final class PassCounter: Sendable {
    let wakeups = Shared()
    let passes = Shared()
    let observer: RunLoopObserver

    init() {
        let wakeups = self.wakeups
        let passes = self.passes
        observer = RunLoopObserver(activities: [.afterWaiting, .beforeTimers]) { _, activity in
            if activity == .afterWaiting { wakeups.increment() } else { passes.increment() }
        }
        RunLoop.main.add(observer, forMode: .common)
    }
}

func frameClock() {
    let (bridge, window, driver) = showWindow()
    defer {
        window.destroy()
        bridge.invalidate()
    }
    let counter = PassCounter()
    defer { counter.observer.invalidate() }

    // Frames: a tick callback keeps the frame clock running (60 Hz: Xvfb has no vblank).
    window.startTicking()
    let framesBefore = window.frames
    let tickStart = nowNs()
    driver.run(for: .seconds(1))
    report("frames_1s", window.frames - framesBefore)
    report("frames_elapsed_ms", ms(nowNs() - tickStart))

    // Idle: the tick callback removed, the frame clock stops; wakeups over 500 ms.
    window.stopTicking()
    driver.run(for: .milliseconds(300))
    let idleWakeups = counter.wakeups.get
    let idlePasses = counter.passes.get
    let framesIdle = window.frames
    driver.run(for: .milliseconds(500))
    report("idle_wakeups_500ms", counter.wakeups.get - idleWakeups)
    report("idle_passes_500ms", counter.passes.get - idlePasses)
    report("idle_frames_500ms", window.frames - framesIdle)

    // A queued draw: drawn within the next passes (GDK's paint at GDK_PRIORITY_REDRAW).
    let drawsBefore = window.draws
    let passesBefore = counter.passes.get
    let queued = nowNs()
    window.queueDraw()
    let drawn = driver.run(for: .seconds(2)) { window.draws > drawsBefore }
    report("queued_draw_drawn", drawn)
    report("queued_draw_passes", counter.passes.get - passesBefore)
    report("queued_draw_ms", ms(nowNs() - queued))
}

// MARK: - Test 14: the drag

func drag(_ directory: String) {
    do {
        let result = try DragExperiment.run(screenshotsIn: directory) { line in report("note", line) }
        for line in result.lines { print(line) }
    } catch {
        fail("\(error)")
    }
}

// MARK: - Test 15: input while the loop runs nested

func nested() {
    let (bridge, window, driver) = showWindow()
    defer {
        window.destroy()
        bridge.invalidate()
    }
    /// One nested run started from `start` (a GLib callback or a loop timer), pointer motion sent
    /// meanwhile; the motion handler stops the nested run.
    func nestedRun(_ label: String, start: (@escaping () -> Void) -> Void) {
        let motionsBefore = window.motions
        var inNested = false
        var motionsInNested = 0
        var depthInHandler = -1
        var runResult = ""
        var outerDepth = -1
        window.onMotion = {
            guard inNested else { return }
            motionsInNested += 1
            depthInHandler = Int(g_main_depth())
            RunLoop.main.stop()
        }
        var done = false
        start {
            outerDepth = Int(g_main_depth())
            let motion: ToolProcess
            do {
                motion = try XTools.startMotion(window: window.xWindow, points: [(40, 60), (80, 90), (120, 120), (160, 150)])
            } catch {
                fail("\(error)")
            }
            inNested = true
            runResult = "\(RunLoop.main.run(mode: .default, for: .seconds(10)))"
            inNested = false
            motion.wait(timeout: .seconds(10))
            done = true
        }
        driver.run(for: .seconds(20)) { done }
        report("\(label)_started_at_depth", outerDepth)
        report("\(label)_run", runResult)
        report("\(label)_motions_in_nested", motionsInNested)
        report("\(label)_handler_depth", depthInHandler)
        report("\(label)_motions_total", window.motions - motionsBefore)
        window.onMotion = nil
        // Pointer back out of the way: the next case starts from a known position.
        if let reset = try? XTools.startMotion(window: window.xWindow, points: [(5, 5)]) {
            driver.run(until: reset, timeout: .seconds(10))
        }
        driver.run(for: .milliseconds(200))
    }
    // From a GLib timeout's callback: the nested run is inside GLib's dispatch (depth 1), and
    // GDK's event source, which may recurse, delivers the motion in it (depth 2).
    nestedRun("glib") { body in
        final class Box: @unchecked Sendable {
            // Main thread only: GLib calls it on the thread that iterates the default context.
            let body: () -> Void
            init(_ body: @escaping () -> Void) { self.body = body }
        }
        let box = Unmanaged.passRetained(Box(body)).toOpaque()
        g_timeout_add_full(
            G_PRIORITY_DEFAULT, 10,
            { data in
                Unmanaged<Box>.fromOpaque(data!).takeUnretainedValue().body()
                return 0
            }, box, { data in Unmanaged<Box>.fromOpaque(data!).release() })
    }
    // From a loop timer: the nested run is outside GLib's dispatch (depth 0); GLib's dispatch of
    // the motion in it is depth 1.
    nestedRun("timer") { body in
        final class Box: @unchecked Sendable {
            // Main thread only: the timer fires on the main loop's thread.
            let body: () -> Void
            init(_ body: @escaping () -> Void) { self.body = body }
        }
        let box = Box(body)
        RunLoop.main.add(RunLoopTimer(after: .milliseconds(10)) { _ in box.body() }, forMode: .default)
    }
}

switch scenario {
case "mainqueue": mainQueue()
case "frameclock": frameClock()
case "drag":
    guard arguments.count > 1 else { fail("drag needs a directory for its screenshots") }
    drag(arguments[1])
case "nested": nested()
default: fail("unknown scenario '\(scenario)' (mainqueue, frameclock, drag DIR, nested)")
}
xvfb.locked { $0 }?.stop()
report("done", true)
#else
print("skip=GTKProbe was built without the package trait GTK (swift build --traits GLib,GTK)")
#endif
