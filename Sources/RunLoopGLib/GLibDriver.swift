#if GLib
internal import CGLib
import Glibc
import Logging
import RunLoopKit
import Synchronization

// How a loop drives a GMainContext: GLib's own iteration (gmain.c, g_main_context_iterate),
// split over a pass of the loop.
//
//   beforeWaiting observer   prepare, query (the descriptors and timeout of GLib's sources of the
//                            best ready priority), the descriptors synced into the bridge's epoll
//                            set, the timeout into the GLib timer; ready now (an idle, a timeout
//                            due) -> the kick source is signalled and the loop woken: it polls
//                            instead of sleeping, and the next pass dispatches
//   (the loop's wait)        the epoll set is one of the mode's descriptors: GLib's descriptors,
//                            its wakeup eventfd among them, end the sleep; so does the timer
//   epoll source (Source1)   check with each descriptor's readiness (g_poll, timeout 0), then
//                            dispatch: GLib's ready sources of the best priority
//   kick source (Source0)    check and dispatch with no descriptor ready (had one been, the epoll
//                            source would have taken the iteration in the pass before: its wait
//                            asked the kernel after the prepare), then prepare and query for the
//                            next pass, signalling itself again while GLib has work ready
//   GLib timer               signals the kick source
//
// One GLib iteration per pass and one callout per iteration (the epoll source or the kick source,
// both labelled "GLib dispatch"): a GLib idle that never finishes takes one callout per pass,
// and the loop's own sources, timers and main queue keep their turn.
//
// Nested loops, both ways:
// - A run of the loop nested in a GLib callback (a callout of a callout): its passes iterate
//   GLib again, which GLib allows (a recursive iteration, as a nested g_main_loop_run makes: the
//   source dispatching now is not dispatched again unless it can recurse).
// - A GLib loop nested in a callout (g_main_loop_run in a GLib callback, a dialog, a library's
//   sync helper): GLib iterates itself, and the reverse source (ReverseSource.swift) serves the
//   loop, one pass per dispatch. In that pass (`suspendedDepth`) the bridge does not iterate GLib:
//   GLib is iterating already, one level up.
//
// Ownership: acquired in `attach`, released in `finishTeardown` (after the bridge's own dispatch
// in progress returns, if one is). Held while the loop sleeps, so that other threads' wakeups
// (g_source_attach, g_idle_add, g_main_context_invoke) write GLib's wakeup eventfd: GLib signals
// it only for a context another thread owns (gmain.c, g_source_attach_unlocked).

/// The bridge's state and work. Everything here but the atomics is used on the loop's thread
/// only: by ``GLibDriver/attach(loop:context:modes:)`` (which checks it runs there), by the
/// bridge's item callouts (a loop calls out on its own thread), by the reverse source's callbacks
/// (GLib iterates a context only on its owner's thread, which is the loop's while attached), and
/// by `invalidate` on that thread (from another thread it is performed there).
///
/// `@unchecked Sendable` for those reasons: the items' handlers (`@Sendable` closures) capture it.
/// Its stored properties skip Swift's dynamic exclusivity checks (a `begin_access` per use, on
/// every pass): one thread uses them, and no access spans a callout that could nest another.
final class GLibDriver: @unchecked Sendable {
    let loop: RunLoop
    let context: OpaquePointer
    let modes: [RunLoop.Mode]
    /// The loop thread's kernel id.
    let threadID: Int32

    /// Set until `invalidate` (any thread reads it).
    private let attached = Atomic<Bool>(true)
    /// The context is released and the items removed (loop thread).
    @exclusivity(unchecked) private var tornDown = false
    /// `invalidate` came while the bridge's own dispatch was in progress: the release waits for it.
    @exclusivity(unchecked) private var releasePending = false
    @exclusivity(unchecked) private var released = false

    // MARK: GLib's descriptors

