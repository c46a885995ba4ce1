import CRunLoopMonitor
import Foundation
import Glibc
import SharedTestSupport
@testable import RunLoopMonitor
import Synchronization
import Testing

@Suite(.serialized, .exclusive(.monitor)) struct StackCaptureTests {
@Test func capturesItsOwnThread() throws {
    ThreadStack.prepareCurrentThread()
    let frames = try ThreadStack.capture(threadID: currentThreadID())
    #expect(symbols(frames).contains { $0.contains("capturesItsOwnThread") })
}

@Test func capturesAnotherThreadInTheFunctionItSpinsIn() throws {
    let stop = Atomic<Bool>(false)
    let spinning = Atomic<Bool>(false)
    let spinner = NamedThread(name: "spinner") {
        spinning.store(true, ordering: .releasing)
        while !stop.load(ordering: .relaxed) { _ = monitorTestCrunch(until: .now + .milliseconds(5)) }
    }
    defer { stop.store(true, ordering: .relaxed); spinner.join() }
    while !spinning.load(ordering: .acquiring) { sched_yield() }
    var frames = try ThreadStack.capture(threadID: spinner.threadID)
    // A capture can still land between two calls of the crunch (on a loaded machine the
    // spinner may be descheduled there), and under a sanitizer the signal arrives at the
    // next interceptor: try a few times. A capture that never names the crunch fails.
    for _ in 0..<20 where !symbols(frames).contains("monitorTestCrunch(until:)") {
        frames = try ThreadStack.capture(threadID: spinner.threadID)
    }
    #expect(symbols(frames).contains("monitorTestCrunch(until:)"), "\(frames.map(\.summary))")
    // Offline symbolication needs the image and offset of every frame.
    for frame in frames where frame.image.isEmpty == false {
        #expect(frame.address &- frame.imageOffset > 0)
    }
    #expect(frames.contains { $0.file?.hasSuffix("Support.swift") == true && $0.line != nil })
}

@Test func aMissingThreadIsAClearError() {
    #expect(throws: ThreadStackError.noSuchThread(threadID: 0x3fff_fff0)) {
        try ThreadStack.captureAddresses(threadID: 0x3fff_fff0)
    }
}

/// A running thread that blocks the capture signal: the capture gives up after its timeout
/// with an error that says so, does not hang, and leaves no signal of its own queued for the
/// thread (none is sent to a thread that blocks it, so nothing piles up against the user's
/// RLIMIT_SIGPENDING however often it is sampled).
@Test func aThreadThatBlocksTheSignalGivesAClearErrorAfterABoundedWaitAndNothingQueued() throws {
    let release = Atomic<Bool>(false)
    let blocked = Atomic<Bool>(false)
    let thread = NamedThread(name: "blocks-signal") {
        var set = sigset_t()
        sigemptyset(&set)
        sigaddset(&set, ThreadStack.signalNumber)
        pthread_sigmask(SIG_BLOCK, &set, nil)
        blocked.store(true, ordering: .releasing)
        // Running in user space: only a signal could read it.
        while !release.load(ordering: .relaxed) { _ = monitorTestCrunch(until: .now + .milliseconds(1)) }
    }
    defer { release.store(true, ordering: .relaxed); thread.join() }
    while !blocked.load(ordering: .acquiring) { sched_yield() }
    for _ in 0..<5 {
        let start = ContinuousClock.now
        #expect(throws: ThreadStackError.noAnswer(threadID: thread.threadID, waited: .milliseconds(100), signalBlocked: true)) {
            try ThreadStack.captureAddresses(threadID: thread.threadID, timeout: .milliseconds(100))
        }
        // 100 ms asked; the bound has room for a loaded machine, far from a hang.
        #expect(ContinuousClock.now - start < .seconds(3))
        var isBlocked = false
        var pending = true
        #expect(crlm_thread_signal_state(thread.threadID, ThreadStack.signalNumber, &isBlocked, &pending) == 0)
        #expect(isBlocked && !pending, "a failed capture left a signal queued")
    }
    // Later captures still work.
    ThreadStack.prepareCurrentThread()
    let frames = try ThreadStack.capture(threadID: currentThreadID())
    #expect(!frames.isEmpty)
}

