import CoreFoundation
import Foundation

// Plumbing for the differential tests (Tests/RunLoopKitTests/Differential): a locked trace
// recorder and `LoopDriver`, the small interface each scenario is written
// against, with its CoreFoundation implementation (`CFLoopDriver`, including `CFSource0`, a CF
// version-0 source whose perform callback reaches a Swift closure through the context's `info`
// pointer). The RunLoopKit implementation is Differential/RunLoopKitDriver.swift. This file does
// not import RunLoopKit, so `RunLoop` here is Foundation's (the CFRunLoop wrapper of
// swift-corelibs-foundation).

// MARK: - DiffTrace recorder

/// A thread-safe, append-only list of trace lines.
final class DiffTrace: @unchecked Sendable {
    private let lock = NSLock()
    private var items: [String] = []
    func callAsFunction(_ line: String) {
        lock.lock(); items.append(line); lock.unlock()
    }
    var lines: [String] {
        lock.lock(); defer { lock.unlock() }
        return items
    }
}

// MARK: - The driver abstraction: one scenario, two run loop implementations

enum DAct {
    static let entry: UInt = 1
    static let beforeTimers: UInt = 2
    static let beforeSources: UInt = 4
    static let beforeWaiting: UInt = 32
    static let afterWaiting: UInt = 64
    static let exit: UInt = 128
    static let all: UInt = 0x0FFF_FFFF

    static func name(_ raw: UInt) -> String {
        switch raw {
        case entry: "entry"
        case beforeTimers: "beforeTimers"
        case beforeSources: "beforeSources"
        case beforeWaiting: "beforeWaiting"
        case afterWaiting: "afterWaiting"
        case exit: "exit"
        default: "activity(\(raw))"
        }
    }
}

enum DMode {
    static let `default` = "kCFRunLoopDefaultMode"
    static let common = "kCFRunLoopCommonModes"
    static let tracking = "UITrackingRunLoopMode"
    static let my = "MyMode"
}

protocol DiffSource: AnyObject, Sendable {
    func signal()
    func invalidate()
    var isValid: Bool { get }
}
protocol DiffTimer: AnyObject, Sendable {
    func invalidate()
    var isValid: Bool { get }
    /// Seconds since the driver's epoch.
    func setFireDate(_ t: Double)
    /// The timer's fire date, seconds since the driver's epoch (`CFRunLoopTimerGetNextFireDate`,
    /// `RunLoopTimer.fireDate`). CF answers its reference date (absolute time 0, so a large
    /// negative number here) for an invalid timer: see `diffFireDateText`.
    var fireDate: Double { get }
}
protocol DiffObserver: AnyObject, Sendable {
    func invalidate()
    var isValid: Bool { get }
}

