import CRunLoopMonitor
import Dispatch
import Glibc
import RunLoopKit
import Synchronization

// What a StallMonitor watches: one thread that alternates between units of work and waiting.
// RunLoopKit's loops publish that in two words the monitor reads (their phase and callout);
// other loops publish it through a conformer of their own: SwiftNIO's event loops
// (RunLoopMonitorNIO, from NIO's tick reports), a libdispatch queue (a heartbeat block), a thread
// the application runs itself (ThreadStallSource, a hook it calls).

/// Something a ``StallMonitor`` can watch: a thread that runs units of work (callouts, ticks,
/// tasks) and waits between them.
///
/// The monitor calls ``stallSnapshot()`` on its sampling thread at every look (once per sample
/// interval): it must be cheap, must not block, and must never wait for the watched thread. A
/// stall is one unit of work (the same ``StallSnapshot/work`` and ``StallSnapshot/step``) seen
/// busy for longer than the threshold; the monitor then samples the stack of
/// ``StallSnapshot/threadID`` as it does for a RunLoopKit loop.
public protocol StallSource: AnyObject, Sendable {
    /// The name in reports, logs and metrics (the `loop` label) unless ``StallMonitor/watch(_:name:)``
    /// gives one.
    var stallSourceName: String { get }

    /// What the watched thread is doing now. Sampling thread; cheap; never waits.
    func stallSnapshot() -> StallSnapshot

    /// Arranges for `ThreadStack.prepareCurrentThread()` to run on the watched thread, if the
    /// source can run code there (a block, a task): a thread that inherited a mask blocking every
    /// signal can then be sampled while it runs. Called once when watching starts.
    func prepareForStallMonitoring()

    /// The mode the thread runs in, for a stall's report (RunLoopKit loops); nil where there is
    /// none. Called once when a stall begins.
    func currentStallMode() -> String?
}

extension StallSource {
    /// No modes.
    public func currentStallMode() -> String? { nil }
}

/// What a watched thread is doing, as a ``StallSource`` sees it.
public struct StallSnapshot: Sendable, Hashable {
    /// Whether the thread is in a unit of work.
    public enum Activity: Sendable, Hashable {
        /// The loop is not running (a RunLoopKit loop between runs): not watched.
        case notRunning
        /// Waiting for work (asleep in the kernel, or between units).
        case idle
        /// In a unit of work.
        case busy
    }

    /// Whether the thread is in a unit of work.
    public var activity: Activity
    /// The thread's kernel id; 0 while it is not known (a heartbeat never answered).
    public var threadID: Int32
    /// Changes whenever a new unit of work begins (a pass, a tick, a heartbeat answered).
    public var work: UInt64
    /// Changes between units of work inside one ``work`` (a callout of a pass); 0 if unused.
    public var step: UInt32
    /// When the current unit of work began, if the source stamps it.
    public var busySince: ContinuousClock.Instant?
    /// Whether ``busySince`` is exactly when the work began (a heartbeat's send time), not only a
    /// stamp the monitor may improve on from its own looks.
    public var busySinceIsExact: Bool
    /// When the thread began to wait, if the source stamps it.
    public var idleSince: ContinuousClock.Instant?
    /// The phase of the work, for reports and the `phase` metric label (`tick`, `heartbeat`,
    /// `timers`…).
    public var phase: String
    /// What runs, for ``StallReport/item``.
    public var item: String
    /// The thread's name when it is known to the source (otherwise read from the kernel).
    public var threadName: String?
    /// Whether the thread has exited (or its loop was shut down): the monitor forgets the source.
    public var threadExited: Bool

    /// A snapshot; see each property.
    public init(
        activity: Activity, threadID: Int32, work: UInt64, step: UInt32 = 0, busySince: ContinuousClock.Instant? = nil,
        busySinceIsExact: Bool = false, idleSince: ContinuousClock.Instant? = nil, phase: String, item: String,
        threadName: String? = nil, threadExited: Bool = false
    ) {
        self.activity = activity
        self.threadID = threadID
        self.work = work
        self.step = step
        self.busySince = busySince
        self.busySinceIsExact = busySinceIsExact
        self.idleSince = idleSince
        self.phase = phase
        self.item = item
        self.threadName = threadName
        self.threadExited = threadExited
    }
}

// MARK: - RunLoopKit loops

