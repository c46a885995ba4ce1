#if SwiftNIO
import Glibc
import Logging
public import NIOCore
public import NIOPosix
import RunLoopKit
public import RunLoopMonitor
import Synchronization

// SwiftNIO's event loop thread alternates between waiting in epoll_wait, handling the I/O events
// it got (where channel handlers run), and a tick (the tasks that are due); NIO reports the end of
// each tick to a NIOEventLoopMetricsDelegate, on the loop's thread. What the monitor needs from
// it: "the loop finished a tick at T" (a new unit of work from then on) and "the loop is waiting"
// (its thread is parked in epoll_wait: read from the kernel by the monitor, not reported).
//
// A slot belongs to one loop thread at a time. NIO names a loop by its address, which a loop made
// after another was freed may reuse: so a slot is given back when its thread exits (a thread-exit
// destructor), and a thread that finds its loop's address in a slot another thread ticked in
// takes it over with nothing of the old thread's kept (its descriptor, its stamps). Every change
// of a slot's owner happens under the slot's lock and bumps its generation; the tick itself (the
// slot already this thread's) takes no lock.

/// A `NIOEventLoopMetricsDelegate` that publishes each event loop's ticks for a `StallMonitor`:
/// give it to the group when you make it, then watch the group with it.
///
/// <!-- snippet: prelude
/// import NIOPosix
/// import RunLoopMonitor
/// -->
/// ```swift
/// let ticks = NIOEventLoopTicks()
/// let group = MultiThreadedEventLoopGroup(numberOfThreads: 4, metricsDelegate: ticks)
/// let monitor = StallMonitor(loops: [], threshold: .milliseconds(100))
/// monitor.watch(group, ticks: ticks)
/// monitor.start { event in print(event.report.loop, event.report.duration, event.report.stuckIn ?? "?") }
/// ```
///
/// On the loop's thread, each tick costs a scan of at most `capacity` atomic words (to find the
/// loop's slot), two atomic stores and no allocation, no lock, no clock read (NIO reads the clock
/// for its delegate anyway). A loop's slot is given back when its thread exits (its group shut
/// down), so groups made and shut down one after another can share one delegate: ``slotsInUse``
/// counts the loops alive that it watches. More loops alive at once than `capacity` are not
/// watched through ticks (their ticks are counted in ``overflowingTicks``, and the first time it
/// happens a warning is logged); `StallMonitor.watch(_:ticks:heartbeat:)` watches them by
/// heartbeats.
public final class NIOEventLoopTicks: NIOEventLoopMetricsDelegate, Sendable {
    /// How many event loops it has room for at once.
    public let capacity: Int
    let slots: [TickSlot]
    private let overflow = Atomic<Int>(0)
    private let warnedFull = Atomic<Bool>(false)
    private let logger: Logger?

    /// Room for `capacity` event loops alive at once (at least the group's `numberOfThreads`);
    /// `logger` gets one warning the first time more loops than that report ticks or are watched
    /// (label `MonitorReporting.loggerLabel` by default; nil for none).
    ///
    /// - Precondition: `capacity` is between 1 and 4096.
    public init(capacity: Int = 64, logger: Logger? = Logger(label: MonitorReporting.loggerLabel)) {
        fatalPrecondition((1...4096).contains(capacity), "NIOEventLoopTicks: capacity must be between 1 and 4096 (got \(capacity))")
        self.capacity = capacity
        self.logger = logger
        slots = (0..<capacity).map { _ in TickSlot() }
    }

    /// Ticks reported by loops that found no free slot.
    public var overflowingTicks: Int { overflow.load(ordering: .relaxed) }

    /// How many slots belong to a loop now: loops that ticked or were watched, and whose thread
    /// has not exited.
    public var slotsInUse: Int { slots.count { $0.loopID.load(ordering: .relaxed) != 0 } }

    /// NIO calls this on the loop's thread after each tick.
    public func processedTick(info: NIOEventLoopTickInfo) {
        _recordTick(loopID: info.eventLoopID, endUptimeNanoseconds: info.endTime.uptimeNanoseconds)
    }

