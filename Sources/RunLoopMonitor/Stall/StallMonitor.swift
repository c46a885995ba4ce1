import CRunLoopMonitor
import struct Foundation.Date
import struct Foundation.UUID
import Logging
import Metrics
import Glibc
import RunLoopKit
import Synchronization

/// Finds run loops stuck inside one iteration, samples the stuck thread's stack while the stall
/// lasts, and reports when it begins and ends.
///
/// One monitor watches every loop given to it, with two threads: `rlk.stallmon` looks at the
/// loops and samples stacks, `rlk.stallrep` symbolicates them and delivers the reports (the
/// handler runs there), so that symbolication never delays a sample. A process usually needs one
/// monitor for all its loops. The sampling thread reads the phase word each loop publishes anyway
/// (phase and iteration generation, `RunLoop.phaseSnapshot`): the loop runs no callback, posts
/// no semaphore, reads no clock and allocates nothing for the monitor (see BENCHMARKS.md).
///
/// - A **stall**: the loop has been busy (in any phase but `RunLoop.Phase.waiting`) within one
///   iteration for longer than `threshold`. A loop asleep in the kernel is never stalled; a loop
///   that is not running is not watched; a nested run's passes are iterations of their own.
/// - **When**: the monitor looks at every loop once per `sampleInterval`; a pass is timed from the
///   first look that saw it busy (or from the loop's own stamp, `busySince`, when something else
///   holds a `RunLoop.watchPhases()` token). So `.began` comes within `threshold` + one
///   `sampleInterval` of the stall's start, and durations are exact to one `sampleInterval` (plus
///   however late the monitor's thread gets a CPU). `.ended` comes within one `sampleInterval` of
///   the loop moving on, with the total duration.
/// - **Preparing the thread**: when it first looks at a loop, the monitor performs a block on it
///   (in the common modes) that calls ``ThreadStack/prepareCurrentThread()``: a loop thread
///   started from a libdispatch worker or a Swift concurrency thread inherits a mask that blocks
///   every signal, and could not be sampled otherwise (its reports then carry
///   ``StallReport/captureError``). A loop stuck before that block ran, or that never runs a
///   common mode, is sampled only if its thread does not block the signal: call
///   ``ThreadStack/prepareCurrentThread()`` at the start of such a thread.
/// - **Stacks**: the first sample is taken when the stall begins, then one every `sampleInterval`
///   while it lasts (``ThreadStack``); identical stacks are merged with counts, most frequent
///   first. A thread blocked in the same system call is signalled once (see ``ThreadStack``).
/// - **Back-off**: stalls whose first stack's innermost frames match an earlier one's are
///   reported the 1st, 2nd, 3rd, 5th, 8th, 13th… time (Fibonacci), the others counted in the next
///   report's ``StallReport/suppressedSimilar`` (and in metrics); the count starts over after
///   ten minutes without such a stall. A suppressed stall that lasts past `max(2 s, 4 × threshold)`
///   is reported then anyway: a hang is never hidden.
/// - **Ends**: ``StallReport/EndReason``: the loop moved on, ``stop()`` cut the stall short, or
///   the thread exited (the monitor then forgets the loop and goes on with the others).
///
/// Reports go to the handler (on the monitor's reporting thread), to swift-log and swift-metrics
/// (see ``MonitorReporting``), and to a ``StallReportStore`` when one is given. A started monitor
/// runs until ``stop()``, even if dropped.
public final class StallMonitor: Sendable {
    /// How long an iteration may stay busy before it is a stall.
    public let threshold: Duration
    /// How often a stalled thread's stack is sampled, and how often idle loops are looked at.
    public let sampleInterval: Duration

    private let store: StallReportStore?
    private let logger: Logger?
    private let shared: Mutex<Shared>
    /// The sampling thread (`rlk.stallmon`) and the reporting thread (`rlk.stallrep`).
    private let thread = Mutex<MonitorThread?>(nil)
    /// The process that started the monitor (0 before `start`): in a child made by `fork()` its
    /// threads do not exist, and its locks may have been held by them at the fork.
    private let startedIn = Atomic<Int32>(0)
    private let reporter = Mutex<MonitorThread?>(nil)

    private struct Shared {
        var loops: [RunLoop]
        var stopping = false
        var started = false
        var samplerDone = false
        var handler: (@Sendable (StallEvent) -> Void)?
        /// Events waiting for the reporting thread, in order, with their raw stacks.
        var pending: [(ended: Bool, report: StallReport, sampler: StackSampler)] = []
    }

