// MainQueueProbe: runs one main-queue scenario on the process's main thread and prints its trace.
//
// Test support for Tests/RunLoopKitTests/Integration/MainQueueTests.swift. The main-queue rule is
// about the main thread, and a test never has it: Swift Testing runs tests on worker threads, and
// its runner has called dispatch_main() (the main thread is parked, the main queue is served by
// worker threads, and libdispatch's main-queue handle is -1), in exit-test children too. So the
// tests launch this small program, whose top-level code owns the main thread, once per engine:
//
//     MainQueueProbe cf modes        CoreFoundation's main loop (CFRunLoopRunInMode)
//     MainQueueProbe rlk modes       RunLoopKit's RunLoop.main, same scenario
//     MainQueueProbe cf activities   the main queue's port checked before sleeping, observed
//     MainQueueProbe rlk activities  the same on RunLoopKit
//     MainQueueProbe cf polling      the port checked by passes that poll (a version-0 source)
//     MainQueueProbe rlk polling     the same on RunLoopKit (polling-pipe: with a descriptor too)
//     MainQueueProbe rlk coexist     both in one process, each nested in the other
//
// It prints one line per event, then "done", and exits 0. Every run is bounded (5 s at most), and
// nothing waits on a sleep: each run ends on the event the scenario is about.

import CRunLoopKit
import CoreFoundation
import Dispatch
// CoreFoundation's functions are in libFoundation.so on Linux: importing Foundation links it.
import Foundation
import Glibc
import RunLoopKit
import Synchronization

import class RunLoopKit.RunLoop

// MARK: - Trace

let lines = Mutex<[String]>([])

/// Records a line (blocks say whether they ran on the main thread).
@Sendable func trace(_ line: String) {
    lines.locked { $0.append(line) }
}

/// Queues a block on the main queue that records `name` (and the thread it ran on).
func queueBlock(_ name: String, then: (@Sendable () -> Void)? = nil) {
    DispatchQueue.main.async {
        trace("\(name) ran on \(crlk_is_main_thread() ? "the main thread" : "another thread")")
        then?()
    }
}

// MARK: - Engines: the same calls on CoreFoundation's main loop and on RunLoopKit's

protocol Engine: Sendable {
    /// Runs the main loop once in `mode` (CFRunLoopRunInMode); returns the result's name.
    func run(_ mode: String, seconds: Double, returnAfterSourceHandled: Bool) -> String
    /// Adds a one-shot timer to `mode` of the main loop; returns a closure that invalidates it.
    @discardableResult
    func addTimer(_ mode: String, after seconds: Double, _ body: @escaping @Sendable () -> Void) -> () -> Void
    func addCommonMode(_ mode: String)
    /// Adds an all-activities observer to `mode` of the main loop that traces each activity.
    func traceActivities(_ mode: String)
    /// CFRunLoopRun / RunLoop.run(): the default mode until stopped or finished.
    func runUntilStopped()
    func stop()
    /// CFRunLoopWakeUp on the main loop.
    func wakeUp()
    /// Adds a version-0 source to `mode` of the main loop; returns a closure that signals it.
    func addSource0(_ mode: String, _ perform: @escaping @Sendable () -> Void) -> @Sendable () -> Void
}

/// A version-0 source's perform callback, reached through CF's context `info` (owned by the source).
final class Source0Box: Sendable {
    let perform: @Sendable () -> Void
    init(_ perform: @escaping @Sendable () -> Void) { self.perform = perform }
}

/// CoreFoundation's sources are not Sendable in Swift's eyes; CFRunLoopSourceSignal is
/// documented thread-safe, and the probe signals from the main thread only.
struct CFSourceHandle: @unchecked Sendable {
    let source: CFRunLoopSource
}

func cfMode(_ name: String) -> CFRunLoopMode {
    name == "default" ? kCFRunLoopDefaultMode : CFStringCreateWithCString(nil, name, CFStringBuiltInEncodings.UTF8.rawValue)
}

