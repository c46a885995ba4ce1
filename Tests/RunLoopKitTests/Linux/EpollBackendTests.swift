import CRunLoopKit
import Glibc
import SystemPackage
import Testing

@testable import RunLoopKit

// The Linux backend alone (Sources/RunLoopKit/Linux/EpollBackend.swift): one epoll set per mode,
// the eventfd other threads write, the timerfd the loop arms, a caller's descriptors and the
// outcomes of watching them. No loop: each test owns a backend on its own thread (a backend's
// wait belongs to the thread that made it).
@Suite struct EpollBackendTests {
    /// A backend owned by the calling thread, closed after `body`.
    private func withBackend(_ body: (EpollBackend) throws -> Void) throws {
        let backend = try EpollBackend(ownerTID: crlk_gettid())
        defer { backend.close() }
        try body(backend)
    }

    private func pipeEnds() -> (read: Int32, write: Int32) {
        var fds: [Int32] = [-1, -1]
        #expect(pipe(&fds) == 0)
        for fd in fds { _ = fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK) }
        return (fds[0], fds[1])
    }

    @Test func aPollOfAnIdleSetFindsNothing() throws {
        try withBackend { backend in
            var ready = ContiguousArray<EpollBackend.Ready>()
            let outcome = backend.wait(in: backend.baseSet, blocking: false, into: &ready)
            #expect(ready.isEmpty)
            #expect(!outcome.wokenByAnotherThread && !outcome.timerExpired)
            #expect(!backend.hasReadyDescriptor(in: backend.baseSet))
        }
    }

    /// Many signals before a wait are one wakeup, drained by that wait: the next poll is quiet.
    @Test(arguments: [1, 2, 1_000])
    func signalsCoalesceIntoOneWakeUp(signals: Int) throws {
        try withBackend { backend in
            for _ in 0..<signals { backend.signal() }
            var ready = ContiguousArray<EpollBackend.Ready>()
            #expect(backend.wait(in: backend.baseSet, blocking: true, into: &ready).wokenByAnotherThread)
            #expect(!backend.wait(in: backend.baseSet, blocking: false, into: &ready).wokenByAnotherThread)
            // The eventfd is not a caller's descriptor: it is never reported as one.
            #expect(ready.isEmpty && !backend.hasReadyDescriptor(in: backend.baseSet))
        }
    }

    /// The timerfd, armed for an absolute boot-time deadline: a past deadline expires at once, a
    /// disarmed timer never, and an expiry is reported once.
    @Test(arguments: [(-1_000_000, true), (Int64?.none, false)] as [(Int64?, Bool)])
    func theTimerExpiresOnlyWhenArmed(offsetNs: Int64?, expires: Bool) throws {
        try withBackend { backend in
            try backend.arm(deadlineNs: offsetNs.map { crlk_boottime_ns() + $0 })
            var ready = ContiguousArray<EpollBackend.Ready>()
            #expect(backend.wait(in: backend.baseSet, blocking: false, into: &ready).timerExpired == expires)
            #expect(!backend.wait(in: backend.baseSet, blocking: false, into: &ready).timerExpired)
        }
    }

    @Test func aBlockingWaitEndsAtTheArmedDeadline() throws {
        try withBackend { backend in
            let start = crlk_boottime_ns()
            try backend.arm(deadlineNs: start + 20_000_000)
            var ready = ContiguousArray<EpollBackend.Ready>()
            let outcome = backend.wait(in: backend.baseSet, blocking: true, into: &ready)
            #expect(outcome.timerExpired)
            // Never early; late by the scheduler's latency at most (room for a loaded machine).
            let elapsed = crlk_boottime_ns() - start
            #expect(elapsed >= 20_000_000 && elapsed < 5_000_000_000)
        }
    }

    /// A caller's descriptor is reported with its tag, in its own set only, and a change of
    /// interest or an unwatch takes effect at the next wait.
    @Test func aCallersDescriptorIsReportedWithItsTagInItsSetOnly() throws {
        try withBackend { backend in
            let (readEnd, writeEnd) = pipeEnds()
            defer { close(readEnd); close(writeEnd) }
            let set = try backend.makeSet()
            defer { backend.closeSet(set) }
            let tag = EpollBackend.firstCallerTag + 7
            #expect(backend.watch(readEnd, for: .readable, tag: tag, in: set) == .watching)
            #expect(!backend.hasReadyDescriptor(in: set))
            #expect(write(writeEnd, "x", 1) == 1)
            var ready = ContiguousArray<EpollBackend.Ready>()
            _ = backend.wait(in: set, blocking: false, into: &ready)
            #expect(ready.count == 1 && ready.first?.tag == tag && ready.first?.events.contains(.readable) == true)
            // Level-triggered: still ready, and not in the base set.
            #expect(backend.hasReadyDescriptor(in: set))
            #expect(!backend.hasReadyDescriptor(in: backend.baseSet))
            // Watched for nothing but errors and hang-ups: quiet.
            #expect(backend.changeInterest(readEnd, to: [], tag: tag, in: set) == .watching)
            #expect(!backend.hasReadyDescriptor(in: set))
            #expect(backend.changeInterest(readEnd, to: .readable, tag: tag, in: set) == .watching)
            #expect(backend.unwatch(readEnd, in: set))
            #expect(!backend.hasReadyDescriptor(in: set))
            // The wakeup still reaches a mode's own set.
            backend.signal()
            #expect(backend.wait(in: set, blocking: true, into: &ready).wokenByAnotherThread)
        }
    }

    /// Watching the same descriptor twice takes the registration over (a new tag).
    @Test func watchingTwiceTakesTheRegistrationOver() throws {
        try withBackend { backend in
            let (readEnd, writeEnd) = pipeEnds()
            defer { close(readEnd); close(writeEnd) }
            let first = EpollBackend.firstCallerTag
            #expect(backend.watch(readEnd, for: .readable, tag: first, in: backend.baseSet) == .watching)
            #expect(backend.watch(readEnd, for: .readable, tag: first + 1, in: backend.baseSet) == .watching)
            #expect(write(writeEnd, "x", 1) == 1)
            var ready = ContiguousArray<EpollBackend.Ready>()
            _ = backend.wait(in: backend.baseSet, blocking: false, into: &ready)
            #expect(ready.map(\.tag) == [first + 1])
            #expect(backend.unwatch(readEnd, in: backend.baseSet))
        }
    }

    /// What watching a descriptor that cannot be watched comes to: an outcome, never a crash.
    @Test func descriptorsThatCannotBeWatchedAreOutcomes() throws {
        try withBackend { backend in
            let (readEnd, writeEnd) = pipeEnds()
            close(readEnd)
            close(writeEnd)
            let tag = EpollBackend.firstCallerTag
            #expect(backend.watch(readEnd, for: .readable, tag: tag, in: backend.baseSet) == .closed)
            #expect(backend.changeInterest(readEnd, to: .readable, tag: tag, in: backend.baseSet) == .closed)
            #expect(!backend.unwatch(readEnd, in: backend.baseSet))
            // A regular file has no readiness to report: epoll refuses it (EPERM).
            let file = open("/proc/self/status", O_RDONLY | O_CLOEXEC)
            defer { close(file) }
            #expect(backend.watch(file, for: .readable, tag: tag, in: backend.baseSet) == .failed(.notPermitted))
            #expect(throws: Errno.notPermitted) { try EpollBackend.checkWatchable(file) }
        }
    }

    /// A hang-up is reported even when the descriptor is watched for nothing.
    @Test func aHangUpIsReportedWithoutBeingAskedFor() throws {
        try withBackend { backend in
            let (readEnd, writeEnd) = pipeEnds()
            defer { close(readEnd) }
            let tag = EpollBackend.firstCallerTag
            #expect(backend.watch(readEnd, for: [], tag: tag, in: backend.baseSet) == .watching)
            close(writeEnd)
            var ready = ContiguousArray<EpollBackend.Ready>()
            _ = backend.wait(in: backend.baseSet, blocking: false, into: &ready)
            #expect(ready.first?.events.contains(.hangUp) == true)
        }
    }

    /// After close, a signal from any thread does nothing (no write to a closed or reused number).
    @Test func aSignalAfterCloseDoesNothing() throws {
        let backend = try EpollBackend(ownerTID: crlk_gettid())
        let eventfd = backend.descriptors.wakeUp
        backend.close()
        backend.close()  // Twice is fine.
        // The number may be reused at once; the signal must not write to whatever holds it now.
        let (readEnd, writeEnd) = pipeEnds()
        defer { close(readEnd); close(writeEnd) }
        backend.signal()
        var byte: UInt8 = 0
        #expect(read(readEnd, &byte, 1) == -1 && errno == EAGAIN, "eventfd was \(eventfd)")
    }
}

