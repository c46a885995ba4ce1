#if SwiftNIO
public import NIOCore
public import NIOPosix
import Glibc
import RunLoopKit
public import RunLoopMonitor
import Synchronization

// SwiftNIO's event loop thread alternates between waiting in epoll_wait, handling the I/O events
// it got (where channel handlers run), and a tick (the tasks that are due); NIO reports the end of
// each tick to a NIOEventLoopMetricsDelegate, on the loop's thread. What the monitor needs from
// it: "the loop finished a tick at T" (a new unit of work from then on) and "the loop is waiting"
// (its thread is parked in epoll_wait: read from the kernel by the monitor, not reported).

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
/// for its delegate anyway). Loops beyond `capacity` are not watched through ticks (counted in
/// ``overflowingTicks``); `StallMonitor.watch(_:ticks:heartbeat:)` watches them by heartbeats.
public final class NIOEventLoopTicks: NIOEventLoopMetricsDelegate, Sendable {
    /// How many event loops it has room for.
    public let capacity: Int
    let slots: [TickSlot]
    private let overflow = Atomic<Int>(0)

    /// Room for `capacity` event loops (at least the group's `numberOfThreads`).
    ///
    /// - Precondition: `capacity` is between 1 and 4096.
    public init(capacity: Int = 64) {
        fatalPrecondition((1...4096).contains(capacity), "NIOEventLoopTicks: capacity must be between 1 and 4096 (got \(capacity))")
        self.capacity = capacity
        slots = (0..<capacity).map { _ in TickSlot() }
    }

    /// Ticks reported by loops that found no free slot.
    public var overflowingTicks: Int { overflow.load(ordering: .relaxed) }

    /// NIO calls this on the loop's thread after each tick.
    public func processedTick(info: NIOEventLoopTickInfo) {
        _recordTick(loopID: info.eventLoopID, endUptimeNanoseconds: info.endTime.uptimeNanoseconds)
    }

    /// What ``processedTick(info:)`` does with a tick: the benchmarks call it directly (NIO's
    /// tick info cannot be made outside NIO) to measure its cost per tick.
    @_spi(Benchmarks)
    @inline(never)
    public func _recordTick(loopID: ObjectIdentifier, endUptimeNanoseconds: UInt64) {
        guard let slot = slot(for: UInt(bitPattern: loopID)) else {
            overflow.add(1, ordering: .relaxed)
            return
        }
        // The thread, by its pthread_t (a TLS read): a slot reused by a new loop at a freed loop's
        // address gets its own thread's id, with one gettid() when the thread changes.
        let thread = UInt(pthread_self())
        if slot.pthread.load(ordering: .relaxed) != thread {
            slot.threadID.store(ProcessThreads.ownID, ordering: .relaxed)
            slot.pthread.store(thread, ordering: .relaxed)
        }
        slot.lastTickEndNs.store(endUptimeNanoseconds.clampedToInt64, ordering: .relaxed)
        slot.ticks.add(1, ordering: .releasing)
    }

    /// The loop's slot, claimed on first use.
    func slot(for id: UInt) -> TickSlot? {
        for slot in slots {
            let owner = slot.loopID.load(ordering: .acquiring)
            if owner == id { return slot }
            if owner == 0 {
                let (exchanged, current) = slot.loopID.compareExchange(expected: 0, desired: id, ordering: .acquiringAndReleasing)
                if exchanged || current == id { return slot }
            }
        }
        return nil
    }
}

/// One event loop's published ticks.
final class TickSlot: Sendable {
    /// The loop's `ObjectIdentifier`, as bits; 0 while free.
    let loopID = Atomic<UInt>(0)
    let ticks = Atomic<UInt64>(0)
    /// NIO's clock (`NIODeadline.uptimeNanoseconds`: CLOCK_MONOTONIC) at the end of the last tick.
    let lastTickEndNs = Atomic<Int64>(0)
    let threadID = Atomic<Int32>(0)
    /// The thread's pthread_t, to notice a new thread cheaply.
    let pthread = Atomic<UInt>(0)
    /// The loop's own epoll descriptor, learnt by the monitor (+1; 0 while unknown).
    let epollDescriptor = Atomic<UInt64>(0)
    /// The one source made for this loop while it is in use (several `watch` calls share it).
    /// Weak: the source holds the slot, and the loop holds the delegate that holds the slot.
    let source = Mutex(WeakSource())

    struct WeakSource {
        weak var source: NIOEventLoopStallSource?
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
/// left) is taken as waiting while that lasts.
public final class NIOEventLoopStallSource: StallSource {
    /// The loop's thread name (`NIO-ELT-0-#1`), once known.
    public var stallSourceName: String {
        let id = threadID
        return (id != 0 ? ProcessThreads.name(of: id) : nil) ?? "NIO event loop"
    }
    private let slot: TickSlot
    private let prepared = Atomic<Bool>(false)
    /// Weak: the loop holds its metrics delegate, which holds this source's slot.
    private weak let loop: (any EventLoop)?

