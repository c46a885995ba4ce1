import CoreFoundation
import CRunLoopKit
import Foundation
import Glibc
import RunLoopKit
import SharedTestSupport
import Testing

import class RunLoopKit.RunLoop

// Differential tests for version-1 sources (issue 4): the same scenario on CoreFoundation's
// CFRunLoop with a CF version-1 source (`CFRunLoopSourceContext1`) and on RunLoopKit with a
// `FileDescriptorSource`, both on an eventfd, each on a fresh thread with a fresh loop; the traces
// are compared (same harness as DifferentialTests.swift: `LoopDriver`, `DiffTrace`,
// `TestThread`).
//
// How CF's Source1 works on Linux (swift-corelibs-foundation's CFRunLoop.c, and checked with a
// probe on this machine before these tests were written):
// - `__CFPort` is an `int`. `getPort` returns a descriptor, which `CFRunLoopAddSource` inserts in
//   the mode's port set, an epoll instance (one per mode), with `EPOLLIN | EPOLLET`
//   (edge-triggered). The loop's wakeup port (an eventfd) and the mode's timer port (a timerfd)
//   are in the same set. On Linux the version-1 `perform` callback is `void (*)(void *info)`.
// - The loop sleeps in `ppoll` on the mode's epoll fd, then takes ONE event (`epoll_wait` with
//   `maxevents` 1), and acknowledges it by reading 8 bytes from the woken descriptor BEFORE the
//   callout: the source's own read in its callout gets EAGAIN (probe: "perform read=-1 errno=11").
//   So CF's Linux Source1 port must be an eventfd (or a timerfd): on a pipe CF swallows 8 bytes of
//   the data (probe: 12 bytes written, the callout found 4) — see `pipeDataIsNotConsumed_deviation`.
// - One Source1 per wakeup: with two ready ports, a run handles one; the other waits for the next
//   iteration (another beforeWaiting/afterWaiting). The choice follows epoll's ready list (the port
//   written first), not the sources' `order` — see `severalReadySource1s_deviation`.
// - An edge-triggered registration of a port that is already readable still reports it (a port
//   written before `CFRunLoopAddSource` fires), and a port written while its mode is not running
//   is remembered by that mode's epoll set until the mode runs (scenario d).
// - Only signalled Source0s (or a zero timeout) make CF poll without the sleep notifications: a
//   Source1 that is already ready when a run with a timeout starts still gets beforeWaiting and
//   afterWaiting around it (scenario `readySource1StillNotifiesSleep`). In a timeout-0 run CF
//   polls the port set and handles a ready Source1 with no sleep notifications.
// - `__CFRunLoopModeIsEmpty` counts Source1s: a mode with only a Source1 is not empty.
// - A handled Source1 sets `sourceHandledThisLoop`: with returnAfterSourceHandled the run
//   returns kCFRunLoopRunHandledSource.
//
// What Linux CF cannot show: the Darwin version-1 callout's Mach message and reply (on Linux
// `perform` gets only `info`; there is no message to compare), and an `order` among Source1s that
// matters (CF on Linux takes whichever port epoll reports first). Everything (a)–(e) asks for
// does reproduce on Linux CF and is compared below.
//
// The RunLoopKit side reads the eventfd (8 bytes) in its handler before calling the scenario's
// callout: that is what CF does before its callout, and a level-triggered FileDescriptorSource
// would otherwise be called again on every pass while the eventfd stays readable.

// MARK: - Source1 on both implementations

/// A version-1 source on a descriptor, CF's or RunLoopKit's.
protocol DiffSource1: AnyObject, Sendable {
    func invalidate()
    var isValid: Bool { get }
}

/// A `LoopDriver` that can also make version-1 sources.
protocol Source1Driver: LoopDriver {
    /// A version-1 source on `descriptor`. `perform` is the callout. `acknowledges`: the
    /// RunLoopKit side reads 8 bytes (an eventfd's counter) before `perform`, as CF's wait does;
    /// without it `perform` must consume the input itself. CF always reads the 8 bytes.
    func makeSource1(
        descriptor: Int32, order: Int, acknowledges: Bool, _ perform: @escaping @Sendable () -> Void
    ) -> any DiffSource1
    func addSource1(_ source: any DiffSource1, _ mode: String)
    func removeSource1(_ source: any DiffSource1, _ mode: String)
}