    /// A monitor for `loop` (any loop, not only the main one).
    ///
    /// - Parameters:
    ///   - loop: the loop to watch.
    ///   - threshold: how long one iteration may stay busy; must be positive.
    ///   - sampleInterval: how often a stall's stack is sampled; must be positive.
    ///   - store: where reports are written as they begin and end, if anywhere.
    ///   - logger: where reports are logged (label ``MonitorReporting/loggerLabel`` by default);
    ///     nil for none.
    public convenience init(
        loop: RunLoop, threshold: Duration = .milliseconds(250), sampleInterval: Duration = .milliseconds(50),
        store: StallReportStore? = nil, logger: Logger? = Logger(label: MonitorReporting.loggerLabel)
    ) {
        self.init(loops: [loop], threshold: threshold, sampleInterval: sampleInterval, store: store, logger: logger)
    }

    /// A monitor for several loops, watched by one thread.
    ///
    /// - Parameters:
    ///   - loops: the loops to watch.
    ///   - threshold: how long one iteration may stay busy; must be positive.
    ///   - sampleInterval: how often a stall's stack is sampled; must be positive.
    ///   - store: where reports are written as they begin and end, if anywhere.
    ///   - logger: where reports are logged; nil for none.
    public init(
        loops: [RunLoop], threshold: Duration = .milliseconds(250), sampleInterval: Duration = .milliseconds(50),
        store: StallReportStore? = nil, logger: Logger? = Logger(label: MonitorReporting.loggerLabel)
    ) {
        precondition(threshold > .zero, "StallMonitor: threshold must be positive (got \(threshold))")
        precondition(sampleInterval > .zero, "StallMonitor: sampleInterval must be positive (got \(sampleInterval))")
        // A year at most: an instant plus a larger duration would overflow.
        self.threshold = min(threshold, .seconds(365 * 86400))
        self.sampleInterval = min(sampleInterval, .seconds(365 * 86400))
        self.store = store
        self.logger = logger
        self.shared = Mutex(Shared(loops: loops))
    }

    /// Watches `loop` too, from the next look on. Any thread, before or after ``start(_:)``.
    public func watch(_ loop: RunLoop) {
        let added = shared.locked { shared -> Bool in
            guard !shared.loops.contains(loop) else { return false }
            shared.loops.append(loop)
            return shared.started
        }
        if added { Self.prepare(loop) }
        thread.locked { $0 }?.wake()
    }

    /// On the loop's thread, at its next pass in a common mode (before blocks performed after this
    /// call): unblocks the capture signal and records the stack bounds (see "Preparing the
    /// thread").
    private static func prepare(_ loop: RunLoop) {
        loop.perform(inModes: [.common]) { ThreadStack.prepareCurrentThread() }
    }

    /// Starts the monitor's threads; `handler` is called on its reporting thread (`rlk.stallrep`)
    /// for each event, in order. Once: a second call is a precondition failure.
    public func start(_ handler: @escaping @Sendable (StallEvent) -> Void) {
        let first = shared.locked { shared -> Bool in
            defer { shared.started = true; shared.handler = handler }
            return !shared.started
        }
        precondition(first, "StallMonitor.start(_:) called twice; a monitor starts once (make another one)")
        startedIn.store(getpid(), ordering: .releasing)
        try? ThreadStack.install()  // warm up now, not inside the first stall; errors surface per report
        for loop in loops { Self.prepare(loop) }
        let worker = Worker(monitor: self)
        reporter.locked { $0 = MonitorThread(name: "rlk.stallrep") { [self] in runReporter() } }
        thread.locked { $0 = MonitorThread(name: "rlk.stallmon") { [self] in
            worker.run()
            shared.locked { $0.samplerDone = true }
            reporter.locked { $0 }?.wake()
        } }
    }

    /// Stops the monitor: a stall in progress gets its `.ended` report (cut short), then the
    /// monitor's threads exit and this call waits for them. From inside the handler it returns at
    /// once, and the threads exit after the handler (the cut-short report still comes). Any
    /// thread; later calls do nothing. In a child made by `fork()`, where the monitor's threads do
    /// not exist, it returns at once without touching them (start a new monitor there).
    public func stop() {
        let owner = startedIn.load(ordering: .acquiring)
        if owner != 0 && owner != getpid() { return }  // a forked child: nothing runs here
        shared.locked { $0.stopping = true }
        guard let sampling = thread.locked({ $0 }), let reporting = reporter.locked({ $0 }) else { return }
        sampling.wake()
        if reporting.isCurrent {
            sampling.detach()
            reporting.detach()
            return
        }
        sampling.join()
        reporting.wake()
        reporting.join()
    }

