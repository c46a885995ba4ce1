import CRunLoopKit
import Synchronization

// A foreign wait: another event loop sleeps on the loop's thread, inside one of the loop's
// callouts, on the loop's behalf (a GLib main loop a callout runs, serving the loop through a
// GSource: RunLoopGLib's reverse source). The loop itself is not in its own wait then, so without
// this its wakers would not write the eventfd (they write it only while `sleeping` is set) and a
// block, a message or a wakeUp() from another thread would wait for the foreign loop's next
// unrelated wakeup.
//
// The foreign loop polls the innermost run's epoll set (readable when the loop has work: the
// eventfd, the timerfd, the mode's descriptors) and uses the mode's next timer as its timeout:
//
//   beginForeignWait   the wake protocol's announceSleep (from here wakers write the eventfd),
//                      then the look for work already pending (a request, blocks, a signalled
//                      source, a port's attention, a due timer): if any, the foreign loop must
//                      not block
//   (foreign poll)     on `descriptor`, until `timerDeadline`
//   endForeignWait     the wake protocol's endSleep; if the set was readable, it is drained
//                      without blocking (the eventfd and the timerfd, as a wait drains them) and
//                      the answer is whether a pass has work: the foreign loop then runs one
//                      (`run(mode:for: .zero)`) from its own callout
//
// The Dekker argument of WakeProtocol.swift holds unchanged: the loop stores `sleeping` before it
// looks at `request`, and a waker stores `request` before it looks at `sleeping`.

extension RunLoop {
    /// A wait another event loop does on this loop's behalf (see ``beginForeignWait()``).
    package struct ForeignWait: Sendable {
        /// Readable when the loop has work for a pass: the innermost run's epoll set (the loop's
        /// eventfd and timerfd, and the mode's descriptors).
        package let descriptor: Int32
        /// When the innermost mode's next timer is due; nil when it has none.
        package let timerDeadline: ContinuousClock.Instant?
        /// Work is pending already: the foreign loop must not block (end the wait at once).
        package let mustNotBlock: Bool
    }

    /// Begins a foreign wait: another event loop is about to sleep on the loop's thread, inside a
    /// callout of the loop's innermost run, and will run a pass of that run's mode
    /// (`run(mode:for: .zero)`) when ``endForeignWait(descriptorReadable:)`` says there is work.
    /// From here until `endForeignWait`, other threads' wakeups make ``ForeignWait/descriptor``
    /// readable.
    ///
    /// Returns nil (no wait begun) when the loop is not running, runs on virtual time or has no
    /// kernel descriptors: the foreign loop then does not serve it. Loop thread only.
    package func beginForeignWait() -> ForeignWait? {
        preconditionOnOwnThread("beginForeignWait()")
        guard confined.runDepth > 0, confined.virtualTimePolicy == nil, !confined.foreignWait.inProgress, let backend else {
            return nil
        }
        let innermost = state.locked { state -> (set: EpollBackend.InterestSet, deadline: Int64, mode: Mode, common: Bool, signalled: Bool)? in
            guard let index = state.runningModes.last else { return nil }
            let mode = state.modes[index]
            return (
                mode.interestSet ?? backend.baseSet, mode.timers.coalescedDeadline(), mode.name,
                state.isCommon(mode.name), mode.sources.contains { $0.isSignalled }
            )
        }
        guard let innermost else { return nil }
        confined.foreignWait.inProgress = true
        confined.foreignWait.set = innermost.set
        wake.announceSleep()
        let pending =
            wake.requestPendingAfterAnnouncing() || inbox.hasReady
            || wake.source1Attention.load(ordering: .sequentiallyConsistent) || innermost.signalled
            || innermost.deadline <= LoopClock.now() || hasBlocks(for: innermost.mode, modeIsCommon: innermost.common)
        return ForeignWait(
            descriptor: innermost.set.descriptor,
            timerDeadline: innermost.deadline == LoopClock.never ? nil : LoopClock.instant(innermost.deadline),
            mustNotBlock: pending)
    }

    /// Ends the foreign wait ``beginForeignWait()`` began (nothing if none is in progress):
    /// wakers no longer write the eventfd. `descriptorReadable`: the foreign loop found
    /// ``ForeignWait/descriptor`` readable; the set is then drained without blocking (a wakeup's
    /// eventfd write, an expired timerfd), so that it does not stay readable for nothing.
    ///
    /// Returns whether a pass of the innermost run's mode has work now (a wakeup, a ready
    /// descriptor, an expired timer, blocks, a port's attention). Loop thread only.
    @discardableResult
    package func endForeignWait(descriptorReadable: Bool) -> Bool {
        preconditionOnOwnThread("endForeignWait(descriptorReadable:)")
        guard confined.foreignWait.inProgress else { return false }
        confined.foreignWait.inProgress = false
        wake.endSleep()
        var found = false
        if descriptorReadable, let backend, let set = confined.foreignWait.set {
            var ready = ContiguousArray<EpollBackend.Ready>()
            let outcome = backend.wait(in: set, blocking: false, into: &ready)
            // The descriptors' events are level-triggered: the pass asks the kernel again.
            found = !ready.isEmpty || outcome.timerExpired || takeWaitOutcome(outcome)
        }
        confined.foreignWait.set = nil
        return found || hasInputFromOtherThreads
    }

    /// Whether the loop was made before this process was forked (its descriptors are the
    /// parent's: it must not be used here). Any thread.
    package var wasMadeBeforeFork: Bool { isFromBeforeFork }

    /// Whether this process is a child made by `fork()` (and not yet `exec`ed). Any thread.
    package static var isForkedChild: Bool { crlk_fork_generation() != 0 }
}
