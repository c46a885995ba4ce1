import CRunLoopMonitor
import struct Foundation.Date
import struct Foundation.UUID
import Logging
import Metrics
import Glibc
import RunLoopKit
import Synchronization

/// Finds run loops stuck in one callout, samples the stuck thread's stack while the stall lasts,
/// and reports when it begins and ends.
///
/// One monitor watches every loop given to it, with two threads: `rlk.stallmon` looks at the
/// loops and samples stacks, `rlk.stallrep` symbolicates them and delivers the reports (the
/// handler runs there), so that symbolication never delays a sample. A process usually needs one
/// monitor for all its loops. The sampling thread reads the words each loop publishes anyway
/// (phase and pass generation, `RunLoop.phaseSnapshot`; the callout in progress,
/// `RunLoop.calloutSnapshot`): the loop runs no callback, posts no semaphore, reads no clock and
/// allocates nothing for the monitor (see BENCHMARKS.md).
///
/// - A **stall**: one callout (an observer, a block, a source, a timer, a descriptor source, one
///   port message, a main-queue drain), or one stretch of the loop's own work between callouts,
///   has lasted longer than `threshold`. Two tasks queued together are two callouts, so two
///   stalls, each naming its item (``StallReport/item``). A loop asleep in the kernel is never
///   stalled; a loop that is not running is not watched; a callout that runs the loop nested
///   ends when the nested run's first callout begins (the loop moved).
/// - **When**: the monitor looks at every loop once per `sampleInterval`; a callout is timed from
///   the last look that saw the loop elsewhere (it began after that) to the first look that sees
///   it moved on (it ended before that), or from and to the loop's own stamps where a
///   `RunLoop.watchPhases()` token makes it stamp them. So a reported duration is never shorter
///   than the callout and at most two sample intervals longer (plus however late the monitor's
///   thread gets a CPU); `.began` comes within `threshold` + one `sampleInterval` of the stall's
///   start, `.ended` within one `sampleInterval` of the loop moving on.
/// - **Watching does not change the program.** A stuck thread that is blocked in the kernel
///   (`usleep`, `sleep`, `nanosleep`, `poll`, `epoll_wait`, `read`, a lock's futex…) is never
///   signalled: its stack is read where the kernel parked it (``RawStack/Unwinder/parkedInKernel``),
///   so its call returns when it would have without the monitor. Only a thread running in user
///   space gets the capture signal; its handler interrupts no system call. What remains: a thread
///   that enters a blocking call in the microseconds between the monitor's check and the signal's
///   arrival sees that call return `EINTR` (as POSIX allows at any time); measured in
///   BENCHMARKS.md (`capture`), it is rare, not never.
/// - **Preparing the thread**: when it first looks at a loop, the monitor performs a block on it
///   (in the common modes) that calls ``ThreadStack/prepareCurrentThread()``: a loop thread
///   started from a libdispatch worker or a Swift concurrency thread inherits a mask that blocks
///   every signal, and could not be sampled while running otherwise (its reports then carry
///   ``StallReport/captureError``; it is still read whenever it is blocked in the kernel). Capture
///   signals are never sent to a thread that blocks them, nor while one is pending for it.
/// - **Stacks and blame**: the first sample is taken when the stall begins, then one every
///   `sampleInterval` while it lasts (``ThreadStack``). The samples form a ``CallTree``;
///   ``StallReport/stuckIn`` is the deepest frame of the application's own code on its heaviest
///   path, ``StallReport/stacks`` the most frequent distinct stacks, and
///   ``StallReport/foldedStacks`` every sample, folded, for a flame graph (``FlameGraphPage``).
/// - **Back-off** (``Backoff``, `init(…backoff:)`): with ``Backoff/fibonacci(forgetAfter:)``, the
///   default, a stall whose first sample's functions (outside the system libraries) match earlier
///   ones' is reported the 1st, 2nd, 3rd, 5th, 8th, 13th… time; the count starts over after
///   `forgetAfter` without such a stall. Every stall it holds back is counted in a report that is
///   delivered: the next reported stall of that signature carries
///   ``StallReport/suppressedSimilar``, and those still uncounted when the signature is forgotten,
///   or when the monitor stops, come in a ``StallEvent/suppressed(_:)`` summary. A held-back stall
///   that lasts past `max(2 s, 4 × threshold)` is reported then anyway: a hang is never hidden.
///   ``Backoff/none`` reports every stall (tests, development).
/// - **Ends**: ``StallReport/EndReason``: the loop moved on (finished the callout, slept, or
///   returned from the run, whatever its thread does next), ``stop()`` cut the stall short, or the
///   thread exited while still in the callout (the monitor then forgets the loop and goes on with
///   the others). The thread's CPU time is read at every sample, so a thread that exits after a
///   busy stall still reports the CPU seen up to its last sample.
///
/// Reports go to the handler (on the monitor's reporting thread), to swift-log and swift-metrics
/// (see ``MonitorReporting``), and to a ``StallReportStore`` when one is given. A started monitor
/// runs until ``stop()``, even if dropped.
public final class StallMonitor: Sendable {
    /// How long an iteration may stay busy before it is a stall.
    public let threshold: Duration
    /// How often a stalled thread's stack is sampled, and how often idle loops are looked at.
    public let sampleInterval: Duration
    /// How repeated similar stalls are reported (see "Back-off" above).
    public let backoff: Backoff
    /// Whether reported stalls carry every thread's stack (``StallReport/allThreads``).
    public let capturesAllThreads: Bool