extension Source1Driver {
    func makeSource1(
        descriptor: Int32, order: Int = 0, acknowledges: Bool = true, _ perform: @escaping @Sendable () -> Void
    ) -> any DiffSource1 {
        makeSource1(descriptor: descriptor, order: order, acknowledges: acknowledges, perform)
    }
}

private final class CFSource1Box {
    let descriptor: Int32
    let perform: @Sendable () -> Void
    init(descriptor: Int32, perform: @escaping @Sendable () -> Void) {
        self.descriptor = descriptor
        self.perform = perform
    }
}

/// A CF version-1 source whose port is `descriptor`; its perform callback reaches a Swift closure
/// through the context's `info` pointer (owned by the source, released by CF).
final class CFSource1: DiffSource1, @unchecked Sendable {
    // @unchecked: `source` is a let of an immutable reference; CFRunLoopSource is thread-safe
    // (CF locks it for invalidate/isValid), as CF documents for run-loop sources.
    let source: CFRunLoopSource

    init(descriptor: Int32, order: Int, perform: @escaping @Sendable () -> Void) {
        var context = CFRunLoopSourceContext1()
        context.version = 1
        context.info = Unmanaged.passRetained(CFSource1Box(descriptor: descriptor, perform: perform)).toOpaque()
        context.release = { info in Unmanaged<CFSource1Box>.fromOpaque(info!).release() }
        context.getPort = { info in Unmanaged<CFSource1Box>.fromOpaque(info!).takeUnretainedValue().descriptor }
        context.perform = { info in Unmanaged<CFSource1Box>.fromOpaque(info!).takeUnretainedValue().perform() }
        // CFRunLoopSourceCreate takes a version-0 context pointer and reads it by its `version`
        // field. The version-1 context is smaller, so it goes into storage big enough for both;
        // Swift never reads that memory as the version-0 type (only CF does, as C).
        let size = max(MemoryLayout<CFRunLoopSourceContext>.size, MemoryLayout<CFRunLoopSourceContext1>.size)
        let alignment = max(
            MemoryLayout<CFRunLoopSourceContext>.alignment, MemoryLayout<CFRunLoopSourceContext1>.alignment)
        let storage = UnsafeMutableRawPointer.allocate(byteCount: size, alignment: alignment)
        defer { storage.deallocate() }
        storage.initializeMemory(as: UInt8.self, repeating: 0, count: size)
        storage.storeBytes(of: context, as: CFRunLoopSourceContext1.self)
        source = CFRunLoopSourceCreate(
            kCFAllocatorDefault, order, storage.assumingMemoryBound(to: CFRunLoopSourceContext.self))
    }

    func invalidate() { CFRunLoopSourceInvalidate(source) }
    var isValid: Bool { CFRunLoopSourceIsValid(source) }
}

extension CFLoopDriver: Source1Driver {
    func makeSource1(
        descriptor: Int32, order: Int, acknowledges: Bool, _ perform: @escaping @Sendable () -> Void
    ) -> any DiffSource1 {
        CFSource1(descriptor: descriptor, order: order, perform: perform)
    }
    func addSource1(_ source: any DiffSource1, _ mode: String) {
        CFRunLoopAddSource(runLoop, (source as! CFSource1).source, cfhMode(mode))
    }
    func removeSource1(_ source: any DiffSource1, _ mode: String) {
        CFRunLoopRemoveSource(runLoop, (source as! CFSource1).source, cfhMode(mode))
    }
}

/// RunLoopKit's side: a `FileDescriptorSource` watching `.readable`. If the descriptor is
/// rejected, the source is nil and reports itself invalid (scenarios trace `isValid` first, so
/// the traces then differ from CF's and the test fails, naming the error).
final class RLKSource1: DiffSource1 {
    let source: FileDescriptorSource?
    let failure: String?

    init(descriptor: Int32, order: Int, acknowledges: Bool, perform: @escaping @Sendable () -> Void) {
        do {
            source = try FileDescriptorSource(descriptor: descriptor, watching: .readable, order: order) { _, _ in
                if acknowledges {
                    var counter: UInt64 = 0
                    _ = read(descriptor, &counter, 8)
                }
                perform()
            }
            failure = nil
        } catch {
            source = nil
            failure = "FileDescriptorSource rejected descriptor \(descriptor): \(error)"
        }
    }