/// One run loop implementation, bound to the thread that created it.
/// Times are seconds since the driver's creation (its epoch), so two drivers run the same schedule.
protocol LoopDriver: AnyObject, Sendable {
    var kind: String { get }
    func now() -> Double
    /// Returns "finished", "stopped", "timedOut" or "handledSource".
    func run(_ mode: String, _ seconds: Double, rash: Bool) -> String
    /// CFRunLoopRun / RunLoop.run(): default mode until stopped or finished.
    func runUntilStoppedOrFinished()
    /// NSRunLoop `run(mode:before:)`: one run that returns after a handled source; false at once
    /// if the mode is empty.
    func runBefore(_ mode: String, _ seconds: Double) -> Bool
    /// NSRunLoop `run(until:)`: repeated `run(mode: .default, before:)` until the date.
    func runUntil(_ seconds: Double)
    /// The loop's modes, sorted.
    var allModes: [String] { get }
    /// NSRunLoop `acceptInput(forMode:before:)`.
    func acceptInput(_ mode: String, _ seconds: Double)
    /// The earliest timer fire date in `mode`, seconds since the epoch; nil if none.
    func nextTimerFireDate(_ mode: String) -> Double?
    /// A driver of the same kind for the calling thread's loop.
    func sibling() -> any LoopDriver
    func makeSource(order: Int, _ perform: @escaping @Sendable () -> Void) -> any DiffSource
    func add(_ s: any DiffSource, _ mode: String)
    func remove(_ s: any DiffSource, _ mode: String)
    func makeTimer(
        fireAt: Double, interval: Double, tolerance: Double, order: Int,
        _ handler: @escaping @Sendable (any DiffTimer) -> Void
    ) -> any DiffTimer
    func add(_ t: any DiffTimer, _ mode: String)
    func remove(_ t: any DiffTimer, _ mode: String)
    func makeObserver(
        _ activities: UInt, repeats: Bool, order: Int,
        _ handler: @escaping @Sendable (any DiffObserver, UInt) -> Void
    ) -> any DiffObserver
    func add(_ o: any DiffObserver, _ mode: String)
    func remove(_ o: any DiffObserver, _ mode: String)
    /// `CFRunLoopContainsSource/Timer/Observer`, `RunLoop.contains(_:inMode:)`; for the common
    /// modes: whether the item was added for `.common` (CF: is in `_commonModeItems`).
    func contains(_ s: any DiffSource, _ mode: String) -> Bool
    func contains(_ t: any DiffTimer, _ mode: String) -> Bool
    func contains(_ o: any DiffObserver, _ mode: String) -> Bool
    func perform(_ modes: [String], _ block: @escaping @Sendable () -> Void)
    func stop()
    func wakeUp()
    var currentMode: String? { get }
    func addCommonMode(_ mode: String)
    var isWaiting: Bool { get }
}

extension LoopDriver {
    func run(_ mode: String = DMode.default, _ seconds: Double, rash: Bool = false) -> String {
        run(mode, seconds, rash: rash)
    }
    func makeTimer(
        fireAt: Double, interval: Double = 0, tolerance: Double = 0, order: Int = 0,
        _ handler: @escaping @Sendable (any DiffTimer) -> Void
    ) -> any DiffTimer {
        makeTimer(fireAt: fireAt, interval: interval, tolerance: tolerance, order: order, handler)
    }
    func makeObserver(
        _ activities: UInt = DAct.all, repeats: Bool = true, order: Int = 0,
        _ handler: @escaping @Sendable (any DiffObserver, UInt) -> Void
    ) -> any DiffObserver {
        makeObserver(activities, repeats: repeats, order: order, handler)
    }
    func perform(_ modes: [String] = [DMode.default], _ block: @escaping @Sendable () -> Void) {
        perform(modes, block)
    }
    /// An observer of every activity that logs "<prefix>activity" into the trace.
    @discardableResult
    func traceActivities(
        _ t: DiffTrace, _ mode: String = DMode.default, prefix: String = "", order: Int = 0
    ) -> any DiffObserver {
        let o = makeObserver(DAct.all, repeats: true, order: order) { _, a in t(prefix + DAct.name(a)) }
        add(o, mode)
        return o
    }
    /// When this loop sleeps, does `action` from another thread.
    ///
    /// Starts a helper thread that waits (at most `timeout`) until the loop is asleep in its kernel
    /// wait (`isWaiting`: RunLoopKit's `RunLoop.isWaiting`, `CFRunLoopIsWaiting` on CF's side) and
    /// then calls `action` on that thread. If the loop never sleeps in time, the helper writes
    /// "helper: never saw the loop waiting" into `trace` instead (so the trace shows it and the
    /// test fails). The scenario runs the loop after this call, then joins the returned thread.
    func whenAsleep(
        trace: DiffTrace, timeout: Duration = .seconds(2), _ action: @escaping @Sendable () -> Void
    ) -> TestThread {
        TestThread(name: "diff-helper") {
            if waitUntil(timeout: timeout, { self.isWaiting }) {
                action()
            } else {
                trace("helper: never saw the loop waiting")
            }
        }
    }
    /// A source that is never signalled: keeps a mode non-empty and never wakes the loop.
    /// (Deliberately not a far-future timer, so that scenarios about wakeups do not depend on
    /// what adding a timer does to a loop that is not running.)
    @discardableResult
    func keepAlive(_ mode: String = DMode.default) -> any DiffSource {
        let s = makeSource(order: 1000) {}
        add(s, mode)
        return s
    }
}

