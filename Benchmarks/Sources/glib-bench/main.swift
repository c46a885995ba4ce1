// glib-bench: GLib idle dispatches per second, on RunLoopGLib's bridge and on GLib's own main
// loop, one process per run (the `glib` workload of runloop-bench runs it); and what naming a
// stall's GLib source costs the stall monitor.
//
//     glib-bench bridge     RunLoop.main drives GLib's default context (GLibBridge); one DEFAULT
//                           idle that always continues, for 1 s: dispatches_per_s
//     glib-bench plain      the same idle under g_main_loop_run on the default context
//     glib-bench bridge-thread, plain-thread
//                           the same two on a thread of its own, with a context of its own
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
default:
    print("usage: glib-bench bridge|plain|bridge-thread|plain-thread|describe")
    exit(2)
}