    func invalidate() { source?.invalidate() }
    var isValid: Bool { source?.isValid ?? false }
}

extension RLKLoopDriver: Source1Driver {
    func makeSource1(
        descriptor: Int32, order: Int, acknowledges: Bool, _ perform: @escaping @Sendable () -> Void
    ) -> any DiffSource1 {
        RLKSource1(descriptor: descriptor, order: order, acknowledges: acknowledges, perform: perform)
    }
    func addSource1(_ source: any DiffSource1, _ mode: String) {
        guard let source = (source as! RLKSource1).source else { return }
        loop.add(source, forMode: RunLoop.Mode(rawValue: mode))
    }
    func removeSource1(_ source: any DiffSource1, _ mode: String) {
        guard let source = (source as! RLKSource1).source else { return }
        loop.remove(source, forMode: RunLoop.Mode(rawValue: mode))
    }
}

// MARK: - Descriptors

/// A fresh non-blocking eventfd (what CF itself uses for ports on Linux).
func s1EventFD() -> Int32 {
    let fd = eventfd(0, Int32(EFD_CLOEXEC) | Int32(EFD_NONBLOCK))
    precondition(fd >= 0, "eventfd failed: errno \(errno)")
    return fd
}

/// Adds one to an eventfd's counter: the descriptor becomes readable.
func s1Signal(_ fd: Int32) {
    var one: UInt64 = 1
    let written = write(fd, &one, 8)
    precondition(written == 8, "eventfd write failed: errno \(errno)")
}

/// A fresh pipe, both ends non-blocking and close-on-exec.
func s1Pipe() -> (read: Int32, write: Int32) {
    var fds: [Int32] = [-1, -1]
    precondition(pipe(&fds) == 0, "pipe failed: errno \(errno)")
    for fd in fds {
        _ = fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK)
        _ = fcntl(fd, F_SETFD, FD_CLOEXEC)
    }
    return (fds[0], fds[1])
}

// MARK: - Scenarios

typealias Source1Scenario = @Sendable (any Source1Driver, DiffTrace) -> Void

enum Source1Scenarios {
    // (a) Writing the eventfd from another thread wakes a sleeping loop and the callout runs.
    // The helper writes only once it sees the loop waiting, so the loop is asleep when the write
    // lands. Bound: the run's timeout is 5 s; waking counts if it returned within 4 s (a wakeup
    // takes micro- to milliseconds; the room is for a loaded machine).
    static let wakesSleepingLoop: Source1Scenario = { loop, trace in
        let fd = s1EventFD()
        defer { close(fd) }
        let source = loop.makeSource1(descriptor: fd) {
            trace("source1")
            loop.stop()
        }
        trace("valid: \(source.isValid)")
        loop.addSource1(source, DiffMode.default)
        let helper = loop.whenAsleep(trace: trace, timeout: .seconds(5)) {
            trace("helper: write")
            s1Signal(fd)
        }
        let start = loop.now()
        trace("run: " + loop.run(DiffMode.default, 5))
        trace("woke before the timeout: \(loop.now() - start < 4)")
        helper.join(timeout: .seconds(5))
        source.invalidate()
    }

    // (b) The observer trace around it: afterWaiting precedes the Source1 callout, and the
    // callout comes before the iteration's exit checks (stop → exit).
    static let afterWaitingPrecedesCallout: Source1Scenario = { loop, trace in
        let fd = s1EventFD()
        defer { close(fd) }
        loop.traceActivities(trace)
        let source = loop.makeSource1(descriptor: fd) {
            trace("source1")
            loop.stop()
        }
        trace("valid: \(source.isValid)")
        loop.addSource1(source, DiffMode.default)
        let helper = loop.whenAsleep(trace: trace, timeout: .seconds(5)) { s1Signal(fd) }
        trace("run: " + loop.run(DiffMode.default, 5))
        helper.join(timeout: .seconds(5))
        source.invalidate()
    }