    /// The epoll descriptor that holds GLib's descriptors, watched by ``epollSource``.
    @exclusivity(unchecked) private var epollFD: Int32 = -1
    @exclusivity(unchecked) private var epollSource: FileDescriptorSource?
    /// What ``epollFD`` holds: (descriptor, epoll events), by descriptor.
    @exclusivity(unchecked) private var registered: [(fd: Int32, events: UInt32)] = []
    /// The next ``registered``, built by `sync` (kept between syncs: a pass allocates nothing).
    @exclusivity(unchecked) private var syncing: [(fd: Int32, events: UInt32)] = []
    /// Re-register every descriptor at the next sync: GLib's set of descriptors may have changed
    /// behind the same numbers (a source closed its descriptor and another reopened the number).
    @exclusivity(unchecked) private var revalidate = false
    /// Descriptors epoll refuses (a regular file, a closed number): poll() reports them ready at
    /// once, so the loop does not sleep while GLib watches one.
    @exclusivity(unchecked) private var unwatchable: [Int32] = []
    /// Wakes of the epoll source in a row that found none of GLib's descriptors ready: a
    /// registration of a file GLib no longer watches (closed here, open elsewhere) is left in the
    /// set, and the set is made anew.
    @exclusivity(unchecked) private var spuriousWakes = 0

    // MARK: GLib's iteration

    @exclusivity(unchecked) private var fds: UnsafeMutablePointer<GPollFD>
    @exclusivity(unchecked) private var capacity: Int
    @exclusivity(unchecked) private var count: Int32 = 0
    @exclusivity(unchecked) private var maxPriority: Int32 = 0
    /// Prepared and queried, not yet checked (``fds`` and ``maxPriority`` are this iteration's).
    @exclusivity(unchecked) private(set) var prepared = false
    /// The bridge's own prepare, query or check is in progress: the reverse source stays out.
    @exclusivity(unchecked) private(set) var ownIteration = false
    /// The bridge's own dispatches in progress (nested runs in GLib callbacks dispatch again).
    @exclusivity(unchecked) private var dispatchDepth = 0
    /// The loop's run depth at which the reverse source's pass runs (the bridge does not iterate
    /// GLib there); -1 when none runs.
    @exclusivity(unchecked) var suspendedDepth = -1

    // MARK: The loop's items

    @exclusivity(unchecked) private var observer: RunLoopObserver?
    @exclusivity(unchecked) private var timer: RunLoopTimer?
    /// The GLib timer's fire date (loop nanoseconds), `Int64.max` while GLib has no timeout.
    @exclusivity(unchecked) private var timerDeadline = Int64.max
    /// The timer is in the bridge's modes: only while GLib has a timeout (a mode with a timer looks
    /// at the clock and its timers in every pass).
    @exclusivity(unchecked) private var timerScheduled = false
    @exclusivity(unchecked) private var kick: RunLoopSource?
    @exclusivity(unchecked) private var reverse: ReverseSource?
    @exclusivity(unchecked) private var describer: RunLoop.InstrumentationToken?

    /// The label of the bridge's dispatch callouts (the epoll source and the kick source).
    static let calloutLabel = "GLib dispatch"
    /// Where the `beforeWaiting` observer sits among the mode's observers: after the others, so
    /// that GLib sources they add are prepared in the same pass (CoreFoundation's autorelease pool
    /// observers sit at the end the same way).
    static let observerOrder = Int.max / 2
    /// The epoll source's order among the mode's version-1 sources, and the kick source's among
    /// its version-0 sources.
    static let sourceOrder = Int.max / 2
    private static let logger = Logger(label: "RunLoopGLib")

    private init(loop: RunLoop, context: OpaquePointer, modes: [RunLoop.Mode]) {
        self.loop = loop
        self.context = context
        self.modes = modes
        self.threadID = crlg_gettid()
        capacity = 16
        fds = .allocate(capacity: capacity)
    }