    /// The reporting thread: symbolicates each event's stacks (milliseconds for new addresses in
    /// a large binary, which must not delay sampling) and delivers it, in order.
    private func runReporter() {
        // Load the symbol tables now: the first symbolication of a large binary takes a while.
        if let own = try? ThreadStack.captureAddresses(threadID: ProcessThreads.ownID) { _ = ThreadStack.symbolicate(own) }
        while true {
            let (batch, done) = shared.locked { shared in
                defer { shared.pending.removeAll() }
                return (shared.pending, shared.samplerDone)
            }
            for item in batch {
                var report = item.report
                report.stacks = item.sampler.samples()
                emit(item.ended ? .ended(report) : .began(report))
            }
            if batch.isEmpty {
                if done {
                    // Let go of the handler: one that captures the monitor (to stop it) would
                    // otherwise keep both alive forever.
                    let handler = shared.locked { shared in
                        defer { shared.handler = nil }
                        return shared.handler
                    }
                    _ = consume handler
                    return
                }
                reporter.locked { $0 }?.sleep(until: .now + .seconds(3600))
            }
        }
    }

    /// Hands an event to the reporting thread (sampling thread).
    fileprivate func enqueue(ended: Bool, _ report: StallReport, _ sampler: StackSampler) {
        shared.locked { $0.pending.append((ended, report, sampler)) }
        reporter.locked { $0 }?.wake()
    }

    // MARK: The monitor's thread

    fileprivate var isStopping: Bool { shared.locked { $0.stopping } }
    fileprivate var loops: [RunLoop] { shared.locked { $0.loops } }
    fileprivate func forget(_ loop: RunLoop) { shared.locked { $0.loops.removeAll { $0 === loop } } }

    fileprivate func emit(_ event: StallEvent) {
        let report = event.report
        if let logger {
            switch event {
            case .began:
                logger.warning("run loop stalled", metadata: MonitorReporting.metadata(report))
            case .ended:
                if report.endReason == .movedOn {
                    logger.warning("run loop stall ended", metadata: MonitorReporting.metadata(report))
                } else {
                    logger.notice(
                        "run loop stall ended (\(report.endReason?.rawValue ?? "?"))",
                        metadata: MonitorReporting.metadata(report))
                }
            }
        }
        if case .ended = event {
            Metrics.Timer(label: MonitorReporting.MetricName.stallDuration, dimensions: [("thread", report.threadName)])
                .recordNanoseconds(report.duration.saturatedNanoseconds)
        }
        if let store {
            do { try store.record(event) } catch {
                logger?.error("cannot write the stall report to \(store.fileURL.path): \(error)")
            }
        }
        shared.locked { $0.handler }?(event)
    }

    fileprivate func countStall(_ report: StallReport, suppressed: Bool) {
        Counter(label: MonitorReporting.MetricName.stalls, dimensions: [("thread", report.threadName), ("phase", report.phase)])
            .increment()
        if suppressed {
            Counter(label: MonitorReporting.MetricName.stallsSuppressed, dimensions: [("thread", report.threadName)])
                .increment()
            logger?.debug("run loop stall suppressed (same stack as earlier ones)", metadata: MonitorReporting.metadata(report))
        }
    }

    fileprivate func noteThreadExit(_ loop: RunLoop) {
        logger?.info("watched run loop's thread exited; no longer watched", metadata: ["thread": "\(loop.threadName)", "tid": "\(loop.threadID)"])
    }

    fileprivate func noteCaptureError(_ error: ThreadStackError, _ loop: RunLoop) {
        logger?.error("cannot capture the stalled thread's stack: \(error)", metadata: ["thread": "\(loop.threadName)", "tid": "\(loop.threadID)"])
    }
}

/// The monitor thread's state and rounds. Confined to that thread.
private final class Worker: @unchecked Sendable {
    // @unchecked: created by start(), then used only by the monitor's thread (its run()).
    let monitor: StallMonitor
    var watches: [ObjectIdentifier: Watch] = [:]
    var backoff = StallBackoff()

    init(monitor: StallMonitor) { self.monitor = monitor }

    /// How long a sample waits for the stuck thread's handler: the thread must be scheduled to run
    /// it, which on a loaded machine can take longer than a sample interval.
    var captureTimeout: Duration { max(monitor.sampleInterval * 2, .milliseconds(100)) }