    // (c) returnAfterSourceHandled: a Source1 is a handled source, so the run returns
    // handledSource right after its callout (no stop needed).
    static let handledSourceAfterSource1: Source1Scenario = { loop, trace in
        let fd = s1EventFD()
        defer { close(fd) }
        loop.traceActivities(trace)
        let source = loop.makeSource1(descriptor: fd) { trace("source1") }
        trace("valid: \(source.isValid)")
        loop.addSource1(source, DiffMode.default)
        let helper = loop.whenAsleep(trace: trace, timeout: .seconds(5)) { s1Signal(fd) }
        trace("run: " + loop.run(DiffMode.default, 5, returnAfterSourceHandled: true))
        helper.join(timeout: .seconds(5))
        source.invalidate()
    }

    // (c) A Source1 that is ready before a timeout-0 run: the run polls, handles it without the
    // sleep notifications, and returns handledSource; the next timeout-0 run finds nothing.
    static let readySource1InTimeoutZeroRun: Source1Scenario = { loop, trace in
        let fd = s1EventFD()
        defer { close(fd) }
        loop.traceActivities(trace)
        let source = loop.makeSource1(descriptor: fd) { trace("source1") }
        trace("valid: \(source.isValid)")
        loop.addSource1(source, DiffMode.default)
        s1Signal(fd)
        trace("run 1: " + loop.run(DiffMode.default, 0, returnAfterSourceHandled: true))
        trace("run 2: " + loop.run(DiffMode.default, 0, returnAfterSourceHandled: true))
        source.invalidate()
    }

    // A Source1 already ready when a run with a timeout starts: the loop still goes through
    // beforeWaiting/afterWaiting (only a handled Source0 or a zero timeout skips them), and the
    // kernel wait returns at once.
    static let readySource1StillNotifiesSleep: Source1Scenario = { loop, trace in
        let fd = s1EventFD()
        defer { close(fd) }
        loop.traceActivities(trace)
        let source = loop.makeSource1(descriptor: fd) { trace("source1") }
        trace("valid: \(source.isValid)")
        s1Signal(fd)  // before the add: the registration must still report it
        loop.addSource1(source, DiffMode.default)
        let start = loop.now()
        trace("run: " + loop.run(DiffMode.default, 5, returnAfterSourceHandled: true))
        trace("returned before the timeout: \(loop.now() - start < 4)")
        source.invalidate()
    }

    // (d) A Source1 only in a private mode does not fire (nor wake the loop) while the loop runs
    // in .default, even when written during that run; it fires when the loop runs its mode.
    // Bound: the default run sleeps to its 150 ms timeout; "≥ 120 ms" leaves room for the clock.
    static let privateModeOnly: Source1Scenario = { loop, trace in
        let fd = s1EventFD()
        defer { close(fd) }
        loop.traceActivities(trace, DiffMode.default, prefix: "default ")
        loop.traceActivities(trace, DiffMode.my, prefix: "my ")
        let keep = loop.keepAlive(DiffMode.default)
        let source = loop.makeSource1(descriptor: fd) { trace("source1") }
        trace("valid: \(source.isValid)")
        loop.addSource1(source, DiffMode.my)
        let helper = loop.whenAsleep(trace: trace, timeout: .seconds(5)) { s1Signal(fd) }
        let start = loop.now()
        trace("run default: " + loop.run(DiffMode.default, 0.15, returnAfterSourceHandled: true))
        trace("default run slept to its timeout: \(loop.now() - start >= 0.12)")
        helper.join(timeout: .seconds(5))
        trace("run my: " + loop.run(DiffMode.my, 5, returnAfterSourceHandled: true))
        source.invalidate()
        keep.invalidate()
    }

    // (e) A mode whose only item is a Source1 is not empty: the run sleeps to its timeout
    // (≥ 40 of 50 ms) and returns timedOut, not finished. Removed, the mode is empty again.
    static let onlySource1IsNotEmpty: Source1Scenario = { loop, trace in
        let fd = s1EventFD()
        defer { close(fd) }
        loop.traceActivities(trace, DiffMode.my)
        let source = loop.makeSource1(descriptor: fd) { trace("source1") }
        trace("valid: \(source.isValid)")
        loop.addSource1(source, DiffMode.my)
        let start = loop.now()
        trace("run: " + loop.run(DiffMode.my, 0.05))
        trace("slept to the timeout: \(loop.now() - start >= 0.04)")
        loop.removeSource1(source, DiffMode.my)
        trace("run after remove: " + loop.run(DiffMode.my, 0.05))
        loop.addSource1(source, DiffMode.my)
        trace("run after re-add: " + loop.run(DiffMode.my, 0))
        source.invalidate()
        trace("run after invalidate: " + loop.run(DiffMode.my, 0.05))
    }