    deinit {
        // Only when the loop let go of the items: after `invalidate`, or when its thread exited.
        if !tornDown {
            attached.store(false, ordering: .relaxed)
            reverse?.destroy()
            reverse = nil
            if crlg_gettid() == threadID {
                release()
            } else {
                Self.logger.error(
                    "a GLibBridge was freed off its loop's thread without invalidate(): its GMainContext stays acquired by that thread")
                GLibDriver.registry.locked { _ = $0.remove(UInt(bitPattern: context)) }
            }
        }
        fds.deallocate()
    }

    // MARK: Attaching

    /// The contexts driven by a bridge, by address.
    static let registry = Mutex<Set<UInt>>([])

    /// Acquires `context`, makes the epoll descriptor and adds the items. Loop thread.
    static func attach(loop: RunLoop, context: OpaquePointer, modes: [RunLoop.Mode]) throws(GLibBridgeError) -> GLibDriver {
        let key = UInt(bitPattern: context)
        guard registry.locked({ $0.insert(key).inserted }) else { throw .alreadyAttached }
        guard g_main_context_acquire(context) != 0 else {
            registry.locked { _ = $0.remove(key) }
            throw .contextOwnedElsewhere
        }
        let epollFD = crlg_epoll_create()
        guard epollFD >= 0 else {
            let error = errno
            g_main_context_release(context)
            registry.locked { _ = $0.remove(key) }
            throw .noDescriptor(errno: error)
        }
        g_main_context_ref(context)
        let driver = GLibDriver(loop: loop, context: context, modes: modes)
        driver.epollFD = epollFD
        driver.start()
        return driver
    }

    private func start() {
        do throws(GLibBridgeError) {
            epollSource = try makeEpollSource(epollFD)
        } catch {
            // The epoll descriptor is new and open: FileDescriptorSource takes it.
            fatalError("RunLoopGLib: cannot watch the bridge's epoll descriptor: \(error)")
        }
        let observer = RunLoopObserver(activities: .beforeWaiting, order: Self.observerOrder) { [self] _, _ in
            beforeWaiting()
        }
        observer.label = "GLib prepare"
        // A repeating timer whose fire date each prepare sets: one object for the bridge's life.
        let timer = RunLoopTimer(fireAt: RunLoop.distantFuture, interval: .seconds(1_000_000_000)) { [self] _ in
            timerFired()
        }
        timer.label = "GLib timeout"
        // Cancelled by the bridge's own teardown, or by the loop's when its thread exits. Strong
        // captures (a weak reference would put the driver's reference counts in a side table, the
        // slow path on every pass): tearDown lets go of the items, which ends the cycle.
        let kick = RunLoopSource(order: Self.sourceOrder, onCancel: { [self] _, _ in loopLetGo() }) { [self] in
            kicked()
        }
        kick.label = Self.calloutLabel
        self.observer = observer
        self.timer = timer
        self.kick = kick
        for mode in modes {
            loop.add(observer, forMode: mode)
            loop.add(kick, forMode: mode)
            if let epollSource { loop.add(epollSource, forMode: mode) }
        }
        reverse = ReverseSource(driver: self)
        if let reader = DispatchNames.reader() {
            describer = loop.describeCallouts(labelled: Self.calloutLabel) { reader.currentSourceName() }
        }
    }

    private func makeEpollSource(_ descriptor: Int32) throws(GLibBridgeError) -> FileDescriptorSource {
        do {
            let source = try FileDescriptorSource(descriptor: descriptor, ownsDescriptor: true, order: Self.sourceOrder) {
                [self] _, _ in descriptorsReady()
            }
            source.label = Self.calloutLabel
            return source
        } catch {
            throw .noDescriptor(errno: error.rawValue)
        }
    }

    var isAttached: Bool { attached.load(ordering: .acquiring) }

    /// Whether the bridge iterates GLib in the loop's pass now: attached, and not in the reverse
    /// source's pass.
    @inline(__always)
    private var drives: Bool {
        attached.load(ordering: .relaxed) && loop.runDepthOnOwnThread != suspendedDepth
    }

    // MARK: The pass