    /// What ``processedTick(info:)`` does with a tick: the benchmarks call it directly (NIO's
    /// tick info cannot be made outside NIO) to measure its cost per tick.
    @_spi(Benchmarks)
    @inline(never)
    public func _recordTick(loopID: ObjectIdentifier, endUptimeNanoseconds: UInt64) {
        let id = UInt(bitPattern: loopID)
        guard let slot = slot(for: id) else {
            overflow.add(1, ordering: .relaxed)
            noteFull()
            return
        }
        // The thread, by its pthread_t (a TLS read): a slot this thread does not own yet (its
        // first tick, or a loop at a freed loop's address) is taken over, under the slot's lock.
        if slot.pthread.load(ordering: .relaxed) != UInt(pthread_self()) {
            guard slot.adopt(loopID: id) != nil else { return }  // given back meanwhile: the next tick claims again
        }
        slot.lastTickEndNs.store(endUptimeNanoseconds.clampedToInt64, ordering: .relaxed)
        slot.ticks.add(1, ordering: .releasing)
    }

    /// The loop's slot, claimed on first use.
    func slot(for id: UInt) -> TickSlot? {
        for slot in slots where slot.loopID.load(ordering: .acquiring) == id { return slot }
        for slot in slots where slot.loopID.load(ordering: .relaxed) == 0 {
            let (exchanged, current) = slot.loopID.compareExchange(expected: 0, desired: id, ordering: .acquiringAndReleasing)
            if exchanged || current == id { return slot }
        }
        return nil
    }

    /// More loops than slots: said once, on whichever thread found out (a loop's, or a `watch`
    /// caller's).
    func noteFull() {
        guard !warnedFull.exchange(true, ordering: .relaxed) else { return }
        logger?.warning(
            "NIOEventLoopTicks: more than \(capacity) event loops at once; the loops beyond its capacity are not watched through ticks (StallMonitor.watch falls back to heartbeats for them). Make it with a larger capacity.",
            metadata: ["capacity": "\(capacity)"])
    }
}

/// One event loop's published ticks.
final class TickSlot: Sendable {
    /// The loop's `ObjectIdentifier`, as bits; 0 while free. Set from 0 by a claim (any thread);
    /// set back to 0 only under `owner`, by the owning thread's exit.
    let loopID = Atomic<UInt>(0)
    let ticks = Atomic<UInt64>(0)
    /// NIO's clock (`NIODeadline.uptimeNanoseconds`: CLOCK_MONOTONIC) at the end of the last tick.
    let lastTickEndNs = Atomic<Int64>(0)
    let threadID = Atomic<Int32>(0)
    /// The owning thread's pthread_t, to notice a new thread cheaply; 0 while none owns it.
    let pthread = Atomic<UInt>(0)
    /// Bumped whenever the slot's thread changes (a thread takes it over, or gives it back at its
    /// exit): a source made for a loop remembers the generation its loop's thread got, and takes
    /// any other for its thread's exit.
    let generation = Atomic<UInt64>(1)
    /// The loop's own epoll descriptor and the thread it was learnt for (see `LoopWait`).
    let wait = LoopWait(calls: LoopWait.epollWaitCalls)
    /// The one source made for this slot's loop (several `watch` calls share it); changes of the
    /// slot's owner are made under this lock. Weak: the source holds the slot, and the loop holds
    /// the delegate that holds the slot.
    let owner = Mutex(Weak<NIOEventLoopStallSource>())

    /// Makes the calling thread the slot's owner if it is not already, for loop `id` (nil when
    /// the slot no longer belongs to that loop); returns the generation it owns. Loop's thread.
    @discardableResult
    func adopt(loopID id: UInt) -> UInt64? {
        let thread = UInt(pthread_self())
        let adopted = owner.locked { _ -> UInt64? in
            guard loopID.load(ordering: .relaxed) == id else { return nil }
            if pthread.load(ordering: .relaxed) == thread { return generation.load(ordering: .relaxed) }
            // A new thread: nothing of the last one's is kept. Its descriptor was learnt for its
            // tid (`wait` ignores it for another), its stamps are its ticks'.
            wait.forget()
            lastTickEndNs.store(0, ordering: .relaxed)
            threadID.store(ProcessThreads.ownID, ordering: .relaxed)
            pthread.store(thread, ordering: .relaxed)
            return generation.add(1, ordering: .acquiringAndReleasing).newValue
        }
        if adopted != nil { SlotsOfThread.register(self) }
        return adopted
    }