    /// How repeated similar stalls are reported.
    public enum Backoff: Sendable, Hashable {
        /// Every stall is reported.
        case none
        /// Stalls of one signature are reported the 1st, 2nd, 3rd, 5th, 8th, 13th… time; the
        /// count starts over after `forgetAfter` without such a stall, when the held-back ones
        /// are summarized (``StallEvent/suppressed(_:)``).
        case fibonacci(forgetAfter: Duration = .seconds(600))

        /// ``fibonacci(forgetAfter:)`` with ten minutes.
        public static var standard: Backoff { .fibonacci() }
    }

    let store: StallReportStore?
    let logger: Logger?
    let shared: Mutex<Shared>
    /// The sampling thread (`rlk.stallmon`) and the reporting thread (`rlk.stallrep`).
    private let thread = Mutex<MonitorThread?>(nil)
    /// The process that started the monitor (0 before `start`): in a child made by `fork()` its
    /// threads do not exist, and its locks may have been held by them at the fork.
    private let startedIn = Atomic<Int32>(0)
    let reporter = Mutex<MonitorThread?>(nil)

    struct Shared {
        var sources: [any StallSource]
        /// Names given with the sources (``watch(_:name:)``), by source.
        var names: [ObjectIdentifier: String] = [:]
        var stopping = false
        var started = false
        var samplerDone = false
        var handler: (@Sendable (StallEvent) -> Void)?
        /// Events waiting for the reporting thread, in order, with their raw stacks.
        var pending: [(kind: PendingKind, report: StallReport, sampler: StackSampler)] = []
    }

    /// What the reporting thread does with a pending report: deliver it (`began`, `ended`,
    /// `suppressed`), or only count a stall the back-off holds back (`heldBackBegan`,
    /// `heldBackEnded`: metrics, never the handler or the store).
    enum PendingKind { case began, ended, suppressed, heldBackBegan, heldBackEnded }

    /// A monitor for `loop` (any loop, not only the main one).
    ///
    /// - Parameters:
    ///   - loop: the loop to watch.
    ///   - name: the loop's name in reports, logs and metrics (``StallReport/loop``); its thread's
    ///     name when nil.
    ///   - threshold: how long one callout may last; must be positive.
    ///   - sampleInterval: how often a stall's stack is sampled; at least 1 ms (shorter is raised
    ///     to 1 ms: a stack walk takes tens of microseconds, and sampling faster only loads a core).
    ///   - backoff: how repeated similar stalls are reported.
    ///   - store: where reports are written as they begin and end, if anywhere.
    ///   - allThreads: whether a reported stall also carries every thread's stack, taken when it
    ///     is first reported (``StallReport/allThreads``; see ``ThreadStack/captureAll(timeout:)``).
    ///   - logger: where reports are logged (label ``MonitorReporting/loggerLabel`` by default);
    ///     nil for none.
    public convenience init(
        loop: RunLoop, name: String? = nil, threshold: Duration = .milliseconds(250),
        sampleInterval: Duration = .milliseconds(50), backoff: Backoff = .standard, store: StallReportStore? = nil,
        allThreads: Bool = false, logger: Logger? = Logger(label: MonitorReporting.loggerLabel)
    ) {
        self.init(
            loops: [loop], threshold: threshold, sampleInterval: sampleInterval, backoff: backoff, store: store,
            allThreads: allThreads, logger: logger)
        if let name { shared.locked { $0.names[ObjectIdentifier(loop)] = name } }
    }

    /// A monitor for several loops, watched by one thread (named as their threads are; see
    /// ``watch(_:name:)`` to name them).
    ///
    /// - Parameters:
    ///   - loops: the loops to watch.
    ///   - threshold: how long one callout may last; must be positive.
    ///   - sampleInterval: how often a stall's stack is sampled; must be positive; at least 1 ms
    ///     (shorter is raised to 1 ms).
    ///   - backoff: how repeated similar stalls are reported.
    ///   - store: where reports are written as they begin and end, if anywhere.
    ///   - allThreads: whether a reported stall also carries every thread's stack (see
    ///     ``StallReport/allThreads``).
    ///   - logger: where reports are logged; nil for none.
    public init(
        loops: [RunLoop], threshold: Duration = .milliseconds(250), sampleInterval: Duration = .milliseconds(50),
        backoff: Backoff = .standard, store: StallReportStore? = nil, allThreads: Bool = false,
        logger: Logger? = Logger(label: MonitorReporting.loggerLabel)
    ) {
        self.capturesAllThreads = allThreads
        fatalPrecondition(threshold > .zero, "StallMonitor: threshold must be positive (got \(threshold))")
        fatalPrecondition(sampleInterval > .zero, "StallMonitor: sampleInterval must be positive (got \(sampleInterval))")
        // A year at most: an instant plus a larger duration would overflow.
        self.threshold = min(threshold, .seconds(365 * 86400))
        self.sampleInterval = min(max(sampleInterval, Self.minimumSampleInterval), .seconds(365 * 86400))
        self.backoff = backoff
        self.store = store
        self.logger = logger
        self.shared = Mutex(Shared(sources: loops))
    }

