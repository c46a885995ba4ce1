import CRunLoopKit
import Glibc
import Synchronization
import SystemPackage

/// The kernel side of one run loop on Linux: everything epoll, eventfd and timerfd.
///
/// A loop sleeps in an epoll *interest set*. The backend makes a base set at creation, holding the
/// loop's eventfd (other threads write it to wake the loop) and its timerfd (armed for the loop's
/// next timer deadline); a mode with descriptor sources gets a set of its own, holding both of
/// those and the mode's descriptors. Each registration carries a tag chosen by the caller, never
/// the descriptor number, so a number the kernel reuses cannot deliver a stale event to a new
/// owner. The caller speaks in tags, ``IOEvents`` and deadlines; no epoll bit leaves this type.
///
/// Who may call what (the per-field rule):
/// - ``signal()``: any thread, at any time, also after ``close()``.
/// - ``makeSet()``, ``closeSet(_:)``, ``watch(_:for:tag:in:)``, ``changeInterest(_:to:tag:in:)``,
///   ``unwatch(_:in:)``, ``arm(deadlineNs:)``: any thread, with the loop's lock held (the sets and
///   the armed deadline are loop state; the lock orders the calls).
/// - ``wait(in:blocking:into:)``: the loop's thread only (it owns the event buffer); asserted in
///   debug builds.
///
/// Errors: EBADF and EFAULT on the backend's own descriptors are bugs and stop the process with a
/// message naming the call (see ``System/call(_:_:_:)``); a caller's descriptor that is closed or
/// cannot be watched is an outcome the caller handles; running out of descriptors or kernel memory
/// is thrown.
final class EpollBackend: Sendable {
    /// An epoll set the loop can sleep in: the base set, or a mode's own.
    struct InterestSet: Hashable, Sendable {
        fileprivate let fd: Int32
        /// The epoll descriptor (for descriptions).
        var descriptor: Int32 { fd }
    }

    /// Readiness of a watched descriptor. The raw values are those of
    /// ``FileDescriptorSource/Events`` for the same events.
    struct IOEvents: OptionSet, Sendable {
        let rawValue: UInt32
        static let readable = IOEvents(rawValue: 1 << 0)
        static let writable = IOEvents(rawValue: 1 << 1)
        static let hangUp = IOEvents(rawValue: 1 << 2)
        static let error = IOEvents(rawValue: 1 << 3)

        fileprivate var epollBits: UInt32 {
            (contains(.readable) ? Epoll.readable : 0) | (contains(.writable) ? Epoll.writable : 0)
        }

        init(rawValue: UInt32) { self.rawValue = rawValue }

        fileprivate init(epoll bits: UInt32) {
            var events: IOEvents = []
            if bits & Epoll.readable != 0 { events.insert(.readable) }
            if bits & Epoll.writable != 0 { events.insert(.writable) }
            if bits & Epoll.hangUp != 0 { events.insert(.hangUp) }
            if bits & Epoll.error != 0 { events.insert(.error) }
            self = events
        }
    }

    /// A descriptor the kernel reported ready: its registration's tag and what it reported.
    struct Ready: Sendable {
        let tag: UInt64
        let events: IOEvents
    }

    /// What a wait found besides descriptor events.
    struct WaitOutcome: Sendable {
        /// The eventfd was written: another thread asked the loop to wake (its counter is reset).
        var wokenByAnotherThread = false
        /// The timerfd expired (it is disarmed now).
        var timerExpired = false
    }

    /// What registering a caller's descriptor came to.
    enum WatchOutcome: Sendable, Equatable {
        /// The set reports the descriptor's events from now on.
        case watching
        /// The descriptor is not open (EBADF): closed behind its source's back.
        case closed
        /// The kernel refused (ENOMEM, ENOSPC: `max_user_watches` reached, ...).
        case failed(Errno)
    }

    private static let wakeTag: UInt64 = 1
    private static let timerTag: UInt64 = 2
    /// The first tag callers may use: tags below it are the backend's own.
    static let firstCallerTag: UInt64 = 16

    /// The base set, which runs in a mode without descriptor sources sleep in.
    let baseSet: InterestSet
    private let wakeFD: Int32
    private let timerFD: Int32
    /// `true` once the descriptors are closed. Wakers hold it while writing, so that a teardown
    /// can never close the eventfd between their check and their write (the number could be
    /// reused by then).
    private let closed = Mutex(false)
    /// The kernel id of the loop's thread (debug assertions).
    private let ownerTID: Int32
    /// `crlk_fork_generation()` when the backend was made (see ``inForkedChild``).
    private let forkGeneration: UInt64
    private let eventCapacity: Int32 = 64
    /// The loop thread's event buffer. `nonisolated(unsafe)`: only ``wait(in:blocking:into:)``
    /// touches the memory it points to, on the loop's thread.
    private nonisolated(unsafe) let events: UnsafeMutablePointer<epoll_event>