    /// Before the loop sleeps: prepare, query, sync; the timeout into the timer, or a kick.
    private func beforeWaiting() {
        guard drives else { return }
        reverse?.deactivate()
        if let epollSource, epollSource.watchedEvents != .readable { epollSource.watchedEvents = .readable }
        if prepareForNextPass() {
            // The loop's own thread, awake: no system call, and the wait only polls.
            loop.wakeUp()
        }
    }

    /// GLib's descriptors (its wakeup eventfd among them) are ready: a full iteration if this pass
    /// did not prepare one.
    private func descriptorsReady() {
        guard drives else { return }
        iterate(pollDescriptors: true)
    }

    /// GLib had work ready when it was last prepared, or its timeout expired: check and dispatch,
    /// then prepare the next pass's iteration (a GLib idle that always continues is dispatched
    /// once per pass, and the pass after polls instead of sleeping).
    private func kicked() {
        guard drives else { return }
        // The last wait asked the kernel after the last prepare (if the epoll source took that
        // prepare, this iteration prepares anew): had any of GLib's descriptors been ready, the
        // epoll source would have run. Descriptors epoll cannot watch only poll() can tell about.
        iterate(pollDescriptors: !unwatchable.isEmpty)
        guard drives else { return }
        _ = prepareForNextPass()
    }

    private func timerFired() {
        guard drives else { return }
        timerDeadline = Int64.max
        kick?.signal()
    }

    /// Prepare, query and sync; GLib's timeout into the timer, or, with a source ready, the kick
    /// source signalled. Returns whether it was.
    private func prepareForNextPass() -> Bool {
        let (ready, timeout) = prepareAndQuery()
        if ready || timeout == 0 || !unwatchable.isEmpty {
            kick?.signal()
            return true
        }
        setTimer(timeoutMs: timeout)
        return false
    }

    private func setTimer(timeoutMs: Int32) {
        guard let timer else { return }
        guard timeoutMs >= 0 else {
            // No timeout: the timer leaves the modes (nothing for the loop to look at per pass).
            if timerScheduled {
                timerScheduled = false
                timerDeadline = Int64.max
                for mode in modes { loop.remove(timer, forMode: mode) }
            }
            return
        }
        let deadline = RunLoop.clockNanoseconds &+ Int64(timeoutMs) * 1_000_000
        // GLib rounds its timeout up to a millisecond, measured from its own prepare: within one,
        // the date set already stands (a later one by less than a millisecond is late by less
        // than GLib's own rounding).
        if timerScheduled, timerDeadline >= deadline, timerDeadline - deadline < 1_000_000 { return }
        timerDeadline = deadline
        timer.fireDate = RunLoop.instant(ofNanoseconds: deadline)
        if !timerScheduled {
            timerScheduled = true
            for mode in modes { loop.add(timer, forMode: mode) }
        }
    }

    // MARK: GLib's iteration

    /// Prepare and query: returns whether a source is ready and GLib's timeout (ms, -1: none).
    private func prepareAndQuery() -> (ready: Bool, timeoutMs: Int32) {
        ownIteration = true
        defer { ownIteration = false }
        var priority: Int32 = 0
        let ready = g_main_context_prepare(context, &priority) != 0
        var timeout: Int32 = -1
        var needed = g_main_context_query(context, priority, &timeout, fds, Int32(capacity))
        while Int(needed) > capacity {
            fds.deallocate()
            capacity = max(Int(needed), capacity * 2)
            fds = .allocate(capacity: capacity)
            needed = g_main_context_query(context, priority, &timeout, fds, Int32(capacity))
        }
        count = needed
        maxPriority = priority
        prepared = true
        sync()
        return (ready, timeout)
    }