    /// Gives the slot back if the calling thread, which is exiting, still owns it.
    func giveBack() {
        let thread = UInt(pthread_self())
        owner.locked { owner in
            guard pthread.load(ordering: .relaxed) == thread else { return }  // taken over since
            generation.add(1, ordering: .relaxed)
            owner.value = nil
            wait.forget()
            lastTickEndNs.store(0, ordering: .relaxed)
            threadID.store(0, ordering: .relaxed)
            pthread.store(0, ordering: .relaxed)
            // Last, with release: whoever claims it sees it clean.
            loopID.store(0, ordering: .releasing)
        }
    }
}

/// The slots a thread owns, given back by a thread-exit destructor (one key for the process).
private final class SlotsOfThread {
    var slots: [TickSlot] = []

    static let key: pthread_key_t = {
        var key = pthread_key_t()
        let status = pthread_key_create(&key) { raw in
            guard let raw else { return }
            let owned = Unmanaged<SlotsOfThread>.fromOpaque(raw).takeRetainedValue()
            for slot in owned.slots { slot.giveBack() }
        }
        fatalPrecondition(status == 0, "RunLoopMonitorNIO: pthread_key_create failed (\(status))")
        return key
    }()

    /// Remembers `slot` for the calling thread's exit. The loop's thread, when it takes a slot.
    static func register(_ slot: TickSlot) {
        if let raw = pthread_getspecific(key) {
            let owned = Unmanaged<SlotsOfThread>.fromOpaque(raw).takeUnretainedValue()
            if !owned.slots.contains(where: { $0 === slot }) { owned.slots.append(slot) }
        } else {
            let owned = SlotsOfThread()
            owned.slots.append(slot)
            pthread_setspecific(key, Unmanaged.passRetained(owned).toOpaque())
        }
    }
}

extension UInt64 {
    var clampedToInt64: Int64 { self > UInt64(Int64.max) ? Int64.max : Int64(self) }
}

/// An event loop watched through its ticks (see ``NIOEventLoopTicks``).
///
/// Busy while its thread is not parked in its own `epoll_wait` (read from
/// `/proc/self/task/<tid>/syscall` by the monitor, once per look; a handler waiting in an epoll set
/// of its own counts as busy); a unit of work ends with each tick NIO reports. So a handler that
/// blocks (in a `read`, a `usleep`, a long computation) is one stall, timed from the last look that
/// saw the loop waiting to the next tick; a loop whose ticks are short is never stalled. One tick
/// runs every task that is ready, so a stream of short tasks that keeps it going longer than the
/// threshold (tasks queued from other threads as fast as the loop runs them) is one stall too: the
/// loop answers nothing else meanwhile. A loop the kernel's file cannot be read for (no descriptor
/// left) is taken as waiting while that lasts. The source ends (the monitor forgets it) when its
/// loop's thread exits.
public final class NIOEventLoopStallSource: StallSource {
    /// The loop's thread name (`NIO-ELT-0-#1`), once known.
    public var stallSourceName: String {
        let id = threadID
        return (id != 0 ? ProcessThreads.name(of: id) : nil) ?? "NIO event loop"
    }
    private let slot: TickSlot
    private let prepared = Atomic<Bool>(false)
    /// The slot's generation while its loop's thread owns it, learnt on that thread; 0 before.
    private let generation = Atomic<UInt64>(0)
    /// The loop's thread as last read while it owned the slot: the exit's report names it.
    private let lastThread = Atomic<Int32>(0)
    private let loopID: UInt
    /// Weak: the loop holds its metrics delegate, which holds this source's slot.
    private weak let loop: (any EventLoop)?