extension RunLoop: StallSource {
    /// The loop's thread name.
    public var stallSourceName: String { threadName }

    /// The loop's phase and callout words (what it publishes anyway; reading them costs the loop
    /// nothing).
    public func stallSnapshot() -> StallSnapshot {
        let snapshot = phaseSnapshot
        let callout = calloutSnapshot
        let activity: StallSnapshot.Activity =
            switch snapshot.phase {
            case .notRunning: .notRunning
            case .waiting: .idle
            default: .busy
            }
        // A callout that runs another loop's work (RunLoopGLib's dispatch) may say which: asked
        // only while the loop is busy (one relaxed load when the loop has no describer).
        let item = activity == .busy ? calloutDetail(of: callout) ?? callout.description : callout.description
        return StallSnapshot(
            activity: activity, threadID: threadID, work: snapshot.generation, step: callout.sequence,
            busySince: snapshot.busySince, idleSince: snapshot.phase == .waiting ? snapshot.since : nil,
            phase: snapshot.phase.description, item: item, threadName: nil,
            threadExited: hasThreadExited)
    }

    /// Performs `ThreadStack.prepareCurrentThread()` on the loop's thread at its next pass in a
    /// common mode (before blocks performed after this call).
    public func prepareForStallMonitoring() {
        perform(inModes: [.common]) { ThreadStack.prepareCurrentThread() }
    }

    /// The loop's current mode.
    public func currentStallMode() -> String? { currentMode?.rawValue }
}

// MARK: - Heartbeats

/// A source for a queue or loop that can run a block but publishes nothing: the monitor sends it a
/// heartbeat (a block) every `interval`, and the queue is busy from the moment a heartbeat is sent
/// until it runs. The heartbeat finds the thread: the one that ran the last heartbeat is the one
/// sampled during a stall.
///
/// What it sees is the queue's latency: a stall starts at most `interval` after the work that
/// blocks the queue began (the next heartbeat is sent then), and is reported `threshold` after
/// that; so within `threshold + interval` of its start, and its duration is measured from the
/// heartbeat's send, so up to `interval` short (a stall shorter than `threshold + interval` may
/// be missed). A queue that is merely backed up longer than `threshold` (many short blocks ahead
/// of the heartbeat) is reported too: from outside, the two look alike. A queue that never
/// answers, from its first heartbeat on, is reported as a stall whose report carries
/// `ThreadStackError.threadUnknown` (no thread of it was ever seen).
///
/// - For libdispatch's main queue when no RunLoopKit loop drains it, and any serial
///   `DispatchQueue`: ``init(queue:name:interval:)``. On a serial queue other than the main one,
///   libdispatch may run consecutive blocks on different worker threads: the thread sampled is
///   the one that ran the last heartbeat, so a stall's stack is right when the blocking block
///   runs on that thread (always for the main queue; usually for a queue that is busy).
/// - For SwiftNIO event loops whose group was made without RunLoopMonitorNIO's tick reports:
///   RunLoopMonitorNIO makes heartbeat sources with `EventLoop.execute`, which learn the loop's
///   thread from their first heartbeat and from then on read where the kernel has it at each look
///   (parked in the loop's own `epoll_wait`, or not): a stall is then found within
///   `threshold` + the monitor's sample interval, timed from the last look that saw the loop
///   parked to its heartbeat's answer (within a sample interval at each end), and a heartbeat is
///   sent only when a look finds the loop out of its wait.
///
/// The heartbeat costs the queue one block per `interval` (an allocation and a queue operation)
/// and nothing between.
public final class HeartbeatStallSource: StallSource {
    /// How often a heartbeat is sent.
    public let interval: Duration
    /// The name given at init or, without one, the name of the thread that ran the last heartbeat
    /// (`"heartbeat"` before any ran).
    public var stallSourceName: String {
        if let name { return name }
        let id = state.threadID.load(ordering: .relaxed)
        return (id != 0 ? ProcessThreads.name(of: id) : nil) ?? "heartbeat"
    }
    private let name: String?
    /// Whether the queue always runs on one thread (an event loop, the main queue): the source
    /// then ends, as a loop's does, when that thread exits.
    public let threadIsFixed: Bool
    private let send: @Sendable (@escaping @Sendable () -> Void) -> Bool
    private let state = HeartbeatState()
    /// Where the watched thread waits when idle, for a queue on one thread whose wait the kernel
    /// shows (an event loop's `epoll_wait`); nil: the heartbeat's latency only.
    private let parkedIn: LoopWait?