    // Two Source1s ready at once (A order 2, written first; B order 1), one timeout-0 run each.
    static let severalReadySource1s: Source1Scenario = { loop, trace in
        let a = s1EventFD()
        let b = s1EventFD()
        defer {
            close(a)
            close(b)
        }
        let sourceA = loop.makeSource1(descriptor: a, order: 2) { trace("source1 A") }
        let sourceB = loop.makeSource1(descriptor: b, order: 1) { trace("source1 B") }
        loop.addSource1(sourceA, DiffMode.default)
        loop.addSource1(sourceB, DiffMode.default)
        s1Signal(a)
        s1Signal(b)
        trace("run 1: " + loop.run(DiffMode.default, 0))
        trace("run 2: " + loop.run(DiffMode.default, 0))
        sourceA.invalidate()
        sourceB.invalidate()
    }

    // A pipe as the port, 12 bytes written: how many can the callout read?
    static let pipeData: Source1Scenario = { loop, trace in
        let (readEnd, writeEnd) = s1Pipe()
        defer {
            close(readEnd)
            close(writeEnd)
        }
        let source = loop.makeSource1(descriptor: readEnd, acknowledges: false) {
            var buffer = [UInt8](repeating: 0, count: 64)
            let count = read(readEnd, &buffer, buffer.count)
            trace("source1 read \(count) bytes")
        }
        trace("valid: \(source.isValid)")
        loop.addSource1(source, DiffMode.default)
        let message = Array("hello, world".utf8)
        _ = write(writeEnd, message, message.count)
        trace("run: " + loop.run(DiffMode.default, 5, returnAfterSourceHandled: true))
        source.invalidate()
    }
}

// MARK: - Tests

/// Runs `scenario` on a fresh thread with a fresh driver of one implementation; returns its trace.
func source1TraceOf(
    _ make: @escaping @Sendable () -> any Source1Driver, _ scenario: @escaping Source1Scenario
) -> [String] {
    TestThreads.runBlocking(name: "diff-scenario", timeout: .seconds(10), stackSize: 1 << 20) {
        let trace = DiffTrace()
        scenario(make(), trace)
        return trace.lines
    } ?? ["<scenario did not finish within 10 s>"]
}

func source1Traces(_ scenario: @escaping Source1Scenario) -> (cf: [String], rlk: [String]) {
    (source1TraceOf({ CFLoopDriver() }, scenario), source1TraceOf({ RLKLoopDriver() }, scenario))
}

/// The scenario must leave the same trace on CF and RunLoopKit, and CF's must be `expected`
/// (pinned, so that a change in either implementation shows which side moved).
func expectSameSource1Trace(
    _ scenario: @escaping Source1Scenario, _ expected: [String], sourceLocation: SourceLocation = #_sourceLocation
) {
    let (cf, rlk) = source1Traces(scenario)
    #expect(cf == expected, "CF's trace", sourceLocation: sourceLocation)
    #expect(rlk == cf, "RunLoopKit's trace against CF's", sourceLocation: sourceLocation)
}

/// Serialized like DifferentialTests: the scenarios sleep in the kernel for bounded times.
@Suite("Differential: Source1 (CFRunLoop vs RunLoopKit)", .serialized)
struct Source1DiffTests {
    /// (a) A write from another thread wakes the sleeping loop; the callout runs (and stops it).
    @Test func writeFromAnotherThreadWakesTheLoop() {
        expectSameSource1Trace(
            Source1Scenarios.wakesSleepingLoop,
            ["valid: true", "helper: write", "source1", "run: stopped", "woke before the timeout: true"])
    }

    /// (b) entry, beforeTimers, beforeSources, beforeWaiting, afterWaiting, the Source1 callout,
    /// exit.
    @Test func afterWaitingPrecedesTheSource1Callout() {
        expectSameSource1Trace(
            Source1Scenarios.afterWaitingPrecedesCallout,
            [
                "valid: true", "entry", "beforeTimers", "beforeSources", "beforeWaiting", "afterWaiting", "source1",
                "exit", "run: stopped",
            ])
    }