    init(loop: any EventLoop, slot: TickSlot) {
        self.loop = loop
        self.loopID = UInt(bitPattern: ObjectIdentifier(loop))
        self.slot = slot
    }

    /// Whether this source was made for `loop` (not for a freed loop at its address).
    func isSource(of loop: any EventLoop) -> Bool { self.loop === loop }

    /// The loop's thread's kernel id; 0 until the loop's first tick or the monitor's first block
    /// ran, and after its thread exited.
    public var threadID: Int32 {
        let owned = generation.load(ordering: .acquiring)
        guard owned != 0, slot.generation.load(ordering: .acquiring) == owned else { return 0 }
        return slot.threadID.load(ordering: .relaxed)
    }

    /// NIO's ticks and where the kernel has the thread.
    public func stallSnapshot() -> StallSnapshot {
        let owned = generation.load(ordering: .acquiring)
        let ticks = slot.ticks.load(ordering: .acquiring)
        guard owned != 0 else {
            // The loop's thread has not taken the slot yet: not watched. A loop already gone (shut
            // down before it was watched) never will.
            return StallSnapshot(activity: .notRunning, threadID: 0, work: ticks, phase: "tick", item: "", threadExited: loop == nil)
        }
        let id = slot.threadID.load(ordering: .relaxed)
        // The thread exited (and gave the slot back, or a new loop's thread took it): ended.
        guard slot.generation.load(ordering: .acquiring) == owned, id != 0 else {
            return StallSnapshot(
                activity: .idle, threadID: lastThread.load(ordering: .relaxed), work: ticks, phase: "tick", item: "",
                threadExited: true)
        }
        lastThread.store(id, ordering: .relaxed)
        let lastEnd = Self.instant(ofMonotonicNanoseconds: slot.lastTickEndNs.load(ordering: .relaxed))
        let waiting: Bool
        switch slot.wait.read(threadID: id, mayLearn: true) {
        case .gone:
            return StallSnapshot(activity: .idle, threadID: id, work: ticks, phase: "tick", item: "", threadExited: true)
        case .parked, .unknown:
            // Unknown: the kernel's file cannot be read now (no descriptor left): no judgement,
            // no stall.
            waiting = true
        case .busy:
            waiting = false
        }
        return StallSnapshot(
            activity: waiting ? .idle : .busy, threadID: id, work: ticks, busySince: lastEnd,
            idleSince: waiting ? lastEnd : nil, phase: "tick", item: waiting ? "" : "event loop tick")
    }

    /// The system calls an idle event loop waits in, on this architecture; empty where they are
    /// not known here (the loops are then watched by heartbeats).
    static var waitCalls: Set<Int> { LoopWait.epollWaitCalls }

    /// `NIODeadline` nanoseconds (CLOCK_MONOTONIC) as an instant of the loop clock (the monitor's
    /// `ContinuousClock`, CLOCK_BOOTTIME): the two differ by the time the machine was suspended,
    /// read now.
    ///
    /// The monotonic read is bracketed by two of the loop clock and placed at their midpoint: a
    /// thread preempted between one read and the next would otherwise shift every instant by the
    /// time it waited (a stall timed from its start would come out that much short). The
    /// tightest of a few brackets is kept; it is a few hundred nanoseconds wide unless the thread
    /// is preempted every time.
    static func instant(ofMonotonicNanoseconds ns: Int64) -> ContinuousClock.Instant? {
        guard ns > 0 else { return nil }
        var best: (width: Duration, instant: ContinuousClock.Instant)?
        for _ in 0..<4 {
            let before = ContinuousClock.now
            let nowMonotonic = Int64(NIODeadline.now().uptimeNanoseconds.clampedToInt64)
            let after = ContinuousClock.now
            let width = after - before
            if best == nil || width < best!.width {
                best = (width, before + width / 2 - .nanoseconds(nowMonotonic - ns))
            }
            if width < .microseconds(20) { break }
        }
        return best?.instant
    }