/// The futex a loop sleeps on while it has no descriptors (Sources/RunLoopKit/Linux/Futex.swift).
@Suite struct FutexWordTests {
    /// Unposted, a wait ends by its timeout. (Only an upper bound: a signal, such as an
    /// all-threads stack capture of another suite, may end it early, as the loop expects.)
    @Test(arguments: [0, 5_000_000] as [Int64])
    func aWaitEndsByItsTimeout(timeoutNs: Int64) {
        let futex = FutexWord()
        let start = crlk_boottime_ns()
        futex.wait(timeoutNs: timeoutNs)
        #expect(crlk_boottime_ns() - start < 5_000_000_000)
    }

    /// A post before the wait is not lost: the wait returns at once.
    @Test func aPostBeforeTheWaitEndsIt() {
        let futex = FutexWord()
        futex.post()
        let start = crlk_boottime_ns()
        futex.wait(timeoutNs: 10_000_000_000)
        #expect(crlk_boottime_ns() - start < 5_000_000_000)
    }
}

/// The periodic timerfd of display links and tickers (Sources/RunLoopKit/Linux/PeriodicTimerDescriptor.swift).
@Suite struct PeriodicTimerDescriptorTests {
    @Test func expirationsAreCountedAndTakenOnce() throws {
        let timer = try PeriodicTimerDescriptor()
        defer { timer.close() }
        #expect(try timer.takeExpirations() == 0)
        try timer.arm(firstNanoseconds: PeriodicTimerDescriptor.nowNanoseconds() - 10_000_000, intervalNanoseconds: 1_000_000)
        var pollFD = pollfd(fd: timer.descriptor, events: Int16(POLLIN), revents: 0)
        #expect(poll(&pollFD, 1, 5_000) == 1)
        #expect(try timer.takeExpirations() >= 1)
        try timer.disarm()
        _ = try timer.takeExpirations()
        #expect(try timer.takeExpirations() == 0)
    }
}