struct CFEngine: Engine {
    func run(_ mode: String, seconds: Double, returnAfterSourceHandled: Bool) -> String {
        switch CFRunLoopRunInMode(cfMode(mode), seconds, returnAfterSourceHandled).rawValue {
        case 1: "finished"
        case 2: "stopped"
        case 3: "timedOut"
        case 4: "handledSource"
        case let other: "result \(other)"
        }
    }
    @discardableResult
    func addTimer(_ mode: String, after seconds: Double, _ body: @escaping @Sendable () -> Void) -> () -> Void {
        let timer = CFRunLoopTimerCreateWithHandler(kCFAllocatorDefault, CFAbsoluteTimeGetCurrent() + seconds, 0, 0, 0) {
            _ in body()
        }
        CFRunLoopAddTimer(CFRunLoopGetMain(), timer, cfMode(mode))
        return { CFRunLoopTimerInvalidate(timer) }
    }
    func addCommonMode(_ mode: String) { CFRunLoopAddCommonMode(CFRunLoopGetMain(), cfMode(mode)) }
    func traceActivities(_ mode: String) {
        let observer = CFRunLoopObserverCreateWithHandler(kCFAllocatorDefault, CFRunLoopActivity.allActivities.rawValue, true, 0) {
            _, activity in trace("  observer: \(activityName(activity.rawValue))")
        }
        CFRunLoopAddObserver(CFRunLoopGetMain(), observer, cfMode(mode))
    }
    func runUntilStopped() { CFRunLoopRun() }
    func stop() { CFRunLoopStop(CFRunLoopGetMain()) }
    func wakeUp() { CFRunLoopWakeUp(CFRunLoopGetMain()) }
    func addSource0(_ mode: String, _ perform: @escaping @Sendable () -> Void) -> @Sendable () -> Void {
        var context = CFRunLoopSourceContext()
        context.version = 0
        context.info = Unmanaged.passRetained(Source0Box(perform)).toOpaque()
        context.release = { info in Unmanaged<Source0Box>.fromOpaque(info!).release() }
        context.perform = { info in Unmanaged<Source0Box>.fromOpaque(info!).takeUnretainedValue().perform() }
        let handle = CFSourceHandle(source: CFRunLoopSourceCreate(kCFAllocatorDefault, 0, &context))
        CFRunLoopAddSource(CFRunLoopGetMain(), handle.source, cfMode(mode))
        return { CFRunLoopSourceSignal(handle.source) }
    }
}

struct RunLoopKitEngine: Engine {
    func mode(_ name: String) -> RunLoop.Mode { name == "default" ? .default : RunLoop.Mode(rawValue: name) }
    func run(_ mode: String, seconds: Double, returnAfterSourceHandled: Bool) -> String {
        RunLoop.main.run(
            mode: self.mode(mode), for: .seconds(seconds), returnAfterSourceHandled: returnAfterSourceHandled
        ).description
    }
    @discardableResult
    func addTimer(_ mode: String, after seconds: Double, _ body: @escaping @Sendable () -> Void) -> () -> Void {
        let timer = RunLoopTimer(after: .seconds(seconds)) { _ in body() }
        RunLoop.main.add(timer, forMode: self.mode(mode))
        return { timer.invalidate() }
    }
    func addCommonMode(_ mode: String) { RunLoop.main.addCommonMode(self.mode(mode)) }
    func traceActivities(_ mode: String) {
        let observer = RunLoopObserver(activities: .allActivities) { _, activity in
            trace("  observer: \(activityName(UInt(activity.rawValue)))")
        }
        RunLoop.main.add(observer, forMode: self.mode(mode))
    }
    func runUntilStopped() { RunLoop.main.run() }
    func stop() { RunLoop.main.stop() }
    func wakeUp() { RunLoop.main.wakeUp() }
    func addSource0(_ mode: String, _ perform: @escaping @Sendable () -> Void) -> @Sendable () -> Void {
        let source = RunLoopSource(perform: perform)
        RunLoop.main.add(source, forMode: self.mode(mode))
        return { source.signal() }
    }
}

// MARK: - Scenarios

/// The main-queue rule, step by step; the same calls on either engine.
func modes(_ engine: any Engine) {
    // 1. Work queued on the main queue, and a main-actor task.
    queueBlock("A")
    Task { @MainActor in trace("main-actor task ran on \(crlk_is_main_thread() ? "the main thread" : "another thread")") }

    // 2. A private (non-common) mode does not serve the main queue: the run ends when its only
    //    timer has fired and the mode is empty, with the work still queued.
    engine.addTimer("Private", after: 0.02) { trace("timer in Private fired") }
    trace("run(Private, 5 s) -> \(engine.run("Private", seconds: 5, returnAfterSourceHandled: false))")

    // 3. The default mode (a common mode) serves it: the queued block and the task run.
    trace("run(default, 5 s, returnAfterSourceHandled) -> \(engine.run("default", seconds: 5, returnAfterSourceHandled: true))")

    // 4. With nothing queued, the default mode of the main loop is still not empty: the run waits.
    trace("run(default, 50 ms), nothing queued -> \(engine.run("default", seconds: 0.05, returnAfterSourceHandled: false))")

    // 5. A mode made common serves it too (a far timer makes the mode exist in CF).
    engine.addCommonMode("Tracking")
    let invalidateFar = engine.addTimer("Tracking", after: 3600) {}
    queueBlock("B")
    trace("run(Tracking, 5 s, returnAfterSourceHandled) -> \(engine.run("Tracking", seconds: 5, returnAfterSourceHandled: true))")
    invalidateFar()

    // 6. A run nested in a main-queue block does not serve the main queue (libdispatch does not
    //    re-enter its drain): D waits for the block that nested the run to return.
    queueBlock("C") {
        queueBlock("D")
        trace("  run(default, 100 ms) nested in C -> \(engine.run("default", seconds: 0.1, returnAfterSourceHandled: false))")
    }
    trace("run(default, 5 s, returnAfterSourceHandled) -> \(engine.run("default", seconds: 5, returnAfterSourceHandled: true))")
    trace("run(default, 5 s, returnAfterSourceHandled) -> \(engine.run("default", seconds: 5, returnAfterSourceHandled: true))")

    // 7. run() (CFRunLoopRun) keeps running while only the main queue feeds it: a main-actor task
    //    sleeps (its continuation comes back through the main queue), then asyncAfter stops it.
    Task { @MainActor in
        try? await Task.sleep(for: .milliseconds(10))
        trace("main-actor task resumed after Task.sleep")
        DispatchQueue.main.asyncAfter(deadline: .now() + .milliseconds(10)) {
            trace("asyncAfter block ran; stop()")
            engine.stop()
        }
    }
    engine.runUntilStopped()
    trace("run() returned")
}