    /// The shortest sample interval (see `init`).
    public static let minimumSampleInterval: Duration = .milliseconds(1)

    /// Watches `loop` too, from the next look on, under `name` in reports, logs and metrics (its
    /// thread's name when nil). Any thread, before or after ``start(_:)``. Watching a loop again
    /// renames it.
    ///
    /// Any ``StallSource`` is watched the same way: a RunLoopKit loop, a SwiftNIO event loop
    /// (RunLoopMonitorNIO), a heartbeat on a `DispatchQueue`
    /// (``HeartbeatStallSource/init(queue:name:interval:)``), a thread that reports its own work
    /// (``ThreadStallSource``).
    public func watch(_ source: any StallSource, name: String? = nil) {
        let added = shared.locked { shared -> Bool in
            if let name { shared.names[ObjectIdentifier(source)] = name }
            guard !shared.sources.contains(where: { $0 === source }) else { return false }
            shared.sources.append(source)
            return shared.started
        }
        if added { source.prepareForStallMonitoring() }
        thread.locked { $0 }?.wake()
    }

    /// Stops watching `source` (from the next look on); a stall of it in progress ends, cut short.
    /// Any thread; a source not watched is ignored.
    public func unwatch(_ source: any StallSource) {
        shared.locked { shared in
            shared.sources.removeAll { $0 === source }
            shared.names[ObjectIdentifier(source)] = nil
        }
        thread.locked { $0 }?.wake()
    }

    /// The sources watched now, in the order they were given.
    public var watchedSources: [any StallSource] { shared.locked { $0.sources } }

    /// Starts the monitor's threads; `handler` is called on its reporting thread (`rlk.stallrep`)
    /// for each event, in order. Once: a second call is a precondition failure.
    public func start(_ handler: @escaping @Sendable (StallEvent) -> Void) {
        let first = shared.locked { shared -> Bool in
            defer { shared.started = true; shared.handler = handler }
            return !shared.started
        }
        fatalPrecondition(first, "StallMonitor.start(_:) called twice; a monitor starts once (make another one)")
        startedIn.store(getpid(), ordering: .releasing)
        try? ThreadStack.install()  // warm up now, not inside the first stall; errors surface per report
        // The symbol tables load in the background (up to seconds for a large binary): reports
        // made before are delivered unsymbolicated rather than held back (see isSymbolicated).
        if !Symbolicator.shared.isWarm { Symbolicator.shared.warmUp() }
        for source in sources { source.prepareForStallMonitoring() }
        let worker = StallWorker(monitor: self)
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

    // MARK: The monitor's thread

    var isStopping: Bool { shared.locked { $0.stopping } }
    var sources: [any StallSource] { shared.locked { $0.sources } }
    func name(of source: any StallSource) -> String {
        shared.locked { $0.names[ObjectIdentifier(source)] } ?? source.stallSourceName
    }
    func forget(_ source: any StallSource) {
        shared.locked { shared in
            shared.sources.removeAll { $0 === source }
            shared.names[ObjectIdentifier(source)] = nil
        }
    }

    func emit(_ event: StallEvent) {
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
            case .suppressed:
                logger.notice(
                    "\(report.suppressedSimilar) similar run loop stalls were not reported (back-off)",
                    metadata: MonitorReporting.metadata(report))
            }
        }
        if let store, !event.isSummary {
            do { try store.record(event) } catch {
                logger?.error("cannot write the stall report to \(store.fileURL.path): \(error)")
            }
        }
        shared.locked { $0.handler }?(event)
    }

    func noteThreadExit(_ source: any StallSource, threadID: Int32) {
        logger?.info("watched thread exited; no longer watched", metadata: ["source": "\(name(of: source))", "tid": "\(threadID)"])
    }

    func noteCaptureError(_ error: ThreadStackError, _ source: any StallSource, threadID: Int32) {
        logger?.error("cannot capture the stalled thread's stack: \(error)", metadata: ["source": "\(name(of: source))", "tid": "\(threadID)"])
    }
}

extension StallMonitor {
    /// The sampling thread's sleep between rounds, which stop() and watch(_:) cut short.
    func sleepOnThread(until deadline: ContinuousClock.Instant) {
        thread.locked { $0 }?.sleep(until: deadline)
    }
}