    /// A source named `name` (nil: its thread's name) that hands each heartbeat to `send`, which runs it on the watched queue and returns
    /// true, or returns false when the queue is gone (its loop shut down): the monitor then forgets
    /// the source. With `threadIsFixed`, the queue runs on one thread only (an event loop's), and
    /// the source ends when that thread exits.
    ///
    /// - Precondition: `interval` is positive.
    public convenience init(
        name: String?, interval: Duration = .milliseconds(100), threadIsFixed: Bool = false,
        send: @escaping @Sendable (_ heartbeat: @escaping @Sendable () -> Void) -> Bool
    ) {
        self.init(name: name, interval: interval, threadIsFixed: threadIsFixed, parkedIn: nil, send: send)
    }

    /// A source as above whose thread, once a heartbeat found it, is judged from the kernel while
    /// `parkedIn` can read it (with `threadIsFixed` only): parked in its own wait, it is idle and
    /// no heartbeat is sent; anywhere else, it is busy from the last look that saw it parked, and
    /// a heartbeat is sent to find when it moves on. (RunLoopMonitorNIO's event loops.)
    package init(
        name: String?, interval: Duration, threadIsFixed: Bool, parkedIn: LoopWait?,
        send: @escaping @Sendable (_ heartbeat: @escaping @Sendable () -> Void) -> Bool
    ) {
        fatalPrecondition(interval > .zero, "HeartbeatStallSource: interval must be positive (got \(interval))")
        self.interval = min(interval, .seconds(86400))
        self.threadIsFixed = threadIsFixed
        self.name = name
        self.send = send
        self.parkedIn = threadIsFixed && parkedIn?.calls.isEmpty == false ? parkedIn : nil
    }

    /// Sends a heartbeat when the last one was answered `interval` ago or more; busy while one is
    /// outstanding. A source that reads its thread's kernel state does that instead, once the
    /// thread is known (see the package initializer that takes `parkedIn`: RunLoopMonitorNIO's event loops).
    public func stallSnapshot() -> StallSnapshot {
        let sent = state.sent.load(ordering: .acquiring)
        let answered = state.answered.load(ordering: .acquiring)
        let lastThread = state.threadID.load(ordering: .relaxed)
        if threadIsFixed, lastThread != 0, !ProcessThreads.exists(lastThread) {
            state.gone.store(true, ordering: .relaxed)
            return StallSnapshot(
                activity: .idle, threadID: lastThread, work: answered, phase: "heartbeat", item: "", threadExited: true)
        }
        if let parkedIn, lastThread != 0, !state.gone.load(ordering: .relaxed),
            let snapshot = kernelSnapshot(threadID: lastThread, parkedIn: parkedIn)
        {
            return snapshot
        }
        if !state.gone.load(ordering: .relaxed), sent == answered,
            Self.nowNs() - state.answeredAt.load(ordering: .acquiring) >= interval.saturatedNanoseconds,
            // Two monitors may watch one source: only the one that moves `sent` on sends, and it
            // stamps the send time after winning (a time read before could be long stale).
            state.sent.compareExchange(expected: sent, desired: sent &+ 1, ordering: .acquiringAndReleasing).exchanged
        {
            state.sentAt.store(Self.nowNs(), ordering: .releasing)
            sendHeartbeat(number: sent &+ 1)
        }
        // One reading of the counters for the whole snapshot.
        let sentNow = state.sent.load(ordering: .acquiring)
        let answeredNow = state.answered.load(ordering: .acquiring)
        let outstanding = sentNow != answeredNow
        // The outstanding heartbeat's send time, once its sender has stamped it: a stamp not later
        // than the last answer is an earlier heartbeat's, so the time is not known yet.
        let sentAt = state.sentAt.load(ordering: .acquiring)
        let answeredAt = state.answeredAt.load(ordering: .acquiring)
        let exact = outstanding && sentAt > answeredAt
        // A queue whose blocks run on any worker thread: the last heartbeat's worker may have been
        // retired since; the stall is then reported without a stack, not taken for an exit.
        var threadID = lastThread
        if outstanding, !threadIsFixed, threadID != 0, !ProcessThreads.exists(threadID) { threadID = 0 }
        return StallSnapshot(
            activity: outstanding ? .busy : .idle, threadID: threadID, work: answeredNow,
            busySince: exact ? RunLoop.instant(ofNanoseconds: sentAt) : nil, busySinceIsExact: exact,
            idleSince: RunLoop.instant(ofNanoseconds: answeredAt), phase: "heartbeat",
            item: outstanding ? "heartbeat \(sentNow) unanswered" : "", threadName: nil,
            threadExited: state.gone.load(ordering: .relaxed) && !outstanding)
    }