// MARK: - CoreFoundation driver

func cfhString(_ s: String) -> CFString {
    CFStringCreateWithCString(nil, s, CFStringBuiltInEncodings.UTF8.rawValue)
}
func cfhSwiftString(_ s: CFString) -> String {
    let len = CFStringGetLength(s)
    let max = CFStringGetMaximumSizeForEncoding(len, CFStringBuiltInEncodings.UTF8.rawValue) + 1
    var buf = [CChar](repeating: 0, count: max)
    guard CFStringGetCString(s, &buf, max, CFStringBuiltInEncodings.UTF8.rawValue) else { return "?" }
    let bytes = buf.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }
    return String(decoding: bytes, as: UTF8.self)
}
func cfhMode(_ name: String) -> CFRunLoopMode {
    switch name {
    case DMode.default: kCFRunLoopDefaultMode
    case DMode.common: kCFRunLoopCommonModes
    default: cfhString(name)
    }
}

private final class CFSource0Box {
    let fn: @Sendable () -> Void
    init(_ fn: @escaping @Sendable () -> Void) { self.fn = fn }
}

/// A CF version-0 source whose perform callback calls a Swift closure
/// (reached through the context's `info` pointer, owned by the source).
final class CFSource0: DiffSource, @unchecked Sendable {
    let source: CFRunLoopSource
    init(order: Int, perform: @escaping @Sendable () -> Void) {
        var ctx = CFRunLoopSourceContext()
        ctx.version = 0
        ctx.info = Unmanaged.passRetained(CFSource0Box(perform)).toOpaque()
        ctx.release = { info in Unmanaged<CFSource0Box>.fromOpaque(info!).release() }
        ctx.perform = { info in Unmanaged<CFSource0Box>.fromOpaque(info!).takeUnretainedValue().fn() }
        source = CFRunLoopSourceCreate(kCFAllocatorDefault, order, &ctx)
    }
    func signal() { CFRunLoopSourceSignal(source) }
    func invalidate() { CFRunLoopSourceInvalidate(source) }
    var isValid: Bool { CFRunLoopSourceIsValid(source) }
}

final class CFDiffTimer: DiffTimer, @unchecked Sendable {
    var timer: CFRunLoopTimer!
    let epoch: CFAbsoluteTime
    init(epoch: CFAbsoluteTime) { self.epoch = epoch }
    func invalidate() { CFRunLoopTimerInvalidate(timer) }
    var isValid: Bool { CFRunLoopTimerIsValid(timer) }
    func setFireDate(_ t: Double) { CFRunLoopTimerSetNextFireDate(timer, epoch + t) }
    var fireDate: Double { CFRunLoopTimerGetNextFireDate(timer) - epoch }
}

final class CFDiffObserver: DiffObserver, @unchecked Sendable {
    var observer: CFRunLoopObserver!
    func invalidate() { CFRunLoopObserverInvalidate(observer) }
    var isValid: Bool { CFRunLoopObserverIsValid(observer) }
}

