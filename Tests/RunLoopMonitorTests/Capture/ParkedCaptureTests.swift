import CRunLoopKit
import CRunLoopMonitor
import Foundation
import Glibc
import SharedTestSupport
import RunLoopKit
@testable import RunLoopMonitor
import Synchronization
import Testing

/// Sleeps in glibc's usleep (clock_nanosleep below it) for `microseconds`; returns usleep's
/// result and errno, so a caller can tell an interrupted sleep (-1, EINTR).
@inline(never)
func parkedTestUsleep(_ microseconds: UInt32) -> (result: Int32, errno: Int32) {
    let result = usleep(microseconds)
    return (result, errno)
}

/// Blocks in poll(2) on `fd` until it is readable; returns poll's result and errno.
@inline(never)
func parkedTestPoll(_ fd: Int32) -> (result: Int32, errno: Int32) {
    var entry = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
    let result = poll(&entry, 1, -1)
    return (result, errno)
}

/// Blocks in read(2) on `fd` until a byte arrives.
@inline(never)
func parkedTestRead(_ fd: Int32) -> (result: Int, errno: Int32) {
    var byte: UInt8 = 0
    let result = read(fd, &byte, 1)
    return (result, errno)
}

/// Blocks in epoll_wait(2) on `fd` until it is readable.
@inline(never)
func parkedTestEpollWait(_ fd: Int32) -> (result: Int32, errno: Int32) {
    let epoll = epoll_create1(Int32(EPOLL_CLOEXEC))
    defer { close(epoll) }
    var event = epoll_event()
    event.events = UInt32(EPOLLIN.rawValue)
    epoll_ctl(epoll, EPOLL_CTL_ADD, fd, &event)
    var ready = epoll_event()
    let result = epoll_wait(epoll, &ready, 1, -1)
    return (result, errno)
}