    /// The thread judged by where the kernel has it; nil when its file cannot be read now (the
    /// heartbeat's latency is the judgement then).
    ///
    /// Busy from the last look that saw it parked (the monitor's own time) or from its last
    /// heartbeat's answer, if later (the loop moved on then); a heartbeat is sent at the first
    /// look that finds it busy, so one stuck in a unit of work has one outstanding until it moves
    /// on, whose answer stamps the end (`answered` is the unit of work). A loop busy with short
    /// work answers each heartbeat at once: never a stall.
    private func kernelSnapshot(threadID: Int32, parkedIn: LoopWait) -> StallSnapshot? {
        let sent = state.sent.load(ordering: .acquiring)
        let answered = state.answered.load(ordering: .acquiring)
        // The loop's own wait is learnt when nothing is outstanding: a thread parked then is the
        // loop waiting for work (a heartbeat just sent may not have woken it yet).
        switch parkedIn.read(threadID: threadID, mayLearn: sent == answered) {
        case .unknown:
            return nil
        case .gone:
            state.gone.store(true, ordering: .relaxed)
            return StallSnapshot(
                activity: .idle, threadID: threadID, work: answered, phase: "heartbeat", item: "", threadExited: true)
        case .parked:
            // A heartbeat outstanding while the loop waits was sent just now: its answer stamps
            // nothing of this wait.
            let answeredAt = state.answeredAt.load(ordering: .acquiring)
            return StallSnapshot(
                activity: .idle, threadID: threadID, work: answered,
                idleSince: sent == answered ? RunLoop.instant(ofNanoseconds: answeredAt) : nil, phase: "heartbeat", item: "")
        case .busy:
            if sent == answered,
                state.sent.compareExchange(expected: sent, desired: sent &+ 1, ordering: .acquiringAndReleasing).exchanged
            {
                state.sentAt.store(Self.nowNs(), ordering: .releasing)
                sendHeartbeat(number: sent &+ 1)
            }
            let sentNow = state.sent.load(ordering: .acquiring)
            let answeredNow = state.answered.load(ordering: .acquiring)
            let answeredAt = state.answeredAt.load(ordering: .acquiring)
            return StallSnapshot(
                activity: .busy, threadID: threadID, work: answeredNow, busySince: RunLoop.instant(ofNanoseconds: answeredAt),
                phase: "heartbeat", item: sentNow != answeredNow ? "heartbeat \(sentNow) unanswered" : "event loop work")
        }
    }

    private static func nowNs() -> Int64 { RunLoop.nanoseconds(of: ContinuousClock.now) }

    private func sendHeartbeat(number: UInt64) {
        let state = self.state
        let accepted = send {
            let id = crlm_gettid()
            if state.threadID.exchange(id, ordering: .relaxed) != id { ThreadStack.prepareCurrentThread() }
            state.answeredAt.store(Self.nowNs(), ordering: .releasing)
            state.answered.store(number, ordering: .releasing)
        }
        if !accepted {
            state.gone.store(true, ordering: .relaxed)
            state.answered.store(number, ordering: .releasing)  // nothing outstanding on a queue that is gone
        }
    }

    /// Sends the first heartbeat at once (it finds, and prepares, the thread); later ones come
    /// with the monitor's looks.
    public func prepareForStallMonitoring() { _ = stallSnapshot() }
}

extension HeartbeatStallSource {
    /// A heartbeat source for a serial `DispatchQueue` (the main queue included), named after the
    /// queue's label unless `name` is given: each heartbeat is a `queue.async` block.
    public convenience init(queue: DispatchQueue, name: String? = nil, interval: Duration = .milliseconds(100)) {
        self.init(name: name ?? queue.label, interval: interval) { heartbeat in
            queue.async(execute: heartbeat)
            return true
        }
    }
}

