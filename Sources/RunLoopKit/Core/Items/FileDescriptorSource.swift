import CRunLoopKit
import Glibc
import Synchronization
import SystemPackage

/// A version-1 source on a file descriptor: the loop sleeps with the descriptor in its epoll set,
/// wakes when it is ready, and calls the handler on its thread with what happened.
///
/// The Linux counterpart of CoreFoundation's port-based sources (CFRunLoopSource version 1, which
/// on Darwin waits on a Mach port). The handler runs after the loop wakes (after
/// ``RunLoop/Activity/afterWaiting`` and the due timers), in ascending ``order`` among the mode's
/// version-1 sources, only while the loop runs in one of the source's modes; handling it counts
/// as a handled source (`run(mode:for:returnAfterSourceHandled: true)` returns
/// ``RunLoop/RunResult/handledSource``).
///
/// Readiness is level-triggered: while the descriptor stays readable, every pass calls the
/// handler again. After a hang-up, an error, or ``Events/closed``, the handler is called once
/// with those events (read what is left then) and the source is invalidated when it returns; the
/// loop keeps running.
///
/// Events carry a tag of the loop's, not the descriptor number, so a number the kernel reuses for
/// a new descriptor never delivers a stale event to a new source. A source belongs to one loop
/// (any number of its modes). Several sources may watch one descriptor (a read source and a
/// write source on a socket): the loop registers the descriptor once and tells each source what
/// it watches. Adding a source whose descriptor is another file (device and inode) than that of
/// an earlier, still valid source on the same number means the earlier source's descriptor was
/// closed and its number reused: the earlier source is told ``Events/closed`` and invalidated.
///
/// Close a watched descriptor through ``invalidate()`` (with ``ownsDescriptor``) or after it. A
/// descriptor closed behind the source's back stops producing events only if nothing else holds
/// its file: the kernel drops a registration when the file closes, not when the number does.
/// While a `dup`, a child process or an `SCM_RIGHTS` message keeps the file open, the kernel
/// goes on reporting it; the loop checks, whenever the descriptor is reported ready, that the
/// number still names the same file (device and inode), tells the handler ``Events/closed``
/// otherwise, and rebuilds its epoll set to drop the registration it can no longer delete. It
/// also finds out when the number is reused by another source on the loop, when the source joins
/// a mode, and when changing ``watchedEvents`` fails. Descriptors on the kernel's shared anonymous
/// inode (eventfd, timerfd, signalfd, epoll) all look alike to the device-and-inode check, so a
/// reused number among those is caught only the other ways. See <doc:FailureModes>.
public final class FileDescriptorSource: Sendable, Hashable, CustomStringConvertible {
    /// What a descriptor source watches for, and what its handler is told.
    public struct Events: OptionSet, Sendable, Hashable, CustomStringConvertible {
        /// The events' bits.
        public let rawValue: UInt32

        /// Creates an event set from its bits.
        public init(rawValue: UInt32) { self.rawValue = rawValue }

        /// Data can be read (or a connection accepted) without blocking (`EPOLLIN`).
        public static let readable = Events(rawValue: 1 << 0)
        /// Data can be written without blocking (`EPOLLOUT`).
        public static let writable = Events(rawValue: 1 << 1)
        /// The peer hung up (`EPOLLHUP`); reported whether watched or not.
        public static let hangUp = Events(rawValue: 1 << 2)
        /// The descriptor has an error pending (`EPOLLERR`); reported whether watched or not.
        public static let error = Events(rawValue: 1 << 3)
        /// The descriptor was found closed while the source watched it (a system call answered
        /// `EBADF`, or its number was reused by another source's descriptor).
        public static let closed = Events(rawValue: 1 << 4)

        /// Events after which the source is invalidated.
        static let terminal: Events = [.hangUp, .error, .closed]

        /// The event names, as in `[readable, hangUp]`.
        public var description: String {
            let names: [(Events, String)] = [
                (.readable, "readable"), (.writable, "writable"), (.hangUp, "hangUp"), (.error, "error"),
                (.closed, "closed"),
            ]
            let parts = names.filter { contains($0.0) }.map(\.1)
            return parts.count == 1 ? parts[0] : "[" + parts.joined(separator: ", ") + "]"
        }
    }

    /// The descriptor watched.
    public let descriptor: Int32
    /// Whether ``invalidate()`` closes the descriptor (the source was created to own it).
    public let ownsDescriptor: Bool
    /// The position among a mode's version-1 sources: lower orders are handled first.
    public let order: Int

    let id: UInt64
    /// Its name in traces (see `label`).
    let itemLabel = ItemLabel()
    /// What the descriptor referred to when the source was made (device and inode).
    let identity: FileIdentity
    let handler: @Sendable (FileDescriptorSource, Events) -> Void
    let registration = Mutex(Source1Registration())
    /// The watched events' bits (``Events``), readable without the lock.
    private let watched: Atomic<UInt32>
    /// ``Events/closed`` found by another thread (or by a registration), waiting for delivery.
    private let pendingBroken = Atomic<UInt32>(0)
    /// Set when the descriptor number was found reused: unregistering must not touch the number,
    /// which now names another descriptor.
    let numberReused = Atomic<Bool>(false)
    /// A source the library keeps for itself (the main queue's), left out of a loop's
    /// `description`.
    let isLibrarySource = Atomic<Bool>(false)
    /// Whether the owned descriptor was closed.
    private let descriptorClosed = Atomic<Bool>(false)