    /// One watched loop.
    struct Watch {
        let loop: RunLoop
        /// The pass the loop was last seen busy in.
        var candidate: Candidate?
        var stall: Stall?
    }

    struct Candidate {
        let generation: UInt64
        let busySince: ContinuousClock.Instant
        let seenAt: ContinuousClock.Instant
        let cpuAtSeen: Duration?
    }

    struct Stall {
        let id: String
        let startedAt: Date
        let busySince: ContinuousClock.Instant
        let mode: String
        let phase: String
        let threadName: String
        let seenAt: ContinuousClock.Instant
        let cpuAtSeen: Duration?
        var sampler: StackSampler
        var nextSample: ContinuousClock.Instant
        var reported: Bool
        var suppressedSimilar: Int
    }

    func run() {
        while !monitor.isStopping {
            let next = round()
            if !monitor.isStopping { monitor.sleepOnThread(until: next) }
        }
        // Stalls still going get their end, marked cut short.
        for (key, watch) in watches {
            if var stall = watch.stall { finish(&stall, watch.loop, reason: .monitorStopped) }
            watches[key] = nil
        }
    }

    /// Looks at every loop once; returns when to look again.
    func round() -> ContinuousClock.Instant {
        let now = ContinuousClock.now
        var next = now + monitor.sampleInterval
        let loops = monitor.loops
        let current = Set(loops.map(ObjectIdentifier.init))
        for key in watches.keys where !current.contains(key) { watches[key] = nil }
        for loop in loops {
            let key = ObjectIdentifier(loop)
            if watches[key] == nil { watches[key] = Watch(loop: loop) }
            if let wake = look(at: key) { next = min(next, wake) }
        }
        return next
    }

    /// Looks at one loop; returns when it needs looking at again, if sooner than the usual round.
    func look(at key: ObjectIdentifier) -> ContinuousClock.Instant? {
        guard var watch = watches[key] else { return nil }
        defer { watches[key] = watch }
        let loop = watch.loop
        if loop.hasThreadExited {
            if var stall = watch.stall { finish(&stall, loop, reason: .threadExited) }
            watch.stall = nil
            watch.candidate = nil
            monitor.forget(loop)
            ThreadStack.forget(threadID: loop.threadID)
            monitor.noteThreadExit(loop)
            return nil
        }
        let snapshot = loop.phaseSnapshot
        let now = ContinuousClock.now
        guard snapshot.phase != .waiting, snapshot.phase != .notRunning else {
            if var stall = watch.stall { finish(&stall, loop, reason: .movedOn, at: Self.movedOnAt(snapshot, stall, now)) }
            watch.stall = nil
            watch.candidate = nil
            return nil
        }
        if watch.candidate?.generation != snapshot.generation {
            if var stall = watch.stall { finish(&stall, loop, reason: .movedOn, at: Self.movedOnAt(snapshot, stall, now)) }
            watch.stall = nil
            watch.candidate = Candidate(
                generation: snapshot.generation, busySince: min(snapshot.busySince ?? now, now), seenAt: now,
                cpuAtSeen: ProcessThreads.cpuTime(of: loop.threadID))
        }
        let candidate = watch.candidate!
        if var stall = watch.stall {
            if now >= stall.nextSample {
                if !stall.sampler.sample(timeout: captureTimeout) {
                    finish(&stall, loop, reason: .threadExited)
                    watch.stall = nil
                    return nil
                }
                stall.nextSample = max(stall.nextSample + monitor.sampleInterval, now)
            }
            if !stall.reported, now - stall.busySince >= max(.seconds(2), monitor.threshold * 4) {
                stall.reported = true  // a hang is never hidden by the back-off
                monitor.enqueue(ended: false, report(stall, loop, now: now), stall.sampler)
            }
            watch.stall = stall
            return stall.nextSample
        }
        let due = candidate.busySince + monitor.threshold
        guard now >= due else { return due }
        // A stall begins: its first sample now.
        var sampler = StackSampler(threadID: loop.threadID)
        guard sampler.sample(timeout: captureTimeout) else { return nil }  // the thread is gone
        if let error = sampler.lastError { monitor.noteCaptureError(error, loop) }
        let busyFor = now - candidate.busySince
        let signature = sampler.signature ?? []
        let decision = backoff.decide(signature, at: now)
        var stall = Stall(
            id: UUID().uuidString, startedAt: Date(timeIntervalSinceNow: -busyFor.seconds), busySince: candidate.busySince,
            mode: loop.currentMode?.rawValue ?? "?", phase: snapshot.phase.description,
            threadName: ProcessThreads.name(of: loop.threadID) ?? loop.threadName, seenAt: candidate.seenAt,
            cpuAtSeen: candidate.cpuAtSeen, sampler: sampler, nextSample: now + monitor.sampleInterval,
            reported: decision.report, suppressedSimilar: decision.suppressedBefore)
        let first = report(stall, loop, now: now)
        monitor.countStall(first, suppressed: !decision.report)
        if stall.reported { monitor.enqueue(ended: false, first, stall.sampler) }
        stall.nextSample = now + monitor.sampleInterval
        watch.stall = stall
        return stall.nextSample
    }

