import CRunLoopMonitor
import struct Foundation.Date
import struct Foundation.UUID
import Glibc
import RunLoopKit

/// The monitor thread's state and rounds: each round looks at every watched source, does what the
/// source's ``StallDetector`` decides (samples, CPU reads) and hands reports to the reporting
/// thread. Confined to the monitor thread.
final class StallWorker: @unchecked Sendable {
    // @unchecked: created by start(), then used only by the monitor's thread (its run()).
    let monitor: StallMonitor
    var watches: [ObjectIdentifier: Watch] = [:]
    var backoff: StallBackoff

    init(monitor: StallMonitor) {
        self.monitor = monitor
        backoff = StallBackoff(monitor.backoff)
    }

    /// How long a sample waits for the stuck thread's handler: the thread must be scheduled to run
    /// it, which on a loaded machine can take longer than a sample interval.
    var captureTimeout: Duration { max(monitor.sampleInterval * 2, .milliseconds(100)) }

    /// One watched source: what its detector decides, and what the monitor gathers for it.
    struct Watch {
        let source: any StallSource
        var detector: StallDetector
        /// The thread's CPU clock when its current work was first seen busy.
        var cpuAtSeen: Duration?
        /// The stall in progress's stacks and words, while the detector has one.
        var stall: StallRecord?
        /// The thread whose procfs files are kept open for this source (0: none yet).
        var readableThread: Int32 = 0
    }

    /// What is gathered for a stall in progress (its timing is the detector's).
    struct StallRecord {
        let id: String
        let threadID: Int32
        let startedAt: Date
        let busySince: ContinuousClock.Instant
        let mode: String
        let phase: String
        let item: String
        let threadName: String
        let loopName: String
        let seenAt: ContinuousClock.Instant
        let cpuAtSeen: Duration?
        /// The thread's CPU clock at the last sample, and when it was read.
        var lastCPU: (time: Duration, at: ContinuousClock.Instant)?
        var sampler: StackSampler
        var reported: Bool
        var suppressedSimilar: Int
        let signature: [UInt64]
        /// Every thread's stack, taken when the stall was first reported (`allThreads`).
        var allThreads: [ThreadStack.RawThreadSnapshot]? = nil
    }

    func run() {
        while !monitor.isStopping {
            let next = round()
            if !monitor.isStopping { monitor.sleepOnThread(until: next) }
        }
        // Stalls still going get their end, marked cut short; held-back ones their summary.
        for (key, watch) in watches {
            if let stall = watch.stall { finish(stall, reason: .monitorStopped) }
            if watch.readableThread != 0 { ThreadStack.releaseReadable(threadID: watch.readableThread) }
            watches[key] = nil
        }
        for (report, sampler) in backoff.drainSummaries() { monitor.enqueue(.suppressed, report, sampler) }
    }

    /// Looks at every loop once; returns when to look again.
    func round() -> ContinuousClock.Instant {
        let now = ContinuousClock.now
        var next = now + monitor.sampleInterval
        let sources = monitor.sources
        let current = Set(sources.map { ObjectIdentifier($0) })
        for (key, watch) in watches where !current.contains(key) {
            // No longer watched (unwatch): a stall in progress ends, cut short.
            if let stall = watch.stall { finish(stall, reason: .monitorStopped) }
            if watch.readableThread != 0 { ThreadStack.releaseReadable(threadID: watch.readableThread) }
            watches[key] = nil
        }
        let settings = StallDetector.Settings(threshold: monitor.threshold, sampleInterval: monitor.sampleInterval)
        for source in sources {
            let key = ObjectIdentifier(source)
            if watches[key] == nil { watches[key] = Watch(source: source, detector: StallDetector(settings)) }
            if let wake = look(at: key) { next = min(next, wake) }
        }
        for (report, sampler) in backoff.expiredSummaries(at: now) { monitor.enqueue(.suppressed, report, sampler) }
        return next
    }

    /// Looks at one loop and does what its detector says; returns when it needs looking at again,
    /// if sooner than the usual round.
    func look(at key: ObjectIdentifier) -> ContinuousClock.Instant? {
        guard var watch = watches[key] else { return nil }
        defer { watches[key] = watch }
        let source = watch.source
        let readFrom = ContinuousClock.now
        let snapshot = source.stallSnapshot()
        let now = ContinuousClock.now
        keepReadable(&watch, snapshot)
        let look = watch.detector.look(snapshot, at: now, readFrom: readFrom)
        if let (reason, end) = look.ended, let stall = watch.stall {
            finish(stall, reason: reason, at: end)
            watch.stall = nil
        }
        if look.threadExited {
            monitor.forget(source)
            if snapshot.threadID != 0 { ThreadStack.forget(threadID: snapshot.threadID) }
            monitor.noteThreadExit(source, threadID: snapshot.threadID)
            return nil
        }
        if look.newWork { watch.cpuAtSeen = snapshot.threadID != 0 ? ProcessThreads.cpuTime(of: snapshot.threadID) : nil }
        if look.reportHang { reportHang(&watch, now: now) }
        switch look.next {
        case .idle, .waitForRound:
            return nil
        case .wait(let until):
            return until
        case .sample:
            var taken = false
            if var stall = watch.stall {
                taken = sample(&stall)
                watch.stall = stall
            }
            let after = watch.detector.sampled(taken, at: now)
            if after.ended != nil, let stall = watch.stall {
                finish(stall, reason: .threadExited)
                watch.stall = nil
            }
            if after.reportHang { reportHang(&watch, now: now) }
            return after.next
        case .begin(let busySince):
            return begin(&watch, snapshot, busySince: busySince, now: now)
        }
    }