    /// The backend's own descriptors, for descriptions: the base epoll set, the eventfd that
    /// wakes the loop, the timerfd its timers arm.
    var descriptors: (epoll: Int32, wakeUp: Int32, timer: Int32) { (baseSet.fd, wakeFD, timerFD) }

    /// Opens the base set, the eventfd and the timerfd, for the loop of thread `ownerTID`.
    ///
    /// - Throws: The `Errno` of the first call that failed (EMFILE when the process is out of
    ///   descriptors); nothing is leaked.
    init(ownerTID: Int32) throws(Errno) {
        var opened: [Int32] = []
        do throws(Errno) {
            let epollFD = try Epoll.create()
            opened.append(epollFD)
            let wakeFD = try Counter.makeEventFD()
            opened.append(wakeFD)
            let timerFD = try Counter.makeTimerFD()
            opened.append(timerFD)
            try Self.addOwnDescriptors(to: epollFD, wakeFD: wakeFD, timerFD: timerFD)
            self.baseSet = InterestSet(fd: epollFD)
            self.wakeFD = wakeFD
            self.timerFD = timerFD
        } catch {
            for fd in opened { System.close(fd) }
            throw error
        }
        self.ownerTID = ownerTID
        crlk_watch_forks()
        forkGeneration = crlk_fork_generation()
        events = .allocate(capacity: Int(eventCapacity))
        events.initialize(repeating: epoll_event(), count: Int(eventCapacity))
    }

    deinit {
        close()
        events.deallocate()
    }

    private static func addOwnDescriptors(to epollFD: Int32, wakeFD: Int32, timerFD: Int32) throws(Errno) {
        try Epoll.control(epollFD, EPOLL_CTL_ADD, fd: wakeFD, owner: .library, events: Epoll.readable, tag: wakeTag)
        try Epoll.control(epollFD, EPOLL_CTL_ADD, fd: timerFD, owner: .library, events: Epoll.readable, tag: timerTag)
    }

    // MARK: Waking

    /// Wakes the loop: makes its eventfd readable. Any thread; after ``close()`` it does nothing.
    /// Whether this process is a child forked after the backend was made. Its descriptors are then
    /// open files shared with the parent: a registration changed, the timerfd armed or the eventfd
    /// written here would change the parent's loop (a source invalidated in the child would stop
    /// the parent's events). In a child every such call does nothing; a loop from before the fork
    /// cannot run there anyway (`RunLoop.preconditionNotForked`).
    @inline(__always)
    private var inForkedChild: Bool { _slowPath(crlk_fork_generation() != forkGeneration) }

    func signal() {
        if inForkedChild { return }
        closed.locked { closed in
            guard !closed else { return }
            do throws(Errno) { try Counter.signal(wakeFD, .library) } catch {
                // EBADF and EFAULT stopped in System.call; EINVAL would be a bug here too.
                fatalError("RunLoopKit: writing the wakeup eventfd \(wakeFD) failed: \(error)")
            }
        }
    }

    /// Closes the base set, the eventfd and the timerfd; later signals do nothing. Sets made with
    /// ``makeSet()`` are the caller's to close.
    func close() {
        closed.locked { closed in
            guard !closed else { return }
            closed = true
            System.close(baseSet.fd)
            System.close(wakeFD)
            System.close(timerFD)
        }
    }

    // MARK: Timer

    /// Arms the timerfd for the absolute `CLOCK_BOOTTIME` deadline `deadlineNs` (nanoseconds), or
    /// disarms it (nil). Loop's lock held.
    ///
    /// - Throws: What timerfd_settime(2) reported (EINVAL for a deadline it cannot take).
    func arm(deadlineNs: Int64?) throws(Errno) {
        if inForkedChild { return }
        try Counter.arm(timerFD, deadlineNs: deadlineNs)
    }

    // MARK: Interest sets

    /// Makes an interest set holding the eventfd and the timerfd. Loop's lock held.
    ///
    /// - Throws: EMFILE, ENFILE or ENOMEM; nothing is leaked.
    func makeSet() throws(Errno) -> InterestSet {
        let epollFD = try Epoll.create()
        do throws(Errno) {
            try Self.addOwnDescriptors(to: epollFD, wakeFD: wakeFD, timerFD: timerFD)
        } catch {
            System.close(epollFD)
            throw error
        }
        return InterestSet(fd: epollFD)
    }

    /// Closes a set made with ``makeSet()``: every registration in it goes with it. Loop's lock
    /// held.
    func closeSet(_ set: InterestSet) {
        fatalPrecondition(set != baseSet, "RunLoopKit: the base interest set is closed only with the backend")
        System.close(set.fd)
    }

    /// Registers the caller's descriptor `fd` in `set` for `events` (hang-ups and errors are
    /// always reported), its events tagged `tag` (at least ``firstCallerTag``). Loop's lock held.
    ///
    /// A registration of the same file and number that could not be deleted earlier (its number
    /// was closed while another reference kept the file open) is taken over.
    func watch(_ fd: Int32, for events: IOEvents, tag: UInt64, in set: InterestSet) -> WatchOutcome {
        fatalPrecondition(tag >= Self.firstCallerTag, "RunLoopKit: tag \(tag) is reserved for the backend")
        if inForkedChild { return .watching }
        do throws(Errno) {
            try Epoll.control(set.fd, EPOLL_CTL_ADD, fd: fd, owner: .caller, events: events.epollBits, tag: tag)
            return .watching
        } catch .fileExists {
            return changeInterest(fd, to: events, tag: tag, in: set)
        } catch .badFileDescriptor {
            return .closed
        } catch {
            return .failed(error)
        }
    }