/// Threads blocked in the kernel are read where they are parked, never signalled: their sleeps
/// and waits end when they would have without the capture.
@Suite(.serialized, .exclusive(.monitor)) struct ParkedCaptureTests {
/// Waits until thread `tid` is parked in the kernel (its syscall file no longer reads
/// `running`).
func waitUntilParked(_ tid: Int32) {
    let parked = waitUntil { !(ProcessThreads.blockedCall(of: tid) ?? "running").hasPrefix("running") }
    #expect(parked, "thread \(tid) never blocked in a system call")
}

@Test func aSleepingThreadIsReadWithoutASignalAndSleepsItsFullTime() throws {
    let outcome = Mutex<(Int32, Int32, Duration)?>(nil)
    let sleeper = NamedThread(name: "sleeper") {
        let start = ContinuousClock.now
        let (result, error) = parkedTestUsleep(500_000)
        outcome.locked { $0 = (result, error, ContinuousClock.now - start) }
    }
    waitUntilParked(sleeper.threadID)
    var stacks: [RawStack] = []
    // 40 samples 5 ms apart while it sleeps (what a 5 ms sample interval would take).
    for _ in 0..<40 {
        if let stack = try? ThreadStack.captureAddresses(threadID: sleeper.threadID) { stacks.append(stack) }
        usleep(5_000)
    }
    sleeper.join()
    let (result, error, slept) = try #require(outcome.locked { $0 })
    #expect(result == 0, "usleep returned \(result) errno \(error): a capture interrupted it")
    #expect(slept >= .milliseconds(495))
    let parked = stacks.filter { $0.unwinder == .parkedInKernel }
    #expect(parked.count >= 30, "\(stacks.map(\.unwinder))")
    let frames = ThreadStack.symbolicate(try #require(parked.first))
    #expect(frames.contains { $0.symbol?.contains("parkedTestUsleep") == true }, "\(frames.map(\.summary))")
    // Through libc's sleep frames to the closure that called it.
    #expect(frames.contains { $0.symbol?.contains("usleep") == true && $0.image.contains("libc") })
}

@Test(arguments: ["poll", "read", "epoll_wait"])
func aThreadWaitingForInputReturnsOnlyWhenItArrives(call: String) throws {
    var fds: [Int32] = [0, 0]
    #expect(pipe(&fds) == 0)
    defer { close(fds[0]); close(fds[1]) }
    let readEnd = fds[0]
    let outcome = Mutex<(Int, Int32)?>(nil)
    let waiter = NamedThread(name: "waiter") {
        let result: (Int, Int32) =
            switch call {
            case "poll": { let r = parkedTestPoll(readEnd); return (Int(r.result), r.errno) }()
            case "read": parkedTestRead(readEnd)
            default: { let r = parkedTestEpollWait(readEnd); return (Int(r.result), r.errno) }()
            }
        outcome.locked { $0 = result }
    }
    waitUntilParked(waiter.threadID)
    var names: [String] = []
    for _ in 0..<20 {
        let stack = try ThreadStack.captureAddresses(threadID: waiter.threadID)
        #expect(stack.unwinder == .parkedInKernel)
        names = ThreadStack.symbolicate(stack).compactMap(\.symbol)
        usleep(2_000)
    }
    // Still waiting: nothing was written, and no capture ended its wait.
    #expect(outcome.locked { $0 } == nil)
    #expect(names.contains { $0.contains("parkedTest") }, "\(names)")
    var byte: UInt8 = 1
    #expect(write(fds[1], &byte, 1) == 1)
    waiter.join()
    let (result, error) = try #require(outcome.locked { $0 })
    #expect(result == 1, "\(call) returned \(result) errno \(error)")
}

/// A running thread is still signalled (a parked read needs it parked).
@Test func aRunningThreadIsSignalled() throws {
    let stop = Atomic<Bool>(false)
    let spinner = NamedThread(name: "spinner") {
        while !stop.load(ordering: .relaxed) { _ = monitorTestCrunch(until: .now + .milliseconds(5)) }
    }
    defer { stop.store(true, ordering: .relaxed); spinner.join() }
    while spinner.threadID == 0 { sched_yield() }
    var unwinders: Set<RawStack.Unwinder> = []
    for _ in 0..<10 { unwinders.insert(try ThreadStack.captureAddresses(threadID: spinner.threadID).unwinder) }
    #expect(!unwinders.contains(.parkedInKernel) || unwinders.count > 1)
}
}

/// Set by the test, read by its signal handler: the handler sleeps until it is cleared.
let parkedTestHandlerHolds = Atomic<Bool>(false)
let parkedTestHandlerEntered = Atomic<Bool>(false)

/// The signal handler's own function: sleeps while the test holds it.
@inline(never)
func parkedTestInHandler() {
    parkedTestHandlerEntered.store(true, ordering: .releasing)
    while parkedTestHandlerHolds.load(ordering: .acquiring) { usleep(20_000) }
}

/// Raises SIGUSR2 on its own thread: the handler runs inside this call.
@inline(never)
func parkedTestRaise() {
    pthread_kill(pthread_self(), SIGUSR2)
}

extension ParkedCaptureTests {
    /// A thread inside its own signal handler (blocked there) is walked through glibc's signal
    /// trampoline to the function the signal interrupted, not only to the trampoline.
    @Test func aThreadInItsOwnSignalHandlerIsWalkedPastTheTrampoline() throws {
        parkedTestHandlerHolds.store(true, ordering: .releasing)
        parkedTestHandlerEntered.store(false, ordering: .releasing)
        signal(SIGUSR2) { _ in parkedTestInHandler() }
        defer { signal(SIGUSR2, SIG_DFL) }
        let thread = NamedThread(name: "in-handler") {
            var set = sigset_t()
            sigemptyset(&set)
            sigaddset(&set, SIGUSR2)
            pthread_sigmask(SIG_UNBLOCK, &set, nil)
            parkedTestRaise()
        }
        while !parkedTestHandlerEntered.load(ordering: .acquiring) { usleep(200) }
        // The handler wakes every 20 ms; a capture that finds it running between two sleeps is
        // signalled instead (a walk from our own handler, not the parked walk this is about), so
        // capture until one reads it parked.
        var stack = RawStack(addresses: [], unwinder: .parkedInKernel)
        for _ in 0..<50 {
            waitUntilParked(thread.threadID)
            stack = try ThreadStack.captureAddresses(threadID: thread.threadID)
            if stack.unwinder == .parkedInKernel { break }
        }
        parkedTestHandlerHolds.store(false, ordering: .releasing)
        #expect(stack.unwinder == .parkedInKernel)
        thread.join()
        let names = ThreadStack.symbolicate(stack).map { $0.symbol ?? $0.summary }
        #expect(names.contains { $0.contains("parkedTestInHandler") }, "\(names)")
        // glibc's trampoline, __restore_rt, is a local symbol: named after the nearest exported
        // one, or, when the symbolicator has no name for it, as libc's image and offset (seen in
        // the full suite after other tests symbolicated libc first).
        #expect(
            names.contains { $0.contains("__restore_rt") || $0 == "sigaction" || $0.hasPrefix("libc.so.6+") },
            "\(names)")
        #expect(names.contains { $0.contains("parkedTestRaise") }, "past the trampoline: \(names)")
        #expect(names.contains { $0.contains("NamedThread") }, "to the thread's entry: \(names)")
    }
}