/// A heartbeat's shared words: written by the monitor (sent) and by the watched queue (answered).
private final class HeartbeatState: Sendable {
    let sent = Atomic<UInt64>(0)
    let sentAt = Atomic<Int64>(0)
    let answered = Atomic<UInt64>(0)
    let answeredAt = Atomic<Int64>(Int64.min / 2)
    let threadID = Atomic<Int32>(0)
    let gone = Atomic<Bool>(false)
}

// MARK: - A loop's own wait

/// Whether a loop's thread is parked in its own wait (an event loop's `epoll_wait` on its own
/// epoll set), read from `/proc/self/task/<tid>/syscall`: the tick sources of RunLoopMonitorNIO
/// and the heartbeat sources of its event loops share it.
///
/// The loop's own set is learnt: the first set the thread is seen waiting in (when the caller
/// allows learning) is taken for the loop's (it is, unless a handler waits in an epoll set of its
/// own before the loop was ever seen idle); a thread waiting in any other set is busy (a nested
/// CFRunLoop or RunLoopKit run, a library's own poller). What was learnt belongs to the thread it
/// was learnt for: a new thread (a new loop in a reused slot) learns afresh, even when a look
/// that read the old thread stores after the change.
package final class LoopWait: Sendable {
    /// The system calls an idle epoll-based event loop waits in, on this architecture (from its
    /// `<sys/syscall.h>`); empty where none is known (no judgement is made: callers fall back).
    package static let epollWaitCalls: Set<Int> = {
        let numbers: [Int] = [Int(crlm_sys_epoll_wait()), Int(crlm_sys_epoll_pwait()), Int(crlm_sys_epoll_pwait2())]
        return Set(numbers.filter { $0 >= 0 })
    }()

    /// The system calls the loop waits in.
    package let calls: Set<Int>
    /// The thread's kernel id in the high half, its loop's descriptor + 1 in the low half; 0
    /// while nothing is learnt.
    private let learnt = Atomic<UInt64>(0)

    /// Where a look found the thread.
    package enum Reading: Equatable {
        /// The thread does not exist.
        case gone
        /// Parked in its loop's own wait.
        case parked
        /// Running, or blocked anywhere else.
        case busy
        /// The kernel's file could not be read (no descriptor left).
        case unknown
    }

    /// Watching a loop that waits in one of `calls`.
    package init(calls: Set<Int>) { self.calls = calls }

    /// Where thread `threadID` is now; learns its loop's descriptor if it is parked in a wait for
    /// the first time and `mayLearn`. Any thread; one read of the kernel's file.
    package func read(threadID: Int32, mayLearn: Bool) -> Reading {
        switch ProcessThreads.kernelState(of: threadID) {
        case .gone: return .gone
        case .unknown: return .unknown
        case .running: return .busy
        case .blocked(let call, let descriptor):
            guard calls.contains(call) else { return .busy }
            let thread = UInt64(UInt32(bitPattern: threadID)) << 32
            let seen = thread | ((descriptor &+ 1) & 0xFFFF_FFFF)
            let known = learnt.load(ordering: .relaxed)
            if known != 0, known & 0xFFFF_FFFF_0000_0000 == thread { return known == seen ? .parked : .busy }
            if mayLearn { learnt.store(seen, ordering: .relaxed) }
            return .parked
        }
    }

    /// Forgets the learnt descriptor (the loop's thread changed).
    package func forget() { learnt.store(0, ordering: .relaxed) }
}

// MARK: - A thread that reports its own work

/// A source for a loop the application runs itself (a GLib main loop, a game loop, a worker that
/// takes jobs from a queue): the loop calls ``begin(_:)`` when a unit of work starts and ``end()``
/// when it waits again, or only ``beat(_:)`` once per frame. Each call is a few atomic stores and a
/// clock read: no allocation, no lock, no system call.
///
/// Made on the thread itself with ``current(name:)``, or from another thread with
/// ``init(threadID:name:)`` (which checks that the thread exists).
public final class ThreadStallSource: StallSource {
    /// The watched thread's kernel id.
    public let threadID: Int32
    /// The name given at init.
    public let stallSourceName: String
    private let work = Atomic<UInt64>(0)
    private let busy = Atomic<Bool>(false)
    private let sinceNs = Atomic<Int64>(0)
    /// The item's UTF-8, NUL-terminated (a string literal's storage), or 0.
    private let itemStart = Atomic<UInt>(0)