/// 10,000 captures of a thread that allocates and frees in a tight loop: the handler never
/// touches the heap or a lock, so the target's malloc state is never corrupted and nothing
/// deadlocks (this runs under AddressSanitizer and ThreadSanitizer in CI too). Under ASan the
/// target is mostly inside the sanitizer's allocator, whose unwind tables are wrong at some
/// instructions (CFA = rsp+96 where it is rsp+88, after a `pop`): glibc's backtrace() crashed
/// there in about 1 run in 30; the bounded walk ends the stack early instead.
@Test func tenThousandCapturesOfAnAllocatingThread() throws {
    let stop = Atomic<Bool>(false)
    let allocations = Atomic<Int>(0)
    let target = NamedThread(name: "allocator") {
        var keep: [[UInt8]] = []
        while !stop.load(ordering: .relaxed) {
            keep.append([UInt8](repeating: 1, count: 64 + keep.count % 512))
            if keep.count > 64 { keep.removeFirst(32) }
            allocations.add(1, ordering: .relaxed)
        }
    }
    defer { stop.store(true, ordering: .relaxed); target.join() }
    var captured = 0
    var unwinders = Set<RawStack.Unwinder>()
    for _ in 0..<10_000 {
        let stack = try ThreadStack.captureAddresses(threadID: target.threadID, timeout: .seconds(5))
        if !stack.addresses.isEmpty { captured += 1 }
        unwinders.insert(stack.unwinder)
    }
    #expect(captured == 10_000)
    if ThreadStack.boundedUnwindAvailable { #expect(!unwinders.contains(.glibcBacktrace)) }
    #expect(allocations.load(ordering: .relaxed) > 0)
}

/// The handler restores errno: a thread that sets errno and checks it without a system call
/// between never sees it change, over 2,000 captures.
@Test func theHandlerPreservesErrno() throws {
    let stop = Atomic<Bool>(false)
    let changed = Atomic<Int>(0)
    let checks = Atomic<Int>(0)
    let target = NamedThread(name: "errno-check") {
        while !stop.load(ordering: .relaxed) {
            errno = 4242
            var x = 0
            for i in 0..<2000 { x &+= i }
            if errno != 4242 { changed.add(1, ordering: .relaxed) }
            checks.add(x & 1, ordering: .relaxed)
        }
    }
    defer { stop.store(true, ordering: .relaxed); target.join() }
    for _ in 0..<2000 { _ = try ThreadStack.captureAddresses(threadID: target.threadID, timeout: .seconds(5)) }
    #expect(changed.load(ordering: .relaxed) == 0)
}

@Test func symbolicationIsCachedPerAddress() throws {
    ThreadStack.prepareCurrentThread()
    let stack = try ThreadStack.captureAddresses(threadID: currentThreadID())
    let first = ThreadStack.symbolicate(stack)
    // A cached stack is a dictionary lookup per address; a cold one reads symbol tables. The
    // fastest of five lookups is timed, so one preemption on a loaded machine does not count.
    var fastest = Duration.seconds(1)
    for _ in 0..<5 {
        let start = ContinuousClock.now
        let again = ThreadStack.symbolicate(stack)
        fastest = min(fastest, ContinuousClock.now - start)
        #expect(first == again)
    }
    #expect(fastest < .milliseconds(50))
}

/// A thread registered with its stack bounds, in a build that keeps frame pointers (debug),
/// may be unwound by the frame-pointer walk; either way its stack names the function.
@Test func framePointerFastPathOnARegisteredThread() throws {
    try ThreadStack.install()
    let stop = Atomic<Bool>(false)
    let calls = Atomic<Int>(0)
    let spinner = NamedThread(name: "fp-spinner") {
        ThreadStack.prepareCurrentThread()
        defer { ThreadStack.forgetCurrentThread() }
        while !stop.load(ordering: .relaxed) {
            _ = monitorTestCrunch(until: .now + .milliseconds(1))
            calls.add(1, ordering: .releasing)
        }
    }
    defer { stop.store(true, ordering: .relaxed); spinner.join() }
    var unwinders = Set<RawStack.Unwinder>()
    var named = 0
    var unnamed: [String] = []
    for _ in 0..<50 {
        // Each sample after the spinner has run on (see awaitProgress).
        awaitProgress(calls)
        let stack = try ThreadStack.captureAddresses(threadID: spinner.threadID)
        unwinders.insert(stack.unwinder)
        let names = symbols(ThreadStack.symbolicate(stack))
        if names.contains("monitorTestCrunch(until:)") { named += 1 } else { unnamed.append("\(stack.unwinder): \(names.prefix(6))") }
    }
    // Every sample is inside the function but the odd one, taken between two calls. Under a sanitizer, whose runtime delivers signals only at its interceptors
    // (often the clock read in the caller's loop), some sample is.
    #expect(sanitized ? named > 0 : named >= 45, "\(unnamed)")
    if ThreadStack.framePointersUsable { #expect(unwinders.contains(.framePointers)) }
}
}
