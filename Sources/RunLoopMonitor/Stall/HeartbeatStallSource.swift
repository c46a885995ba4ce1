import CRunLoopMonitor
import Dispatch
import Glibc
import RunLoopKit
import Synchronization

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

extension StallMonitor {
    /// Watches a serial `DispatchQueue` (the main queue included) by heartbeats every `heartbeat`
    /// (see ``HeartbeatStallSource``).
    @discardableResult
    public func watch(_ queue: DispatchQueue, name: String? = nil, heartbeat: Duration = .milliseconds(100)) -> HeartbeatStallSource {
        let source = HeartbeatStallSource(queue: queue, name: name, interval: heartbeat)
        watch(source)
        return source
    }
}