    /// Runs `ThreadStack.prepareCurrentThread()` on the loop, where the loop's thread takes its
    /// slot (if its first tick has not yet) and the source learns which generation of the slot is
    /// its loop's.
    public func prepareForStallMonitoring() {
        guard !prepared.exchange(true, ordering: .relaxed) else { return }
        loop?.execute { [self] in
            if let owned = slot.adopt(loopID: loopID) { generation.store(owned, ordering: .releasing) }
            ThreadStack.prepareCurrentThread()
        }
    }
}

extension StallMonitor {
    /// Watches every event loop of `group`: through `ticks` when the group was made with it as
    /// its metrics delegate (``NIOEventLoopTicks``), or else by a heartbeat (`EventLoop.execute`;
    /// see `HeartbeatStallSource`). Returns the sources, one per loop. Any thread, before or after
    /// `start`; nothing waits for the loops.
    ///
    /// Through ticks, a stall is found within threshold + sample interval and timed to within a
    /// sample interval at each end. By heartbeats, once a loop's first heartbeat has run (which
    /// tells the source the loop's thread), the source reads that thread's kernel state at each
    /// look, as the tick source does (parked in its own `epoll_wait`: waiting; anywhere else:
    /// busy), and sends a heartbeat only when a look finds the loop busy: a stall is found and
    /// timed as precisely as through ticks, and one ends when the loop answers its heartbeat or
    /// parks. What heartbeats cannot see: the work between two ticks (a loop kept out of
    /// `epoll_wait` by a stream of short tasks answers its heartbeats, so it is stalled only if a
    /// heartbeat waits longer than the threshold), and, before the first heartbeat ran or where
    /// the kernel's file cannot be read, anything but the heartbeat's latency (a stall then is
    /// found within threshold + `heartbeat` + sample interval, and timed from the heartbeat's
    /// send, so up to `heartbeat` short).
    ///
    /// Shutting the group down while it is watched is fine: each loop's thread exits, and the
    /// monitor forgets its source (no stall is reported for the shutdown). With heartbeats, a
    /// heartbeat sent in the moment between a loop's close and its thread's exit makes NIO print
    /// "Cannot schedule tasks on an EventLoop that has already shut down" (a crash under
    /// `SWIFTNIO_STRICT`): unwatch the group's sources (`StallMonitor.unwatch(_:)`) before
    /// shutting it down to avoid it.
    @discardableResult
    public func watch(
        _ group: MultiThreadedEventLoopGroup, ticks: NIOEventLoopTicks? = nil, heartbeat: Duration = .milliseconds(100)
    ) -> [any StallSource] {
        group.makeIterator().map { loop in watch(loop, ticks: ticks, heartbeat: heartbeat) }
    }

    /// Watches one event loop (see ``watch(_:ticks:heartbeat:)-(MultiThreadedEventLoopGroup,_,_)``).
    @discardableResult
    public func watch(_ loop: any EventLoop, ticks: NIOEventLoopTicks? = nil, heartbeat: Duration = .milliseconds(100)) -> any StallSource {
        let id = UInt(bitPattern: ObjectIdentifier(loop))
        let slot = ticks.flatMap { ticks in LoopWait.epollWaitCalls.isEmpty ? nil : ticks.slot(for: id) }
        if ticks != nil, slot == nil, !LoopWait.epollWaitCalls.isEmpty { ticks?.noteFull() }
        let source: any StallSource
        if let slot {
            // One source per loop, however many times it is watched (the monitor watches a source
            // once; two monitors share it); a source made for a freed loop at this address is not
            // this loop's.
            source = slot.owner.locked { made in
                if let existing = made.value, existing.isSource(of: loop) { return existing }
                let new = NIOEventLoopStallSource(loop: loop, slot: slot)
                made.value = new
                return new
            }
        } else {
            source = HeartbeatStallSource(
                name: nil, interval: heartbeat, threadIsFixed: true, parkedIn: LoopWait(calls: LoopWait.epollWaitCalls)
            ) { beat in
                loop.execute(beat)
                return true
            }
        }
        watch(source)
        source.prepareForStallMonitoring()
        return source
    }
}
#endif