    func report(_ stall: Stall, _ loop: RunLoop, now: ContinuousClock.Instant, reason: StallReport.EndReason? = nil) -> StallReport {
        let cpuNow = ProcessThreads.cpuTime(of: loop.threadID)
        let cpu = cpuNow.flatMap { now in stall.cpuAtSeen.map { now - $0 } } ?? .zero
        return StallReport(
            id: stall.id, processID: getpid(), threadName: stall.threadName, threadID: loop.threadID, mode: stall.mode,
            phase: stall.phase, startedAt: stall.startedAt, duration: now - stall.busySince, threadCPUTime: cpu,
            cpuMeasuredOver: ContinuousClock.now - stall.seenAt, stacks: [], sampleCount: stall.sampler.sampleCount,
            endReason: reason, suppressedSimilar: stall.suppressedSimilar,
            captureError: stall.sampler.lastError?.description)
    }

    /// When the loop moved on, as the loop stamped it: the start of its sleep, or of the next
    /// pass's work; the monitor's own time only when the loop stamped nothing usable (it may look
    /// up to a sample interval late, or later when its thread waits for the CPU).
    static func movedOnAt(_ snapshot: RunLoop.PhaseSnapshot, _ stall: Stall, _ now: ContinuousClock.Instant) -> ContinuousClock.Instant {
        let stamped = snapshot.phase == .waiting ? snapshot.since : snapshot.busySince
        guard let stamped, stamped > stall.busySince, stamped <= now else { return now }
        return stamped
    }

    func finish(_ stall: inout Stall, _ loop: RunLoop, reason: StallReport.EndReason, at end: ContinuousClock.Instant? = nil) {
        let now = end ?? ContinuousClock.now
        let final = report(stall, loop, now: now, reason: reason)
        if stall.reported {
            monitor.enqueue(ended: true, final, stall.sampler)
        } else {
            Metrics.Timer(label: MonitorReporting.MetricName.stallDuration, dimensions: [("thread", final.threadName)])
                .recordNanoseconds(final.duration.saturatedNanoseconds)
        }
    }
}

/// The back-off of repeated identical stalls (see ``StallMonitor``).
struct StallBackoff {
    private var seen: [[UInt64]: (count: Int, suppressed: Int, last: ContinuousClock.Instant)] = [:]
    static let forgetAfter: Duration = .seconds(600)

    /// Whether the stall with `signature` is reported, and how many like it were suppressed since
    /// the last one reported.
    mutating func decide(_ signature: [UInt64], at now: ContinuousClock.Instant) -> (report: Bool, suppressedBefore: Int) {
        guard !signature.isEmpty else { return (true, 0) }
        var entry = seen[signature] ?? (0, 0, now)
        if now - entry.last > Self.forgetAfter { entry = (0, 0, now) }
        entry.count += 1
        entry.last = now
        let report = Self.isFibonacci(entry.count)
        let suppressedBefore = entry.suppressed
        entry.suppressed = report ? 0 : entry.suppressed + 1
        seen[signature] = entry
        if seen.count > 1024 { seen = seen.filter { now - $0.value.last <= Self.forgetAfter } }
        return (report, report ? suppressedBefore : 0)
    }

    static func isFibonacci(_ n: Int) -> Bool {
        var (a, b) = (1, 2)
        if n == 1 { return true }
        while b < n { (a, b) = (b, a + b) }
        return b == n
    }
}

extension StallMonitor {
    /// The sampling thread's sleep between rounds, which stop() and watch(_:) cut short.
    fileprivate func sleepOnThread(until deadline: ContinuousClock.Instant) {
        thread.locked { $0 }?.sleep(until: deadline)
    }
}