    init(loop: any EventLoop, slot: TickSlot) {
        self.loop = loop
        self.slot = slot
    }

    /// The loop's thread's kernel id; 0 until its first tick or the monitor's first block ran.
    public var threadID: Int32 { slot.threadID.load(ordering: .relaxed) }

    /// NIO's ticks and where the kernel has the thread.
    public func stallSnapshot() -> StallSnapshot {
        let id = threadID
        let ticks = slot.ticks.load(ordering: .acquiring)
        guard id != 0 else {
            return StallSnapshot(activity: .notRunning, threadID: 0, work: ticks, phase: "tick", item: "")
        }
        let state = ProcessThreads.kernelState(of: id)
        if state == .gone {
            return StallSnapshot(activity: .idle, threadID: id, work: ticks, phase: "tick", item: "", threadExited: true)
        }
        let lastEnd = Self.instant(ofMonotonicNanoseconds: slot.lastTickEndNs.load(ordering: .relaxed))
        let waiting: Bool
        switch state {
        case .blocked(let call, let descriptor) where Self.waitCalls.contains(call):
            // Waiting in the loop's own epoll set, not in one a handler waits on (a nested
            // CFRunLoop or RunLoopKit run, a library's own poller): the first set the loop is
            // seen waiting in is taken for its own (it is, unless a handler waits in epoll
            // before the monitor ever saw the loop idle).
            let known = slot.epollDescriptor.load(ordering: .relaxed)
            if known == 0 { slot.epollDescriptor.store(descriptor &+ 1, ordering: .relaxed) }
            waiting = known == 0 || known == descriptor &+ 1
        case .unknown:
            // The kernel's file cannot be read now (no descriptor left): no judgement, no stall.
            waiting = true
        default:
            waiting = false
        }
        return StallSnapshot(
            activity: waiting ? .idle : .busy, threadID: id, work: ticks, busySince: lastEnd,
            idleSince: waiting ? lastEnd : nil, phase: "tick", item: waiting ? "" : "event loop tick")
    }

    /// The system calls an idle event loop waits in, on this architecture; empty where they are
    /// not known here (the loops are then watched by heartbeats).
    static let waitCalls: Set<Int> = {
        #if arch(x86_64)
        [232, 281, 441]  // epoll_wait, epoll_pwait, epoll_pwait2
        #elseif arch(arm64)
        [22, 441]  // epoll_pwait, epoll_pwait2
        #else
        []
        #endif
    }()

    /// `NIODeadline` nanoseconds (CLOCK_MONOTONIC) as an instant of the loop clock (the monitor's
    /// `ContinuousClock`, CLOCK_BOOTTIME): the two differ by the time the machine was suspended,
    /// read now.
    static func instant(ofMonotonicNanoseconds ns: Int64) -> ContinuousClock.Instant? {
        guard ns > 0 else { return nil }
        let nowMonotonic = Int64(NIODeadline.now().uptimeNanoseconds.clampedToInt64)
        return ContinuousClock.now - .nanoseconds(nowMonotonic - ns)
    }

    /// Runs `ThreadStack.prepareCurrentThread()` on the loop and records its thread id there.
    public func prepareForStallMonitoring() {
        guard !prepared.exchange(true, ordering: .relaxed) else { return }
        let slot = self.slot
        loop?.execute {
            slot.threadID.store(ProcessThreads.ownID, ordering: .relaxed)
            ThreadStack.prepareCurrentThread()
        }
    }
}

extension StallMonitor {
    /// Watches every event loop of `group`: through `ticks` when the group was made with it as
    /// its metrics delegate (``NIOEventLoopTicks``), or else by a heartbeat every `heartbeat`
    /// (`EventLoop.execute`; see `HeartbeatStallSource`: it sees a stall within threshold +
    /// heartbeat). Returns the sources, one per loop. Any thread, before or after `start`; nothing
    /// waits for the loops.
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
        let source: any StallSource
        if let ticks, !NIOEventLoopStallSource.waitCalls.isEmpty, let slot = ticks.slot(for: id) {
            // One source per loop, however many times it is watched (the monitor watches a source
            // once; two monitors share it).
            source = slot.source.locked { made in
                if let existing = made.source { return existing }
                let new = NIOEventLoopStallSource(loop: loop, slot: slot)
                made.source = new
                return new
            }
        } else {
            source = HeartbeatStallSource(name: nil, interval: heartbeat, threadIsFixed: true) { beat in
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