    /// Creates a source watching `descriptor` for `events` (``Events/hangUp`` and
    /// ``Events/error`` are always reported). Add it to a loop to start watching.
    ///
    /// - Parameters:
    ///   - descriptor: An open descriptor epoll can watch: a socket, pipe, FIFO, eventfd,
    ///     timerfd, terminal, ...
    ///   - events: ``Events/readable``, ``Events/writable`` or both.
    ///   - ownsDescriptor: Whether ``invalidate()`` closes the descriptor.
    ///   - order: The position among a mode's version-1 sources.
    ///   - handler: Called on the loop's thread with the source and what happened.
    /// - Throws: `Errno.badFileDescriptor` if `descriptor` is not open; `Errno.notPermitted` for a
    ///   regular file, a directory or a device epoll cannot watch (`/dev/null`, `/dev/zero`). The
    ///   descriptor stays the caller's when `init` throws.
    public init(
        descriptor: Int32,
        watching events: Events = .readable,
        ownsDescriptor: Bool = false,
        order: Int = 0,
        handler: @escaping @Sendable (FileDescriptorSource, Events) -> Void
    ) throws(Errno) {
        guard descriptor >= 0 else { throw Errno.badFileDescriptor }
        let identity = try FileIdentity.of(descriptor).get()
        if identity.isRegularFileOrDirectory { throw Errno.notPermitted }
        // Character devices such as /dev/null and /dev/zero cannot be watched either, and only
        // epoll can tell: a trial registration.
        if identity.isCharacterDevice { try EpollBackend.checkWatchable(descriptor) }
        self.descriptor = descriptor
        self.identity = identity
        self.ownsDescriptor = ownsDescriptor
        self.order = order
        self.handler = handler
        self.id = Source1IDs.make()
        self.watched = Atomic(events.intersection([.readable, .writable]).rawValue)
    }

    deinit {
        if ownsDescriptor && !descriptorClosed.exchange(true, ordering: .relaxed) { System.close(descriptor) }
    }

    /// The events the source watches for (``Events/readable``, ``Events/writable``); setting it
    /// takes effect in every mode the source is in at once, from any thread. Turn
    /// ``Events/writable`` on while output is pending and off once it is written: a writable
    /// socket is ready on nearly every pass.
    public var watchedEvents: Events {
        get { Events(rawValue: watched.load(ordering: .relaxed)) }
        set {
            let bits = newValue.intersection([.readable, .writable]).rawValue
            guard watched.exchange(bits, ordering: .relaxed) != bits else { return }
            let loop = registration.locked { $0.loop?.loop }
            loop?.updateInterest(self)
        }
    }

    /// Whether the source can still fire.
    public var isValid: Bool { registration.locked { $0.valid } }

    /// Removes the source from its loop and stops it for good; closes the descriptor if the source
    /// owns it. Safe from any thread and from inside any callback, its own included.
    public func invalidate() {
        let loop: RunLoop? = registration.locked { registration in
            guard registration.valid else { return nil }
            registration.valid = false
            return registration.loop?.loop
        }
        loop?.detachSource1(self)
        if ownsDescriptor && !descriptorClosed.exchange(true, ordering: .relaxed) { System.close(descriptor) }
    }

    /// Whether ``descriptor`` still refers to what it did when the source was made (one `fstat`):
    /// false once the number was closed, or closed and reused for something else.
    func stillNamesItsDescriptor() -> Bool { identity.isStill(descriptor) }

    /// Records that the descriptor was found closed; the loop delivers ``Events/closed`` on its
    /// thread. `reused`: its number now names another descriptor.
    func markClosed(reused: Bool) {
        if reused { numberReused.store(true, ordering: .relaxed) }
        // The descriptor is gone: its number may name someone else's descriptor by now, so an
        // owning source must not close it.
        descriptorClosed.store(true, ordering: .relaxed)
        pendingBroken.store(Events.closed.rawValue, ordering: .releasing)
    }

    /// Loops are equal only to themselves.
    public static func == (lhs: FileDescriptorSource, rhs: FileDescriptorSource) -> Bool { lhs === rhs }

    /// Hashes the source's identity.
    public func hash(into hasher: inout Hasher) { hasher.combine(ObjectIdentifier(self)) }

    /// `<FileDescriptorSource 0x… "label" fd 7 watching readable order 0 valid>` (the label if it
    /// has one).
    public var description: String {
        "<FileDescriptorSource \(objectAddress(self))\(label.map { " \"\($0)\"" } ?? "") fd \(descriptor) watching \(watchedEvents) order \(order) \(isValid ? "valid" : "invalid")>"
    }
}

extension FileDescriptorSource: Source1Item {
    func withRegistration<R>(_ body: (inout Source1Registration) -> R) -> R {
        registration.locked { registration in body(&registration) }
    }

    var needsAttention: Bool { pendingBroken.load(ordering: .acquiring) != 0 }

    var descriptorSource: FileDescriptorSource? { self }

    var calloutKind: RunLoop.CalloutKind { .descriptor }

    var calloutLabel: UInt32 { itemLabel.calloutLabel.load(ordering: .relaxed) }

    func invalidateItem() { invalidate() }

    func perform(events reported: Events, onlyOne: Bool, on loop: RunLoop) -> Bool {
        var events = reported
        if !reported.isEmpty && !stillNamesItsDescriptor() {
            // The kernel reports a file this number no longer names: closed behind the source's
            // back while something else (a dup, a child, a message) keeps the file open. Its
            // registration cannot be deleted by number: the loop rebuilds its epoll sets.
            events = .closed
            descriptorClosed.store(true, ordering: .relaxed)
            loop.descriptorFoundClosed(self)
        }
        events.formUnion(Events(rawValue: pendingBroken.exchange(0, ordering: .acquiring)))
        guard !events.isEmpty, isValid else { return false }
        handler(self, events)
        if !events.isDisjoint(with: Events.terminal) { invalidate() }
        return true
    }
}