    /// Changes what `fd` is watched for in `set`. Loop's lock held.
    func changeInterest(_ fd: Int32, to events: IOEvents, tag: UInt64, in set: InterestSet) -> WatchOutcome {
        if inForkedChild { return .watching }
        do throws(Errno) {
            try Epoll.control(set.fd, EPOLL_CTL_MOD, fd: fd, owner: .caller, events: events.epollBits, tag: tag)
            return .watching
        } catch .badFileDescriptor, .noSuchFileOrDirectory {
            // ENOENT: the number is open but not registered, so it names another file now.
            return .closed
        } catch {
            return .failed(error)
        }
    }

    /// Deletes `fd`'s registration from `set`. Loop's lock held.
    ///
    /// Returns false if the kernel no longer knows the registration by this number (the number
    /// was closed). That is fine when the file is closed too (the kernel dropped it), but if the
    /// file lives on elsewhere (a `dup`, a child process, an `SCM_RIGHTS` message) its events keep
    /// coming under the old tag: the caller then makes the set anew.
    @discardableResult
    func unwatch(_ fd: Int32, in set: InterestSet) -> Bool {
        if inForkedChild { return true }
        do throws(Errno) {
            try Epoll.control(set.fd, EPOLL_CTL_DEL, fd: fd, owner: .caller, events: 0, tag: 0)
            return true
        } catch {
            return false
        }
    }

    /// Whether epoll can watch `fd` at all, asked with a trial registration in a set made for the
    /// question and closed at once (a set kept for the process would be a descriptor the caller
    /// never opened, shared with any child after fork()).
    ///
    /// - Throws: `Errno.notPermitted` if epoll refuses `fd` (files with no readiness to report:
    ///   /dev/null, /dev/zero). Out of descriptors for the trial set, it cannot tell and lets the
    ///   descriptor through (the loop reports it when it watches it).
    static func checkWatchable(_ fd: Int32) throws(Errno) {
        let set: Int32
        do throws(Errno) { set = try Epoll.create() } catch {
            return  // Out of descriptors for the trial set: it cannot tell (see above).
        }
        defer { System.close(set) }
        do throws(Errno) {
            try Epoll.control(set, EPOLL_CTL_ADD, fd: fd, owner: .caller, events: 0, tag: firstCallerTag)
        } catch .notPermitted {
            throw .notPermitted
        } catch {
            // EBADF: closed since the caller checked it; anything else: decided when it is watched.
        }
    }

    // MARK: Waiting

    /// Waits in `set` until a descriptor is ready, the timerfd expires or the eventfd is written
    /// (`blocking`), or only asks which are ready now (not `blocking`). Descriptor events are
    /// appended to `ready`; the eventfd and the timerfd are drained and reported in the outcome.
    /// A signal interrupting the sleep returns an empty outcome. Loop thread only.
    func wait(in set: InterestSet, blocking: Bool, into ready: inout ContiguousArray<Ready>) -> WaitOutcome {
        assert(crlk_gettid() == ownerTID, "RunLoopKit: EpollBackend.wait off the loop's thread")
        let count = Epoll.wait(set.fd, events, capacity: eventCapacity, timeoutMs: blocking ? -1 : 0)
        var outcome = WaitOutcome()
        for slot in 0..<Int(count) {
            let event = events[slot]
            switch event.data.u64 {
            case Self.wakeTag:
                drain(wakeFD)
                outcome.wokenByAnotherThread = true
            case Self.timerTag:
                drain(timerFD)
                outcome.timerExpired = true
            case let tag:
                ready.append(Ready(tag: tag, events: IOEvents(epoll: event.events)))
            }
        }
        return outcome
    }

    /// Whether a descriptor of `set` other than the loop's own counters is ready now, without
    /// taking anything (the sets are level-triggered: the next wait reports it again).
    func hasReadyDescriptor(in set: InterestSet) -> Bool {
        assert(crlk_gettid() == ownerTID, "RunLoopKit: EpollBackend.hasReadyDescriptor off the loop's thread")
        let count = Epoll.wait(set.fd, events, capacity: eventCapacity, timeoutMs: 0)
        for slot in 0..<Int(max(0, count)) {
            let tag = events[slot].data.u64
            if tag != Self.wakeTag && tag != Self.timerTag { return true }
        }
        return false
    }

    private func drain(_ fd: Int32) {
        do throws(Errno) { try Counter.drain(fd, .library) } catch {
            fatalError("RunLoopKit: reading the loop's counter descriptor \(fd) failed: \(error)")
        }
    }
}