/// CFRunLoopActivity's bits, which RunLoopKit's activities share.
func activityName(_ bits: UInt) -> String {
    switch bits {
    case 1 << 0: "entry"
    case 1 << 1: "beforeTimers"
    case 1 << 2: "beforeSources"
    case 1 << 5: "beforeWaiting"
    case 1 << 6: "afterWaiting"
    case 1 << 7: "exit"
    default: "activity \(bits)"
    }
}

/// The main queue's port checked before sleeping (`__CFRunLoopRun`, before
/// `kCFRunLoopBeforeWaiting`): work queued on the main queue during a pass is served at the next
/// pass without announcing a sleep (no beforeWaiting, no afterWaiting), unless the main queue was
/// served in the pass before (`didDispatchPortLastTime`); the first pass of a run does not check.
func activities(_ engine: any Engine) {
    engine.traceActivities("default")
    // A timer queues A; A queues B while the main queue is being served.
    engine.addTimer("default", after: 0.01) {
        trace("  timer fired; queues A")
        queueBlock("  A") { queueBlock("  B") }
    }
    trace("run(default, 5 s, returnAfterSourceHandled)")
    trace("-> \(engine.run("default", seconds: 5, returnAfterSourceHandled: true))")
    // B was queued by A: the next run's first pass does not check the port; it sleeps and wakes
    // for it at once.
    trace("run(default, 5 s, returnAfterSourceHandled)")
    trace("-> \(engine.run("default", seconds: 5, returnAfterSourceHandled: true))")
    // Without returnAfterSourceHandled: C, queued by a timer, is served by the next pass's check;
    // D, queued by C, waits for the pass after (the port was served last time), which sleeps
    // first; then the run sleeps until its timeout.
    engine.addTimer("default", after: 0.01) {
        trace("  timer fired; queues C")
        queueBlock("  C") { queueBlock("  D") }
    }
    trace("run(default, 300 ms)")
    trace("-> \(engine.run("default", seconds: 0.3, returnAfterSourceHandled: false))")
    // A wakeUp() from a block served before sleeping is ignored, as after a wait (CF's handle_msg
    // sets its ignore-wakeups flag on that path too): the next pass sleeps until the timeout.
    engine.addTimer("default", after: 0.01) {
        trace("  timer fired; queues E")
        queueBlock("  E (wakeUp())") { engine.wakeUp() }
    }
    trace("run(default, 200 ms)")
    trace("-> \(engine.run("default", seconds: 0.2, returnAfterSourceHandled: false))")
}

/// Passes that poll (a version-0 source was handled) check the main queue's port too: work queued
/// during such a pass is served by the pass alone, and a timer that came due meanwhile fires the
/// pass after (CoreFoundation's `goto handle_msg` skips the pass's timers and other ports).
/// `pipe`: RunLoopKit only, a descriptor made readable in the same pass is handled the pass after.
func polling(_ engine: any Engine, pipe: Bool = false) {
    engine.traceActivities("default")
    let performed = Mutex(0)
    let descriptors = Mutex<(read: Int32, write: Int32)?>(nil)
    if pipe {
        var ends: [Int32] = [0, 0]
        precondition(Glibc.pipe(&ends) == 0, "pipe failed")
        descriptors.locked { $0 = (ends[0], ends[1]) }
        let source = try! FileDescriptorSource(descriptor: ends[0], watching: .readable) { source, _ in
            var byte: UInt8 = 0
            _ = read(source.descriptor, &byte, 1)
            trace("  pipe readable")
        }
        RunLoop.main.add(source, forMode: .default)
    }
    let signal = Mutex<(@Sendable () -> Void)?>(nil)
    let signalSource = engine.addSource0("default") {
        let count = performed.locked { $0 += 1; return $0 }
        trace("  source performed (\(count))")
        switch count {
        case 1:
            signal.locked { $0 }?()  // the next pass polls too
        case 2:
            queueBlock("  A")
            engine.addTimer("default", after: 0) { trace("  timer fired") }
            if let ends = descriptors.locked({ $0 }) {
                var byte: UInt8 = 1
                _ = write(ends.write, &byte, 1)
            }
        default:
            break
        }
    }
    signal.locked { $0 = signalSource }
    signalSource()
    trace("run(default, 200 ms)")
    trace("-> \(engine.run("default", seconds: 0.2, returnAfterSourceHandled: false))")
}