    /// (c) returnAfterSourceHandled: the run returns handledSource after a Source1.
    @Test func returnAfterSourceHandledAfterASource1() {
        expectSameSource1Trace(
            Source1Scenarios.handledSourceAfterSource1,
            [
                "valid: true", "entry", "beforeTimers", "beforeSources", "beforeWaiting", "afterWaiting", "source1",
                "exit", "run: handledSource",
            ])
    }

    /// (c) A ready Source1 in a timeout-0 run: handled without sleep notifications,
    /// handledSource; then nothing is left (timedOut).
    @Test func readySource1InATimeoutZeroRun() {
        expectSameSource1Trace(
            Source1Scenarios.readySource1InTimeoutZeroRun,
            [
                "valid: true",
                "entry", "beforeTimers", "beforeSources", "source1", "exit", "run 1: handledSource",
                "entry", "beforeTimers", "beforeSources", "exit", "run 2: timedOut",
            ])
    }

    /// A Source1 ready before the run (written even before it was added) still gets the sleep
    /// notifications around it in a run with a timeout; the wait returns at once.
    @Test func readySource1StillGetsTheSleepNotifications() {
        expectSameSource1Trace(
            Source1Scenarios.readySource1StillNotifiesSleep,
            [
                "valid: true", "entry", "beforeTimers", "beforeSources", "beforeWaiting", "afterWaiting", "source1",
                "exit", "run: handledSource", "returned before the timeout: true",
            ])
    }

    /// (d) Only in its private mode: a write while the loop runs .default neither wakes it nor
    /// fires the source (the default run sleeps to its timeout); the next run of the private
    /// mode handles it.
    @Test func source1InAPrivateModeFiresOnlyInThatMode() {
        expectSameSource1Trace(
            Source1Scenarios.privateModeOnly,
            [
                "valid: true",
                "default entry", "default beforeTimers", "default beforeSources", "default beforeWaiting",
                "default afterWaiting", "default exit", "run default: timedOut",
                "default run slept to its timeout: true",
                "my entry", "my beforeTimers", "my beforeSources", "my beforeWaiting", "my afterWaiting", "source1",
                "my exit", "run my: handledSource",
            ])
    }

    /// (e) A mode with only a Source1 is not empty (timedOut, not finished); removed or
    /// invalidated, it is empty again.
    @Test func aModeWithOnlyASource1IsNotEmpty() {
        expectSameSource1Trace(
            Source1Scenarios.onlySource1IsNotEmpty,
            [
                "valid: true",
                "entry", "beforeTimers", "beforeSources", "beforeWaiting", "afterWaiting", "exit", "run: timedOut",
                "slept to the timeout: true",
                "run after remove: finished",
                "entry", "beforeTimers", "beforeSources", "exit", "run after re-add: timedOut",
                "run after invalidate: finished",
            ])
    }

    /// Deviation: CF handles one Source1 per wakeup (`epoll_wait` with `maxevents` 1), chosen by
    /// the kernel's ready list (A, written first) and not by `order`; the other waits for the
    /// next run. RunLoopKit handles every ready Source1 in one pass, by ascending `order`
    /// (B, then A), as its documentation states.
    @Test func severalReadySource1s_deviation() {
        let (cf, rlk) = source1Traces(Source1Scenarios.severalReadySource1s)
        #expect(cf == ["source1 A", "run 1: timedOut", "source1 B", "run 2: timedOut"])
        #expect(rlk == ["source1 B", "source1 A", "run 1: timedOut", "run 2: timedOut"])
    }

    /// Deviation (CF on Linux is lossy): CF acknowledges a wakeup by reading 8 bytes from the
    /// port before the callout, so on a pipe it swallows 8 bytes of the data (12 written, the
    /// callout reads 4). A FileDescriptorSource leaves the descriptor to its handler: all 12.
    @Test func pipeDataIsNotConsumed_deviation() {
        let (cf, rlk) = source1Traces(Source1Scenarios.pipeData)
        #expect(cf == ["valid: true", "source1 read 4 bytes", "run: handledSource"])
        #expect(rlk == ["valid: true", "source1 read 12 bytes", "run: handledSource"])
    }
}