    /// Check and dispatch (after a prepare and query, made now if this pass has none).
    /// `pollDescriptors`: read each descriptor's readiness (g_poll with no timeout); otherwise none
    /// is ready.
    private func iterate(pollDescriptors: Bool) {
        if !prepared { _ = prepareAndQuery() }
        prepared = false
        var anyReady = false
        if pollDescriptors && count > 0 {
            anyReady = g_poll(fds, UInt32(count), 0) > 0
        } else {
            for index in 0..<Int(count) { fds[index].revents = 0 }
        }
        if pollDescriptors {
            // Woken for GLib's descriptors: re-register them at the next sync (a wake of GLib's own
            // eventfd follows every change of its descriptors). Found none ready twice in a row:
            // the epoll set holds a registration GLib does not (see `spuriousWakes`).
            revalidate = true
            spuriousWakes = anyReady ? 0 : spuriousWakes + 1
            if spuriousWakes >= 2 {
                spuriousWakes = 0
                remakeEpollSet()
            }
        }
        ownIteration = true
        let ready = g_main_context_check(context, maxPriority, fds, count) != 0
        ownIteration = false
        guard ready else { return }
        dispatchDepth += 1
        g_main_context_dispatch(context)
        dispatchDepth -= 1
        if dispatchDepth == 0 && releasePending { finishTeardown() }
    }

    // MARK: The epoll set

    /// Brings the epoll set in line with the descriptors the last query returned (both sorted by
    /// descriptor; GLib merges a descriptor's entries into one).
    private func sync() {
        let ownLoopDescriptor = reverse?.pollDescriptor ?? -1
        if !revalidate && unwatchable.isEmpty && isRegistered(ownLoopDescriptor) { return }
        var next = syncing
        syncing = []
        next.removeAll(keepingCapacity: true)
        if !unwatchable.isEmpty { unwatchable.removeAll(keepingCapacity: true) }
        var old = 0
        for index in 0..<Int(count) {
            let entry = fds[index]
            let events = Self.epollEvents(entry.events)
            // Entries without events (the reverse source's, inert), and the loop's own epoll set,
            // which must not go into this one (ELOOP).
            guard entry.fd >= 0, events != 0, entry.fd != ownLoopDescriptor else { continue }
            while old < registered.count && registered[old].fd < entry.fd {
                unregister(registered[old].fd)
                old += 1
            }
            var isRegistered = false
            if old < registered.count && registered[old].fd == entry.fd {
                isRegistered = true
                let previous = registered[old].events
                old += 1
                if previous == events && !revalidate {
                    next.append((entry.fd, events))
                    continue
                }
            }
            if register(entry.fd, events, modify: isRegistered) {
                next.append((entry.fd, events))
            }
        }
        while old < registered.count {
            unregister(registered[old].fd)
            old += 1
        }
        syncing = registered
        registered = next
        revalidate = false
    }

    /// Whether the last query's descriptors are those registered, with the same events (the
    /// usual case: nothing to do, and nothing allocated).
    private func isRegistered(_ ownLoopDescriptor: Int32) -> Bool {
        var next = 0
        for index in 0..<Int(count) {
            let entry = fds[index]
            let events = Self.epollEvents(entry.events)
            guard entry.fd >= 0, events != 0, entry.fd != ownLoopDescriptor else { continue }
            guard next < registered.count, registered[next].fd == entry.fd, registered[next].events == events else {
                return false
            }
            next += 1
        }
        return next == registered.count
    }

    /// Registers (or re-registers) `fd`; false when epoll refuses it (then it is unwatchable, or
    /// ignored when it is an epoll set that holds this one).
    private func register(_ fd: Int32, _ events: UInt32, modify: Bool) -> Bool {
        var result = crlg_epoll_ctl(epollFD, modify ? EPOLL_CTL_MOD : EPOLL_CTL_ADD, fd, events)
        if result != 0 && errno == (modify ? ENOENT : EEXIST) {
            // MOD of a number whose file changed (closed and reopened) / ADD of a registered one.
            result = crlg_epoll_ctl(epollFD, modify ? EPOLL_CTL_ADD : EPOLL_CTL_MOD, fd, events)
        }
        guard result != 0 else { return true }
        switch errno {
        case EPERM, EBADF:
            // A regular file or a directory (poll() says ready, always), or a closed number
            // (poll() says POLLNVAL): GLib must see it on every pass, as its own poll() would.
            unwatchable.append(fd)
        default:
            // ELOOP/EINVAL: an epoll set that holds this one (a loop's own), or anything epoll
            // cannot take: left to GLib's own poll in its nested loops.
            Self.logger.warning("RunLoopGLib cannot watch GLib's descriptor \(fd): \(String(cString: strerror(errno)))")
        }
        return false
    }