    /// Keeps the thread's procfs files open while descriptors are free: a stall in a process whose
    /// descriptor table is full (an accept storm) must still be read.
    private func keepReadable(_ watch: inout Watch, _ snapshot: StallSnapshot) {
        guard snapshot.threadID != 0, snapshot.threadID != watch.readableThread, !snapshot.threadExited,
            ThreadStack.keepReadable(threadID: snapshot.threadID)
        else { return }
        if watch.readableThread != 0 { ThreadStack.releaseReadable(threadID: watch.readableThread) }
        watch.readableThread = snapshot.threadID
    }

    /// A stall begins: its first sample now, the back-off's decision, its first report.
    private func begin(_ watch: inout Watch, _ snapshot: StallSnapshot, busySince: ContinuousClock.Instant, now: ContinuousClock.Instant)
        -> ContinuousClock.Instant?
    {
        let threadID = snapshot.threadID
        var sampler = StackSampler(threadID: threadID)
        guard sampler.sampleFirst(timeout: captureTimeout) else {  // the thread is gone
            return watch.detector.began(false, reported: false, at: now)
        }
        if let error = sampler.lastError { monitor.noteCaptureError(error, watch.source, threadID: threadID) }
        let busyFor = now - busySince
        let signature = sampler.signature ?? []
        let decision = backoff.decide(signature, at: now)
        var stall = StallRecord(
            id: UUID().uuidString, threadID: threadID, startedAt: Date(timeIntervalSinceNow: -busyFor.seconds), busySince: busySince,
            mode: watch.source.currentStallMode() ?? "?", phase: snapshot.phase, item: snapshot.item,
            threadName: (threadID != 0 ? ProcessThreads.name(of: threadID) : nil) ?? snapshot.threadName ?? "?",
            loopName: monitor.name(of: watch.source), seenAt: watch.detector.candidate?.seenAt ?? now, cpuAtSeen: watch.cpuAtSeen,
            lastCPU: (threadID != 0 ? ProcessThreads.cpuTime(of: threadID) : nil).map { ($0, ContinuousClock.now) },
            sampler: sampler, reported: decision.report, suppressedSimilar: decision.suppressedBefore, signature: signature)
        if stall.reported && monitor.capturesAllThreads {
            stall.allThreads = ThreadStack.captureAllAddresses(timeout: Self.allThreadsTimeout, first: threadID)
        }
        monitor.enqueue(stall.reported ? .began : .heldBackBegan, report(stall, now: now), stall.sampler)
        watch.stall = stall
        return watch.detector.began(true, reported: stall.reported, at: now)
    }

    /// A stall the back-off held back has lasted long enough to be a hang: reported after all.
    private func reportHang(_ watch: inout Watch, now: ContinuousClock.Instant) {
        guard var stall = watch.stall else { return }
        stall.reported = true
        backoff.reportedAfterAll(stall.signature)
        if monitor.capturesAllThreads {
            stall.allThreads = ThreadStack.captureAllAddresses(timeout: Self.allThreadsTimeout, first: stall.threadID)
        }
        monitor.enqueue(.began, report(stall, now: now), stall.sampler)
        watch.stall = stall
    }

    /// How long an all-threads snapshot waits for each running thread: short, because it is
    /// taken on the sampling thread while the stall is sampled, and a thread that does not answer
    /// soon (a sanitizer defers signals) is listed with its error rather than delaying the report.
    static let allThreadsTimeout: Duration = .milliseconds(20)

    /// One more sample of a stall, and the thread's CPU clock with it. False when the thread is
    /// gone.
    func sample(_ stall: inout StallRecord) -> Bool {
        guard stall.sampler.sample(timeout: captureTimeout) else { return false }
        if stall.threadID != 0, let cpu = ProcessThreads.cpuTime(of: stall.threadID) { stall.lastCPU = (cpu, ContinuousClock.now) }
        return true
    }

    func report(_ stall: StallRecord, now: ContinuousClock.Instant, reason: StallReport.EndReason? = nil) -> StallReport {
        // The CPU clock now, or at the last sample when the thread has exited since.
        let current = stall.threadID != 0 ? ProcessThreads.cpuTime(of: stall.threadID) : nil
        let reading = current.map { ($0, ContinuousClock.now) } ?? stall.lastCPU
        let cpu = reading.flatMap { reading in stall.cpuAtSeen.map { reading.0 - $0 } } ?? .zero
        let measuredOver = (reading?.1 ?? ContinuousClock.now) - stall.seenAt
        var report = StallReport(
            id: stall.id, processID: getpid(), threadName: stall.threadName, threadID: stall.threadID, mode: stall.mode,
            phase: stall.phase, startedAt: stall.startedAt, duration: now - stall.busySince, threadCPUTime: cpu,
            cpuMeasuredOver: measuredOver, stacks: [], sampleCount: stall.sampler.sampleCount,
            endReason: reason, suppressedSimilar: stall.suppressedSimilar,
            captureError: stall.sampler.lastError?.description, loop: stall.loopName, item: stall.item)
        report.rawAllThreads = stall.allThreads
        return report
    }

    func finish(_ stall: StallRecord, reason: StallReport.EndReason, at end: ContinuousClock.Instant? = nil) {
        let now = end ?? ContinuousClock.now
        let final = report(stall, now: now, reason: reason)
        if stall.reported {
            monitor.enqueue(.ended, final, stall.sampler)
        } else {
            monitor.enqueue(.heldBackEnded, final, stall.sampler)
            backoff.heldBack(stall.signature, final, stall.sampler)
        }
    }
}