    /// Why a source cannot be made.
    public enum SourceError: Error, Sendable, Hashable, CustomStringConvertible {
        /// No thread with this id exists in this process.
        case noSuchThread(threadID: Int32)

        /// In words.
        public var description: String {
            switch self {
            case .noSuchThread(let id):
                "no thread \(id) in this process (/proc/self/task/\(id) does not exist): it exited, or the id is another process's"
            }
        }
    }

    /// A source for thread `threadID` of this process (its kernel id, `gettid()`).
    ///
    /// - Throws: ``SourceError/noSuchThread(threadID:)`` when no such thread exists now.
    public init(threadID: Int32, name: String) throws(SourceError) {
        guard threadID > 0, ProcessThreads.exists(threadID) else { throw .noSuchThread(threadID: threadID) }
        self.threadID = threadID
        self.stallSourceName = name
    }

    /// A source for the calling thread, prepared for sampling (its capture signal unblocked).
    public static func current(name: String) -> ThreadStallSource {
        ThreadStack.prepareCurrentThread()
        // The calling thread exists.
        return try! ThreadStallSource(threadID: crlm_gettid(), name: name)
    }

    /// A unit of work named `item` begins on the thread. Call it on the watched thread.
    public func begin(_ item: StaticString = "work") {
        // One word, so a look never pairs one item's start with another's length; a StaticString
        // with a pointer is NUL-terminated. (One made from a single scalar has none: "work".)
        itemStart.store(item.hasPointerRepresentation ? UInt(bitPattern: item.utf8Start) : 0, ordering: .relaxed)
        sinceNs.store(RunLoop.nanoseconds(of: ContinuousClock.now), ordering: .relaxed)
        work.add(1, ordering: .relaxed)
        busy.store(true, ordering: .releasing)
    }

    /// The unit of work ends; the thread waits. Call it on the watched thread.
    public func end() {
        sinceNs.store(RunLoop.nanoseconds(of: ContinuousClock.now), ordering: .relaxed)
        busy.store(false, ordering: .releasing)
    }

    /// The thread is alive and starts its next unit of work (a frame): for a loop that never
    /// waits, so only a frame that lasts longer than the threshold is a stall.
    public func beat(_ item: StaticString = "frame") { begin(item) }

    /// What the hooks published; the thread's exit is read from the kernel.
    public func stallSnapshot() -> StallSnapshot {
        let isBusy = busy.load(ordering: .acquiring)
        let since = RunLoop.instant(ofNanoseconds: sinceNs.load(ordering: .relaxed))
        let item: String
        if isBusy {
            let start = UnsafePointer<CChar>(bitPattern: itemStart.load(ordering: .relaxed))
            item = start.map { String(cString: $0) } ?? "work"
        } else {
            item = ""
        }
        return StallSnapshot(
            activity: isBusy ? .busy : .idle, threadID: threadID, work: work.load(ordering: .relaxed),
            busySince: isBusy ? since : nil, idleSince: isBusy ? nil : since, phase: isBusy ? "callout" : "waiting",
            item: item, threadExited: !ProcessThreads.exists(threadID))
    }

    /// Nothing to do: ``current(name:)`` prepared the thread; a thread named by id is sampled
    /// while it is blocked in the kernel, and while it runs if it does not block the signal.
    public func prepareForStallMonitoring() {}
}

extension StallMonitor {
    /// Watches thread `threadID` of this process (its kernel id), which reports its own work
    /// through the returned source's hooks (``ThreadStallSource/begin(_:)``,
    /// ``ThreadStallSource/end()``, ``ThreadStallSource/beat(_:)``).
    ///
    /// - Throws: ``ThreadStallSource/SourceError/noSuchThread(threadID:)`` when no such thread
    ///   exists.
    @discardableResult
    public func watch(threadID: Int32, name: String) throws(ThreadStallSource.SourceError) -> ThreadStallSource {
        let source = try ThreadStallSource(threadID: threadID, name: name)
        watch(source)
        return source
    }

    /// Watches a serial `DispatchQueue` (the main queue included) by heartbeats every `heartbeat`
    /// (see ``HeartbeatStallSource``).
    @discardableResult
    public func watch(_ queue: DispatchQueue, name: String? = nil, heartbeat: Duration = .milliseconds(100)) -> HeartbeatStallSource {
        let source = HeartbeatStallSource(queue: queue, name: name, interval: heartbeat)
        watch(source)
        return source
    }
}