final class CFLoopDriver: LoopDriver, @unchecked Sendable {
    let rl: CFRunLoop
    let epoch: CFAbsoluteTime
    var kind: String { "CF" }
    init() {
        rl = CFRunLoopGetCurrent()
        epoch = CFAbsoluteTimeGetCurrent()
    }
    func now() -> Double { CFAbsoluteTimeGetCurrent() - epoch }
    func run(_ mode: String, _ seconds: Double, rash: Bool) -> String {
        precondition(CFRunLoopGetCurrent() === rl)
        let r = CFRunLoopRunInMode(cfhMode(mode), seconds, rash)
        switch r.rawValue {
        case 1: return "finished"
        case 2: return "stopped"
        case 3: return "timedOut"
        case 4: return "handledSource"
        default: return "result(\(r.rawValue))"
        }
    }
    func runUntilStoppedOrFinished() { CFRunLoopRun() }
    func sibling() -> any LoopDriver { CFLoopDriver() }
    func acceptInput(_ mode: String, _ seconds: Double) {
        Foundation.RunLoop.current.acceptInput(forMode: mode, before: Date(timeIntervalSinceNow: seconds))
    }
    func nextTimerFireDate(_ mode: String) -> Double? {
        let date = CFRunLoopGetNextTimerFireDate(rl, cfhMode(mode))
        return date == 0 ? nil : date - epoch
    }
    // Foundation's RunLoop is swift-corelibs-foundation's wrapper of this thread's CFRunLoop.
    func runBefore(_ mode: String, _ seconds: Double) -> Bool {
        Foundation.RunLoop.current.run(
            mode: Foundation.RunLoop.Mode(rawValue: mode), before: Date(timeIntervalSinceNow: seconds))
    }
    func runUntil(_ seconds: Double) {
        Foundation.RunLoop.current.run(until: Date(timeIntervalSinceNow: seconds))
    }
    var allModes: [String] {
        let modes = CFRunLoopCopyAllModes(rl)!
        return (0..<CFArrayGetCount(modes)).map { i in
            cfhSwiftString(Unmanaged<CFString>.fromOpaque(CFArrayGetValueAtIndex(modes, i)!).takeUnretainedValue())
        }.sorted()
    }
    func makeSource(order: Int, _ perform: @escaping @Sendable () -> Void) -> any DiffSource {
        CFSource0(order: order, perform: perform)
    }
    func add(_ s: any DiffSource, _ mode: String) {
        CFRunLoopAddSource(rl, (s as! CFSource0).source, cfhMode(mode))
    }
    func remove(_ s: any DiffSource, _ mode: String) {
        CFRunLoopRemoveSource(rl, (s as! CFSource0).source, cfhMode(mode))
    }
    func makeTimer(
        fireAt: Double, interval: Double, tolerance: Double, order: Int,
        _ handler: @escaping @Sendable (any DiffTimer) -> Void
    ) -> any DiffTimer {
        let h = CFDiffTimer(epoch: epoch)
        // The handler gets a fresh view of the timer it is passed, not `h`: capturing `h` (which
        // holds the timer) would make a reference cycle that leaks every timer.
        let epoch = self.epoch
        h.timer = CFRunLoopTimerCreateWithHandler(kCFAllocatorDefault, epoch + fireAt, interval, 0, order) { timer in
            let view = CFDiffTimer(epoch: epoch)
            view.timer = timer
            handler(view)
        }
        if tolerance > 0 { CFRunLoopTimerSetTolerance(h.timer, tolerance) }
        return h
    }
    func add(_ t: any DiffTimer, _ mode: String) {
        CFRunLoopAddTimer(rl, (t as! CFDiffTimer).timer, cfhMode(mode))
    }
    func remove(_ t: any DiffTimer, _ mode: String) {
        CFRunLoopRemoveTimer(rl, (t as! CFDiffTimer).timer, cfhMode(mode))
    }
    func makeObserver(
        _ activities: UInt, repeats: Bool, order: Int,
        _ handler: @escaping @Sendable (any DiffObserver, UInt) -> Void
    ) -> any DiffObserver {
        let h = CFDiffObserver()
        h.observer = CFRunLoopObserverCreateWithHandler(kCFAllocatorDefault, CFOptionFlags(activities), repeats, order)
        { observer, act in
            let view = CFDiffObserver()  // a fresh view, not `h` (see makeTimer)
            view.observer = observer
            handler(view, UInt(act.rawValue))
        }
        return h
    }
    func add(_ o: any DiffObserver, _ mode: String) {
        CFRunLoopAddObserver(rl, (o as! CFDiffObserver).observer, cfhMode(mode))
    }
    func remove(_ o: any DiffObserver, _ mode: String) {
        CFRunLoopRemoveObserver(rl, (o as! CFDiffObserver).observer, cfhMode(mode))
    }
    func contains(_ s: any DiffSource, _ mode: String) -> Bool {
        CFRunLoopContainsSource(rl, (s as! CFSource0).source, cfhMode(mode))
    }
    func contains(_ t: any DiffTimer, _ mode: String) -> Bool {
        CFRunLoopContainsTimer(rl, (t as! CFDiffTimer).timer, cfhMode(mode))
    }
    func contains(_ o: any DiffObserver, _ mode: String) -> Bool {
        CFRunLoopContainsObserver(rl, (o as! CFDiffObserver).observer, cfhMode(mode))
    }
    func perform(_ modes: [String], _ block: @escaping @Sendable () -> Void) {
        if modes.count == 1 {
            CFRunLoopPerformBlock(rl, cfhMode(modes[0]) as CFTypeRef, block)
        } else {
            let strings = modes.map { cfhMode($0) }
            var ptrs: [UnsafeRawPointer?] = strings.map { UnsafeRawPointer(Unmanaged.passUnretained($0).toOpaque()) }
            var callbacks = kCFTypeArrayCallBacks
            let cfArr = withExtendedLifetime(strings) {
                CFArrayCreate(kCFAllocatorDefault, &ptrs, ptrs.count, &callbacks)!
            }
            CFRunLoopPerformBlock(rl, cfArr, block)
        }
    }
    func stop() { CFRunLoopStop(rl) }
    func wakeUp() { CFRunLoopWakeUp(rl) }
    var currentMode: String? { CFRunLoopCopyCurrentMode(rl).map(cfhSwiftString) }
    func addCommonMode(_ mode: String) { CFRunLoopAddCommonMode(rl, cfhMode(mode)) }
    var isWaiting: Bool { CFRunLoopIsWaiting(rl) }
}

