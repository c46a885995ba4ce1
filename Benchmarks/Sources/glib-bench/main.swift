// glib-bench: GLib idle dispatches per second, on RunLoopGLib's bridge and on GLib's own main
// loop, one process per run (the `glib` workload of runloop-bench runs it); and what naming a
// stall's GLib source costs the stall monitor.
//
//     glib-bench bridge     RunLoop.main drives GLib's default context (GLibBridge); one DEFAULT
//                           idle that always continues, for 1 s: dispatches_per_s
//     glib-bench plain      the same idle under g_main_loop_run on the default context
//     glib-bench bridge-thread, plain-thread
//                           the same two on a thread of its own, with a context of its own
//     glib-bench alternate  bridge and plain in one process, alternating 200 ms windows, 7 rounds,
//                           on the main thread and then on a thread of its own: the medians of
//                           each, and the median of each round's bridge / plain (a process's own
//                           speed, which differs by up to a third between two processes of one
//                           binary on this machine, cancels out of that ratio)
//     glib-bench describe   RunLoop.calloutDetail(of:) from another thread while the main thread is
//                           in a GLib callback (the bridge's describer reads the source's name) and
//                           on a loop with no describer: ns per call
//
// Prints `key=value` lines.

import CGLibBench
import Foundation
import RunLoopGLib
import RunLoopKit
import Synchronization

import class RunLoopKit.RunLoop

let window: Duration = .seconds(1)

final class Counter: @unchecked Sendable {
    // `@unchecked Sendable`: only the main thread (the idle's callback) touches it, and main reads
    // it after the loop returned.
    var count = 0
    var deadline = ContinuousClock.now
}

extension Duration {
    var inSeconds: Double { Double(components.seconds) + Double(components.attoseconds) / 1e18 }
}

/// The idle: counts, and ends the run once the window has passed (the clock read every 1,024).
func idle(_ counter: Counter, end: @escaping () -> Void) -> (UnsafeMutableRawPointer, GSourceFunc) {
    final class Box {
        let counter: Counter
        let end: () -> Void
        init(_ counter: Counter, _ end: @escaping () -> Void) {
            self.counter = counter
            self.end = end
        }
    }
    let box = Unmanaged.passRetained(Box(counter, end)).toOpaque()
    return (
        box,
        { data in
            let box = Unmanaged<Box>.fromOpaque(data!).takeUnretainedValue()
            box.counter.count += 1
            if box.counter.count & 1023 == 0, ContinuousClock.now >= box.counter.deadline {
                box.end()
                return 0
            }
            return 1
        }
    )
}

func bridge() {
    let bridge = try! GLibBridge.attach(to: .main)
    let counter = Counter()
    let (data, function) = idle(counter) { RunLoop.main.stop() }
    // Warm up: the first passes make the mode's epoll set and grow the bridge's arrays.
    RunLoop.main.run(mode: .default, for: .milliseconds(50))
    counter.deadline = .now + window
    let start = ContinuousClock.now
    g_idle_add_full(G_PRIORITY_DEFAULT, function, data, nil)
    RunLoop.main.run(mode: .default, for: .seconds(30))
    let elapsed = ContinuousClock.now - start
    print("dispatches_per_s=\(Double(counter.count) / elapsed.inSeconds)")
    bridge.invalidate()
}

func plain() {
    let loop = g_main_loop_new(nil, 0)!
    let counter = Counter()
    let address = UInt(bitPattern: loop)
    let (data, function) = idle(counter) { g_main_loop_quit(OpaquePointer(bitPattern: address)) }
    g_main_context_iteration(nil, 0)
    counter.deadline = .now + window
    let start = ContinuousClock.now
    g_idle_add_full(G_PRIORITY_DEFAULT, function, data, nil)
    g_main_loop_run(loop)
    let elapsed = ContinuousClock.now - start
    print("dispatches_per_s=\(Double(counter.count) / elapsed.inSeconds)")
    g_main_loop_unref(loop)
}