    private func unregister(_ fd: Int32) {
        // ENOENT/EBADF: closed already (the kernel dropped the registration with the file).
        _ = crlg_epoll_ctl(epollFD, EPOLL_CTL_DEL, fd, 0)
    }

    /// A new epoll set with the descriptors GLib watches now, in place of the old one (which may
    /// hold a registration no number can delete: a file closed here and open elsewhere).
    private func remakeEpollSet() {
        let descriptor = crlg_epoll_create()
        guard descriptor >= 0, let newSource = try? makeEpollSource(descriptor) else {
            if descriptor >= 0 { close(descriptor) }
            return
        }
        epollSource?.invalidate()
        epollFD = descriptor
        epollSource = newSource
        for mode in modes { loop.add(newSource, forMode: mode) }
        registered = []
        sync()
    }

    static func epollEvents(_ events: UInt16) -> UInt32 {
        var bits: UInt32 = 0
        if events & UInt16(G_IO_IN.rawValue) != 0 { bits |= EPOLLIN.rawValue }
        if events & UInt16(G_IO_OUT.rawValue) != 0 { bits |= EPOLLOUT.rawValue }
        if events & UInt16(G_IO_PRI.rawValue) != 0 { bits |= EPOLLPRI.rawValue }
        return bits
    }

    // MARK: Nested GLib loops (the reverse source's side)

    /// GLib is being iterated by someone else on the loop's thread: the bridge's prepared state is
    /// stale, and GLib's descriptors are GLib's own to poll (the loop must not wake for them in
    /// its passes run from the reverse source).
    func foreignIterationBegins() {
        prepared = false
        if let epollSource, epollSource.watchedEvents != [] { epollSource.watchedEvents = [] }
        // GLib's descriptors may change meanwhile without the bridge seeing GLib's wakeup.
        revalidate = true
    }

    // MARK: Teardown

    func invalidate() {
        guard attached.exchange(false, ordering: .acquiringAndReleasing) else { return }
        // GLib is not usable in a child of fork(); the loop, from before the fork, is not either.
        if RunLoop.isForkedChild || loop.wasMadeBeforeFork { return }
        if loop.isCurrent {
            tearDown()
        } else {
            let modes = Array(Set(modes + [.common]))
            loop.perform(inModes: modes) { [self] in tearDown() }
        }
    }

    /// The loop's thread exits with the bridge attached: its teardown (on that thread) invalidated
    /// the kick source (its onCancel). The context is released there, and the items let go (they
    /// hold the driver).
    private func loopLetGo() {
        guard !tornDown else { return }
        attached.store(false, ordering: .releasing)
        tearDown()
    }

    /// Removes the items and the reverse source, then releases the context (or lets the
    /// dispatch in progress release it when it returns). Loop thread.
    private func tearDown() {
        guard !tornDown else { return }
        tornDown = true
        describer?.cancel()
        describer = nil
        observer?.invalidate()
        timer?.invalidate()
        kick?.invalidate()
        // Closes the epoll descriptor (the source owns it).
        epollSource?.invalidate()
        observer = nil
        timer = nil
        kick = nil
        epollSource = nil
        reverse?.destroy()
        reverse = nil
        if dispatchDepth > 0 {
            releasePending = true
        } else {
            finishTeardown()
        }
    }

    private func finishTeardown() {
        releasePending = false
        release()
    }

    /// Gives the context back (once).
    private func release() {
        guard !released else { return }
        released = true
        g_main_context_release(context)
        g_main_context_unref(context)
        GLibDriver.registry.locked { _ = $0.remove(UInt(bitPattern: context)) }
    }
}
#endif