/// CoreFoundation and RunLoopKit in one process: whichever runs on the main thread serves the
/// main queue, each nested in the other, and no work is lost or run twice.
func coexist() {
    let cf = CFEngine()
    let rlk = RunLoopKitEngine()
    trace("RunLoop.main serves the main queue: \(RunLoop.main.servesMainDispatchQueue)")

    rlk.addTimer("default", after: 0) {
        queueBlock("X")
        trace("  CF run(default) nested in a RunLoopKit timer -> \(cf.run("default", seconds: 5, returnAfterSourceHandled: true))")
        queueBlock("Y")
    }
    trace("RunLoopKit run(default) -> \(rlk.run("default", seconds: 5, returnAfterSourceHandled: true))")

    cf.addTimer("default", after: 0) {
        queueBlock("Z")
        trace("  RunLoopKit run(default) nested in a CF timer -> \(rlk.run("default", seconds: 5, returnAfterSourceHandled: true))")
        queueBlock("W")
    }
    trace("CF run(default) -> \(cf.run("default", seconds: 5, returnAfterSourceHandled: true))")
}

/// Which loops serve the main queue, and what the main loop's description shows.
func identity() {
    trace("RunLoop.main serves the main queue: \(RunLoop.main.servesMainDispatchQueue)")
    trace("RunLoop.current is RunLoop.main on the main thread: \(RunLoop.current === RunLoop.main)")
    let other = Mutex<Bool?>(nil)
    let thread = ProbeThread { other.locked { $0 = RunLoop.current.servesMainDispatchQueue } }
    thread.join()
    trace("a thread's loop serves the main queue: \(other.locked { $0 }.map(String.init) ?? "?")")
    DispatchQueue.main.async {
        trace("inside a main-queue block, RunLoop.main serves the main queue: \(RunLoop.main.servesMainDispatchQueue)")
    }
    trace("run(default, 5 s, returnAfterSourceHandled) -> \(RunLoop.main.run(mode: .default, for: .seconds(5), returnAfterSourceHandled: true))")
    trace("after it, RunLoop.main serves the main queue: \(RunLoop.main.servesMainDispatchQueue)")
    let description = RunLoop.main.description
    trace("description mentions a descriptor source: \(description.contains("FileDescriptorSource"))")
}

/// A plain pthread, joined.
final class ProbeThread: Sendable {
    private let handle: pthread_t
    init(_ body: @escaping @Sendable () -> Void) {
        var thread = pthread_t()
        let box = Unmanaged.passRetained(Body(body)).toOpaque()
        let status = pthread_create(
            &thread, nil, { raw in
                Unmanaged<Body>.fromOpaque(raw!).takeRetainedValue().body()
                return nil
            }, box)
        precondition(status == 0, "pthread_create failed: \(status)")
        handle = thread
    }
    func join() { pthread_join(handle, nil) }
    private final class Body: Sendable {
        let body: @Sendable () -> Void
        init(_ body: @escaping @Sendable () -> Void) { self.body = body }
    }
}

// MARK: - Main

precondition(crlk_is_main_thread(), "the probe's top-level code runs on the main thread")
let arguments = CommandLine.arguments.dropFirst()
switch (arguments.first, arguments.dropFirst().first) {
case ("cf", "modes"): modes(CFEngine())
case ("rlk", "modes"): modes(RunLoopKitEngine())
case ("cf", "activities"): activities(CFEngine())
case ("rlk", "activities"): activities(RunLoopKitEngine())
case ("cf", "polling"): polling(CFEngine())
case ("rlk", "polling"): polling(RunLoopKitEngine())
case ("rlk", "polling-pipe"): polling(RunLoopKitEngine(), pipe: true)
case ("rlk", "coexist"): coexist()
case ("rlk", "identity"): identity()
default:
    print("usage: MainQueueProbe cf modes|activities|polling | rlk modes|activities|polling|polling-pipe|coexist|identity")
    exit(2)
}
for line in lines.locked({ $0 }) { print(line) }
print("done")
exit(0)