/// A fire date for a trace: rounded to 10 ms, or "reference date" for CF's answer for an
/// invalid timer (absolute time 0, i.e. decades before any driver's epoch).
func diffFireDateText(_ seconds: Double?) -> String {
    guard let seconds else { return "nil" }
    if seconds < -1e6 { return "reference date" }
    return String(format: "%.2f", seconds)
}

/// Busy-waits `microseconds` on the monotonic clock (no sleep): used only to make two steps get
/// distinct clock readings (CF stamps a Source0's signal with `mach_absolute_time()`, a timer's
/// clamped fire date with the same clock).
func diffBusyWait(microseconds: Int) {
    let end = DispatchTime.now().uptimeNanoseconds + UInt64(microseconds) * 1000
    while DispatchTime.now().uptimeNanoseconds < end {}
}

/// Runs a scenario on a fresh dedicated thread (a ``TestThread``) with a fresh driver, and waits
/// (10 s at most) until that thread has exited; returns its trace.
func diffTraceOf(
    _ make: @escaping @Sendable () -> any LoopDriver,
    _ scenario: @escaping @Sendable (any LoopDriver, DiffTrace) -> Void
) -> [String] {
    // A 1 MiB stack: scenarios nest runs, and CF's runs take more stack than RunLoopKit's.
    TestThreads.runBlocking(name: "diff-scenario", timeout: .seconds(10), stackSize: 1 << 20) {
        let t = DiffTrace()
        let d = make()
        scenario(d, t)
        return t.lines
    } ?? ["<scenario did not finish within 10 s>"]
}