func median(_ values: [Double]) -> Double {
    let sorted = values.sorted()
    return sorted.count % 2 == 1 ? sorted[sorted.count / 2] : (sorted[sorted.count / 2 - 1] + sorted[sorted.count / 2]) / 2
}

/// The bridge and GLib's loop in turns on one context, in this process and on this thread: per
/// round, a bridge window and a plain window.
func alternateWindows(context: OpaquePointer?, loop: RunLoop, suffix: String) {
    let rounds = 7
    let window: Duration = .milliseconds(200)
    var bridged: [Double] = []
    var plained: [Double] = []
    var ratios: [Double] = []
    for round in 0..<rounds {
        // Who goes first alternates, so that neither always follows the other.
        let b: Double
        let p: Double
        if round % 2 == 0 {
            b = bridgeWindow(context: context, loop: loop, window: window)
            p = plainWindow(context: context, window: window)
        } else {
            p = plainWindow(context: context, window: window)
            b = bridgeWindow(context: context, loop: loop, window: window)
        }
        bridged.append(b)
        plained.append(p)
        ratios.append(b / p)
    }
    print("dispatches_per_s\(suffix)=\(median(bridged))")
    print("plain_dispatches_per_s\(suffix)=\(median(plained))")
    print("bridge_over_plain\(suffix)=\(median(ratios))")
}

/// One window of the bridge: attached for it, detached after (the context released).
func bridgeWindow(context: OpaquePointer?, loop: RunLoop, window: Duration) -> Double {
    let bridge = try! GLibBridge.attach(to: loop, context: context)
    loop.run(mode: .default, for: .milliseconds(20))
    let rate = runIdle(context: context, window: window) { loop.stop() } run: {
        loop.run(mode: .default, for: .seconds(30))
    }
    bridge.invalidate()
    return rate
}

/// One window of GLib's own loop on the same context.
func plainWindow(context: OpaquePointer?, window: Duration) -> Double {
    let glibLoop = g_main_loop_new(context, 0)!
    let address = UInt(bitPattern: glibLoop)
    g_main_context_iteration(context, 0)
    let rate = runIdle(context: context, window: window) {
        g_main_loop_quit(OpaquePointer(bitPattern: address))
    } run: {
        g_main_loop_run(glibLoop)
    }
    g_main_loop_unref(glibLoop)
    return rate
}

/// One window of the idle on `context`: attached, run by `run` until it calls `end` after
/// `window`; dispatches per second.
func runIdle(context: OpaquePointer?, window: Duration, end: @escaping () -> Void, run: () -> Void) -> Double {
    let counter = Counter()
    let (data, function) = idle(counter, end: end)
    counter.deadline = .now + window
    let source = g_idle_source_new()!
    g_source_set_priority(source, G_PRIORITY_DEFAULT)
    g_source_set_callback(source, function, data, nil)
    let start = ContinuousClock.now
    g_source_attach(source, context)
    run()
    let elapsed = ContinuousClock.now - start
    g_source_unref(source)
    return Double(counter.count) / elapsed.inSeconds
}

func alternate() {
    alternateWindows(context: nil, loop: .main, suffix: "")
    onThread {
        alternateWindows(context: g_main_context_new(), loop: RunLoop.current, suffix: "_thread")
    }
}

