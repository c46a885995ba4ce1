import CoreFoundation
import Foundation
import SharedTestSupport

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

enum DiffActivity {
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

enum DiffMode {
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
    func setFireDate(_ seconds: Double)
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
    func run(_ mode: String, _ seconds: Double, returnAfterSourceHandled: Bool) -> String
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
    func add(_ source: any DiffSource, _ mode: String)
    func remove(_ source: any DiffSource, _ mode: String)
    func makeTimer(
        fireAt: Double, interval: Double, tolerance: Double, order: Int,
        _ handler: @escaping @Sendable (any DiffTimer) -> Void
    ) -> any DiffTimer
    func add(_ timer: any DiffTimer, _ mode: String)
    func remove(_ timer: any DiffTimer, _ mode: String)
    func makeObserver(
        _ activities: UInt, repeats: Bool, order: Int,
        _ handler: @escaping @Sendable (any DiffObserver, UInt) -> Void
    ) -> any DiffObserver
    func add(_ observer: any DiffObserver, _ mode: String)
    func remove(_ observer: any DiffObserver, _ mode: String)
    /// `CFRunLoopContainsSource/Timer/Observer`, `RunLoop.contains(_:inMode:)`; for the common
    /// modes: whether the item was added for `.common` (CF: is in `_commonModeItems`).
    func contains(_ source: any DiffSource, _ mode: String) -> Bool
    func contains(_ timer: any DiffTimer, _ mode: String) -> Bool
    func contains(_ observer: any DiffObserver, _ mode: String) -> Bool
    func perform(_ modes: [String], _ block: @escaping @Sendable () -> Void)
    func stop()
    func wakeUp()
    var currentMode: String? { get }
    func addCommonMode(_ mode: String)
    var isWaiting: Bool { get }
}

extension LoopDriver {
    func run(_ mode: String = DiffMode.default, _ seconds: Double, returnAfterSourceHandled: Bool = false) -> String {
        run(mode, seconds, returnAfterSourceHandled: returnAfterSourceHandled)
    }
    func makeTimer(
        fireAt: Double, interval: Double = 0, tolerance: Double = 0, order: Int = 0,
        _ handler: @escaping @Sendable (any DiffTimer) -> Void
    ) -> any DiffTimer {
        makeTimer(fireAt: fireAt, interval: interval, tolerance: tolerance, order: order, handler)
    }
    func makeObserver(
        _ activities: UInt = DiffActivity.all, repeats: Bool = true, order: Int = 0,
        _ handler: @escaping @Sendable (any DiffObserver, UInt) -> Void
    ) -> any DiffObserver {
        makeObserver(activities, repeats: repeats, order: order, handler)
    }
    func perform(_ modes: [String] = [DiffMode.default], _ block: @escaping @Sendable () -> Void) {
        perform(modes, block)
    }
    /// An observer of every activity that logs "<prefix>activity" into the trace.
    @discardableResult
    func traceActivities(
        _ trace: DiffTrace, _ mode: String = DiffMode.default, prefix: String = "", order: Int = 0
    ) -> any DiffObserver {
        let observer = makeObserver(DiffActivity.all, repeats: true, order: order) { _, activity in
            trace(prefix + DiffActivity.name(activity))
        }
        add(observer, mode)
        return observer
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
    func keepAlive(_ mode: String = DiffMode.default) -> any DiffSource {
        let source = makeSource(order: 1000) {}
        add(source, mode)
        return source
    }
}

// MARK: - CoreFoundation driver

func cfhString(_ string: String) -> CFString {
    CFStringCreateWithCString(nil, string, CFStringBuiltInEncodings.UTF8.rawValue)
}
func cfhSwiftString(_ string: CFString) -> String {
    let length = CFStringGetLength(string)
    let max = CFStringGetMaximumSizeForEncoding(length, CFStringBuiltInEncodings.UTF8.rawValue) + 1
    var buffer = [CChar](repeating: 0, count: max)
    guard CFStringGetCString(string, &buffer, max, CFStringBuiltInEncodings.UTF8.rawValue) else { return "?" }
    let bytes = buffer.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }
    return String(decoding: bytes, as: UTF8.self)
}
func cfhMode(_ name: String) -> CFRunLoopMode {
    switch name {
    case DiffMode.default: kCFRunLoopDefaultMode
    case DiffMode.common: kCFRunLoopCommonModes
    default: cfhString(name)
    }
}

private final class CFSource0Box {
    let perform: @Sendable () -> Void
    init(_ perform: @escaping @Sendable () -> Void) { self.perform = perform }
}

/// A CF version-0 source whose perform callback calls a Swift closure
/// (reached through the context's `info` pointer, owned by the source).
final class CFSource0: DiffSource, @unchecked Sendable {
    let source: CFRunLoopSource
    init(order: Int, perform: @escaping @Sendable () -> Void) {
        var context = CFRunLoopSourceContext()
        context.version = 0
        context.info = Unmanaged.passRetained(CFSource0Box(perform)).toOpaque()
        context.release = { info in Unmanaged<CFSource0Box>.fromOpaque(info!).release() }
        context.perform = { info in Unmanaged<CFSource0Box>.fromOpaque(info!).takeUnretainedValue().perform() }
        source = CFRunLoopSourceCreate(kCFAllocatorDefault, order, &context)
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
    func setFireDate(_ seconds: Double) { CFRunLoopTimerSetNextFireDate(timer, epoch + seconds) }
    var fireDate: Double { CFRunLoopTimerGetNextFireDate(timer) - epoch }
}

final class CFDiffObserver: DiffObserver, @unchecked Sendable {
    var observer: CFRunLoopObserver!
    func invalidate() { CFRunLoopObserverInvalidate(observer) }
    var isValid: Bool { CFRunLoopObserverIsValid(observer) }
}

final class CFLoopDriver: LoopDriver, @unchecked Sendable {
    let runLoop: CFRunLoop
    let epoch: CFAbsoluteTime
    var kind: String { "CF" }
    init() {
        runLoop = CFRunLoopGetCurrent()
        epoch = CFAbsoluteTimeGetCurrent()
    }
    func now() -> Double { CFAbsoluteTimeGetCurrent() - epoch }
    func run(_ mode: String, _ seconds: Double, returnAfterSourceHandled: Bool) -> String {
        precondition(CFRunLoopGetCurrent() === runLoop)
        let result = CFRunLoopRunInMode(cfhMode(mode), seconds, returnAfterSourceHandled)
        switch result.rawValue {
        case 1: return "finished"
        case 2: return "stopped"
        case 3: return "timedOut"
        case 4: return "handledSource"
        default: return "result(\(result.rawValue))"
        }
    }
    func runUntilStoppedOrFinished() { CFRunLoopRun() }
    func sibling() -> any LoopDriver { CFLoopDriver() }
    func acceptInput(_ mode: String, _ seconds: Double) {
        Foundation.RunLoop.current.acceptInput(forMode: mode, before: Date(timeIntervalSinceNow: seconds))
    }
    func nextTimerFireDate(_ mode: String) -> Double? {
        let date = CFRunLoopGetNextTimerFireDate(runLoop, cfhMode(mode))
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
        let modes = CFRunLoopCopyAllModes(runLoop)!
        return (0..<CFArrayGetCount(modes)).map { index in
            cfhSwiftString(Unmanaged<CFString>.fromOpaque(CFArrayGetValueAtIndex(modes, index)!).takeUnretainedValue())
        }.sorted()
    }
    func makeSource(order: Int, _ perform: @escaping @Sendable () -> Void) -> any DiffSource {
        CFSource0(order: order, perform: perform)
    }
    func add(_ source: any DiffSource, _ mode: String) {
        CFRunLoopAddSource(runLoop, (source as! CFSource0).source, cfhMode(mode))
    }
    func remove(_ source: any DiffSource, _ mode: String) {
        CFRunLoopRemoveSource(runLoop, (source as! CFSource0).source, cfhMode(mode))
    }
    func makeTimer(
        fireAt: Double, interval: Double, tolerance: Double, order: Int,
        _ handler: @escaping @Sendable (any DiffTimer) -> Void
    ) -> any DiffTimer {
        let handle = CFDiffTimer(epoch: epoch)
        // The handler gets a fresh view of the timer it is passed, not `handle`: capturing `handle` (which
        // holds the timer) would make a reference cycle that leaks every timer.
        let epoch = self.epoch
        handle.timer = CFRunLoopTimerCreateWithHandler(kCFAllocatorDefault, epoch + fireAt, interval, 0, order) {
            timer in
            let view = CFDiffTimer(epoch: epoch)
            view.timer = timer
            handler(view)
        }
        if tolerance > 0 { CFRunLoopTimerSetTolerance(handle.timer, tolerance) }
        return handle
    }
    func add(_ timer: any DiffTimer, _ mode: String) {
        CFRunLoopAddTimer(runLoop, (timer as! CFDiffTimer).timer, cfhMode(mode))
    }
    func remove(_ timer: any DiffTimer, _ mode: String) {
        CFRunLoopRemoveTimer(runLoop, (timer as! CFDiffTimer).timer, cfhMode(mode))
    }
    func makeObserver(
        _ activities: UInt, repeats: Bool, order: Int,
        _ handler: @escaping @Sendable (any DiffObserver, UInt) -> Void
    ) -> any DiffObserver {
        let handle = CFDiffObserver()
        handle.observer = CFRunLoopObserverCreateWithHandler(
            kCFAllocatorDefault, CFOptionFlags(activities), repeats, order
        ) { observer, activity in
            let view = CFDiffObserver()  // a fresh view, not `handle` (see makeTimer)
            view.observer = observer
            handler(view, UInt(activity.rawValue))
        }
        return handle
    }
    func add(_ observer: any DiffObserver, _ mode: String) {
        CFRunLoopAddObserver(runLoop, (observer as! CFDiffObserver).observer, cfhMode(mode))
    }
    func remove(_ observer: any DiffObserver, _ mode: String) {
        CFRunLoopRemoveObserver(runLoop, (observer as! CFDiffObserver).observer, cfhMode(mode))
    }
    func contains(_ source: any DiffSource, _ mode: String) -> Bool {
        CFRunLoopContainsSource(runLoop, (source as! CFSource0).source, cfhMode(mode))
    }
    func contains(_ timer: any DiffTimer, _ mode: String) -> Bool {
        CFRunLoopContainsTimer(runLoop, (timer as! CFDiffTimer).timer, cfhMode(mode))
    }
    func contains(_ observer: any DiffObserver, _ mode: String) -> Bool {
        CFRunLoopContainsObserver(runLoop, (observer as! CFDiffObserver).observer, cfhMode(mode))
    }
    func perform(_ modes: [String], _ block: @escaping @Sendable () -> Void) {
        if modes.count == 1 {
            CFRunLoopPerformBlock(runLoop, cfhMode(modes[0]) as CFTypeRef, block)
        } else {
            let strings = modes.map { cfhMode($0) }
            var pointers: [UnsafeRawPointer?] = strings.map {
                UnsafeRawPointer(Unmanaged.passUnretained($0).toOpaque())
            }
            var callbacks = kCFTypeArrayCallBacks
            let modeArray = withExtendedLifetime(strings) {
                CFArrayCreate(kCFAllocatorDefault, &pointers, pointers.count, &callbacks)!
            }
            CFRunLoopPerformBlock(runLoop, modeArray, block)
        }
    }
    func stop() { CFRunLoopStop(runLoop) }
    func wakeUp() { CFRunLoopWakeUp(runLoop) }
    var currentMode: String? { CFRunLoopCopyCurrentMode(runLoop).map(cfhSwiftString) }
    func addCommonMode(_ mode: String) { CFRunLoopAddCommonMode(runLoop, cfhMode(mode)) }
    var isWaiting: Bool { CFRunLoopIsWaiting(runLoop) }
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
        let trace = DiffTrace()
        let driver = make()
        scenario(driver, trace)
        return trace.lines
    } ?? ["<scenario did not finish within 10 s>"]
}