/// `calloutDetail(of:)` called 200,000 times from a worker while the main thread spins in a GLib
/// callback (the bridge's describer reads the source's name), then on a loop with no describer:
/// ns per call.
func describe() {
    let bridge = try! GLibBridge.attach(to: .main)
    let calls = 200_000
    let flags = SpinFlags()
    let results = Mutex<(withDescriber: Double, name: String?, without: Double)>((0, nil, 0))
    let worker = Thread {
        while !flags.inCallback.load(ordering: .acquiring) { usleep(100) }
        let snapshot = RunLoop.main.calloutSnapshot
        var name: String?
        let start = ContinuousClock.now
        for _ in 0..<calls { name = RunLoop.main.calloutDetail(of: snapshot) }
        let with = (ContinuousClock.now - start).inSeconds * 1e9 / Double(calls)
        let other = RunLoop.current
        let otherSnapshot = other.calloutSnapshot
        let start2 = ContinuousClock.now
        for _ in 0..<calls { _ = other.calloutDetail(of: otherSnapshot) }
        let without = (ContinuousClock.now - start2).inSeconds * 1e9 / Double(calls)
        results.withLock { $0 = (with, name, without) }
        flags.done.store(true, ordering: .releasing)
    }
    worker.start()
    let source = g_timeout_source_new(1)!
    g_source_set_name(source, "glib-bench spinning callback")
    g_source_set_callback(
        source,
        { data in
            let flags = Unmanaged<SpinFlags>.fromOpaque(data!).takeUnretainedValue()
            flags.inCallback.store(true, ordering: .releasing)
            while !flags.done.load(ordering: .acquiring) { usleep(50) }
            RunLoop.main.stop()
            return 0
        }, Unmanaged.passRetained(flags).toOpaque(), nil)
    g_source_attach(source, nil)
    RunLoop.main.run(mode: .default, for: .seconds(60))
    let (with, name, without) = results.withLock { $0 }
    print("describe_ns=\(with)")
    print("describe_name=\(name ?? "nil")")
    print("no_describer_ns=\(without)")
    bridge.invalidate()
}

final class SpinFlags: Sendable {
    let inCallback = Atomic<Bool>(false)
    let done = Atomic<Bool>(false)
}

/// The same two on a thread of their own with a context of its own (`g_main_context_new`): a loop
/// that is not the main loop, which has no main queue to look at in each pass.
func onThread(_ body: @escaping @Sendable () -> Void) {
    let done = DispatchSemaphore(value: 0)
    let thread = Thread {
        body()
        done.signal()
    }
    thread.start()
    done.wait()
}

func bridgeOnThread() {
    onThread {
        let context = g_main_context_new()!
        let loop = RunLoop.current
        let bridge = try! GLibBridge.attach(to: loop, context: context)
        let counter = Counter()
        let (data, function) = idle(counter) { RunLoop.current.stop() }
        loop.run(mode: .default, for: .milliseconds(50))
        counter.deadline = .now + window
        let start = ContinuousClock.now
        let source = g_idle_source_new()!
        g_source_set_callback(source, function, data, nil)
        g_source_attach(source, context)
        loop.run(mode: .default, for: .seconds(30))
        let elapsed = ContinuousClock.now - start
        print("dispatches_per_s_thread=\(Double(counter.count) / elapsed.inSeconds)")
        bridge.invalidate()
    }
}

func plainOnThread() {
    onThread {
        let context = g_main_context_new()!
        let loop = g_main_loop_new(context, 0)!
        let counter = Counter()
        let address = UInt(bitPattern: loop)
        let (data, function) = idle(counter) { g_main_loop_quit(OpaquePointer(bitPattern: address)) }
        g_main_context_iteration(context, 0)
        counter.deadline = .now + window
        let start = ContinuousClock.now
        let source = g_idle_source_new()!
        g_source_set_callback(source, function, data, nil)
        g_source_attach(source, context)
        g_main_loop_run(loop)
        let elapsed = ContinuousClock.now - start
        print("dispatches_per_s_thread=\(Double(counter.count) / elapsed.inSeconds)")
        g_main_loop_unref(loop)
    }
}

switch CommandLine.arguments.dropFirst().first {
case "bridge": bridge()
case "plain": plain()
case "bridge-thread": bridgeOnThread()
case "plain-thread": plainOnThread()
case "describe": describe()
case "alternate": alternate()
default:
    print("usage: glib-bench bridge|plain|bridge-thread|plain-thread|alternate|describe")
    exit(2)
}
