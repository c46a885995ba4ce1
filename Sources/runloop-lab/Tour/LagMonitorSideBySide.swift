import Foundation
import RunLoopKit
import RunLoopMonitor
import Synchronization

import class RunLoopKit.RunLoop

/// Experiment (seed 001, 监控卡顿): the seed's semaphore watchdog and ``StallMonitor`` watch the
/// same loop through the same three stalls.
struct LagMonitorSideBySide: Experiment {
    let title = "Lag monitor: seed 001's semaphore watchdog beside StallMonitor"
    let seed = Seed.cite(0, 1, 4)
    let seedSays = """
        Seeds 000/001 (HCCMonitor): an all-activities observer stores the activity and signals a \
        semaphore; a watchdog on a global queue waits on it — 3 s in the first listing \
        (dispatch_time(DISPATCH_TIME_NOW, 3 * NSEC_PER_SEC)), 20 ms in the class \
        (20*NSEC_PER_MSEC), where "出现三次出结果" (three in a row make a verdict) is commented out, \
        so one timeout in beforeSources or afterWaiting says "monitor trigger", and the all-threads \
        dump ([HCCCallStack callStackWithType:HCCCallStackTypeAll]) is commented out too. Seed 004: \
        the same watchdog with "80毫秒为卡顿阈值" (80 ms is the stall threshold), one timeout. No seed \
        uses 5 × 50 ms. StallMonitor is RunLoopKit's.
        """
    let summary = """
        Seed 001's detector (an all-activities observer that stores the activity and signals a \
        semaphore; a watchdog that waits 50 ms at a time and declares a stall at the 5th timeout in \
        a row in beforeSources or afterWaiting) and a StallMonitor (threshold 200 ms, a stack every \
        25 ms) watch a PermanentThread 'ui-loop' through two 400 ms stalls, a busy timer callback \
        and a blocking task; then both watch the main loop through a slow DispatchQueue.main block; \
        last, a task blocked in one 400 ms usleep, which the monitor must not cut short. \
        Each stall's .ended is awaited before the next. The seed's verdict is a yes or no and an \
        activity; the monitor's report names the function, the phase, the CPU used and the stacks; \
        the stalled thread's own schedstat is the truth to compare with.
        """

    /// How long each stall lasts.
    static let stallLength = Duration.milliseconds(400)
    /// The monitor's threshold and sample interval.
    static let threshold = Duration.milliseconds(200)
    static let sampleInterval = Duration.milliseconds(25)
    /// How long the experiment waits for a report before it says there was none.
    static let patience = Duration.seconds(10)

    /// A monitor event and when it reached the handler.
    struct Delivered: Sendable {
        let event: StallEvent
        let at: ContinuousClock.Instant
    }

    /// What one stall left: when it ran, the monitor's reports, the seed's counted timeouts.
    struct Outcome {
        let label: String
        let start: ThreadMark.Reading?
        let end: ThreadMark.Reading?
        let began: Delivered?
        let ended: Delivered?
        let counted: [SeedLagDetector.CountedTimeout]
        let unexpected: [Delivered]

        /// `instant` as a time since the stall started.
        func since(_ instant: ContinuousClock.Instant) -> String { start.map { Trace.ms(instant - $0.at) } ?? "?" }
    }

    func run() {
        let worker = PermanentThread(name: "ui-loop")
        LabTrace.recordIfTracing(worker.loop)
        let seedOnWorker = SeedLagDetector()
        seedOnWorker.begin(on: worker.loop)
        let inbox = EventInbox<Delivered>()
        // The main loop serves DispatchQueue.main only on the main thread (the tour runs there).
        let main = Thread.isMainThread && RunLoop.main.servesMainDispatchQueue ? RunLoop.main : nil
        // One monitor for both loops, watching from the start: a loop added later with watch(_:)
        // is looked at from the monitor's next round on, and a pass already under way then is
        // measured from that first look, not from its start.
        let monitor = StallMonitor(
            loops: [worker.loop] + (main.map { [$0] } ?? []), threshold: Self.threshold,
            sampleInterval: Self.sampleInterval, logger: nil)
        if let main { LabTrace.recordIfTracing(main) }
        monitor.start { event in
            LabTrace.recordIfTracing(event)
            inbox.post(Delivered(event: event, at: .now))
        }
        Out.line(
            "StallMonitor(loops: [ui-loop\(main == nil ? "" : ", main")], threshold: \(Trace.literal(Self.threshold)), "
                + "sampleInterval: \(Trace.literal(Self.sampleInterval))).start")
        Out.line(
            "the seed's detector beside it on each loop: observer + semaphore + watchdog, "
                + "\(SeedLagDetector.timeoutsForStall) timeouts of \(Trace.literal(SeedLagDetector.wait))")

        var outcomes: [Outcome] = []

        // (a) Busy: a timer callback that computes for 400 ms.
        outcomes.append(
            stall("(a) decodeHugeImage(): a timer callback computing for 400 ms on 'ui-loop'", inbox, seedOnWorker) {
                start, end in
                worker.loop.add(
                    RunLoopTimer(after: .milliseconds(10)) { _ in
                        start.mark()
                        decodeHugeImage()
                        end.mark()
                    }, forMode: .default)
            })

        // (b) Blocked: a task that sleeps in 10 ms steps for 400 ms.
        outcomes.append(
            stall("(b) readConfigSynchronously(): a task blocked for 400 ms on 'ui-loop'", inbox, seedOnWorker) {
                start, end in
                try? worker.execute {
                    start.mark()
                    readConfigSynchronously()
                    end.mark()
                }
            })

        // (c) The main queue, served by the main loop (as in the main-queue experiment).
        if let main {
            let seedOnMain = SeedLagDetector()
            seedOnMain.begin(on: main)
            outcomes.append(
                stall(
                    "(c) layoutAllCells(): a DispatchQueue.main block on the main loop, 5 ms computing, 5 ms asleep, 400 ms",
                    inbox, seedOnMain
                ) { start, end in
                    DispatchQueue.main.async {
                        start.mark()
                        layoutAllCells()
                        end.mark()
                    }
                    // The main thread serves the queue: a run returns once it has served something
                    // (anything still queued from earlier counts too, hence the loop).
                    let deadline = ContinuousClock.now + .seconds(5)
                    while end.reading == nil, ContinuousClock.now < deadline {
                        _ = main.run(mode: .default, for: .seconds(1), returnAfterSourceHandled: true)
                    }
                })
            seedOnMain.end()
        } else {
            // Not on the main thread (or no main-queue handle): the same work as a performed block.
            outcomes.append(
                stall(
                    "(c) layoutAllCells(): the main queue is not served here; a performed block on 'ui-loop' instead",
                    inbox, seedOnWorker
                ) { start, end in
                    worker.loop.perform(inModes: [.common]) {
                        start.mark()
                        layoutAllCells()
                        end.mark()
                    }
                })
        }

        // (d) Blocked in one call: a task that sleeps 400 ms in a single usleep. A signal would end
        // that sleep early (EINTR); the monitor reads the parked thread's stack without one.
        let slept = Mutex<(result: Int32, error: Int32, took: Duration)?>(nil)
        outcomes.append(
            stall("(d) waitForReply(): a task in one usleep(400 ms) on 'ui-loop'", inbox, seedOnWorker) {
                start, end in
                try? worker.execute {
                    start.mark()
                    let began = ContinuousClock.now
                    let outcome = waitForReply()
                    end.mark()
                    slept.withLock { $0 = (outcome.result, outcome.error, ContinuousClock.now - began) }
                }
            })

        monitor.stop()
        seedOnWorker.end()
        worker.stop()

        for outcome in outcomes { Self.print(outcome) }
        if let (result, error, took) = slept.withLock({ $0 }) {
            Out.line(
                "(d) usleep(400 ms) returned \(result)\(result == 0 ? "" : " (errno \(error))") after \(Trace.ms(took)): "
                    + (result == 0 && took >= Self.stallLength
                        ? "the whole sleep, though the monitor sampled the thread every \(Trace.ms(Self.sampleInterval)) (read where the kernel parked it, never signalled)"
                        : "cut short: watching changed the program"))
        }
        writeFlameGraphs(outcomes)
        conclude(outcomes)
    }

    /// Writes each reported stall's flame graph page (FlameGraphPage) beside the tour's traces, or
    /// in the temporary directory; prints where.
    private func writeFlameGraphs(_ outcomes: [Outcome]) {
        let directory = LabTrace.directory.map { URL(filePath: $0) } ?? FileManager.default.temporaryDirectory
        for (index, outcome) in outcomes.enumerated() {
            guard case .ended(let report) = outcome.ended?.event, !report.foldedStacks.isEmpty else { continue }
            let letter = ["a", "b", "c", "d"][min(index, 3)]
            let file = directory.appending(path: "stall-\(letter)-flamegraph.html")
            do {
                try FlameGraphPage.html(for: report).write(to: file, atomically: true, encoding: .utf8)
                Out.line("flame graph of (\(letter)), \(report.sampleCount) samples, blamed \(report.stuckIn ?? "?"): \(file.path)")
            } catch {
                Out.line("flame graph of (\(letter)): cannot write \(file.path): \(error)")
            }
        }
    }

    /// Starts one stall with `trigger`, waits for the monitor's `.began` and `.ended`, then for the
    /// seed's watchdog to finish its round, and collects what both saw.
    private func stall(
        _ label: String, _ inbox: EventInbox<Delivered>, _ seed: SeedLagDetector,
        trigger: (ThreadMark, ThreadMark) -> Void
    ) -> Outcome {
        let start = ThreadMark()
        let end = ThreadMark()
        _ = seed.takeCounted()
        trigger(start, end)
        var unexpected: [Delivered] = []
        let began = inbox.next(timeout: Self.patience, skipped: &unexpected) {
            if case .began = $0.event { true } else { false }
        }
        let ended = began.flatMap { began in
            inbox.next(timeout: Self.patience, skipped: &unexpected) {
                if case .ended(let report) = $0.event { report.id == began.event.report.id } else { false }
            }
        }
        seed.sync()
        return Outcome(
            label: label, start: start.reading, end: end.reading, began: began, ended: ended,
            counted: seed.takeCounted(), unexpected: unexpected)
    }

    private static func print(_ outcome: Outcome) {
        Out.subheading(outcome.label)
        if let start = outcome.start, let end = outcome.end {
            let split = ThreadMark.split(start, end)
            Out.line(
                "the stall:    \(Trace.ms(split.wall)) (schedstat: \(Trace.ms(split.onCPU)) on a CPU, "
                    + "\(Trace.ms(split.waiting)) waiting for one, \(Trace.ms(split.blocked)) blocked)")
        }

        // The seed's verdict.
        let declared = outcome.counted.filter(\.declaredStall)
        let activities = Set(outcome.counted.map { Self.name($0.activity) }).sorted().joined(separator: ", ")
        if declared.isEmpty {
            Out.line(
                "seed 001:     no stall declared (\(outcome.counted.count) timeout(s) counted"
                    + "\(activities.isEmpty ? "" : " in \(activities)"))")
        } else {
            let verdicts = declared.map {
                "at timeout #\($0.count) (\(Self.name($0.activity))), \(outcome.since($0.at)) in"
            }
            Out.line(
                "seed 001:     stall declared \(verdicts.joined(separator: "; ")); "
                    + "\(outcome.counted.count) timeouts counted")
        }

        // The monitor's reports.
        guard let began = outcome.began, case .began(let first) = began.event else {
            Out.line("StallMonitor: no report within \(Trace.ms(Self.patience))")
            return
        }
        Out.line(
            "StallMonitor: .began at \(Trace.ms(first.duration)) (handed over at \(outcome.since(began.at))), "
                + "'\(first.threadName)' in phase \(first.phase)")
        guard let ended = outcome.ended, case .ended(let report) = ended.event else {
            Out.line("              no .ended within \(Trace.ms(Self.patience))")
            return
        }
        Out.line(
            "              .ended after \(Trace.ms(report.duration)) (\(report.endReason?.rawValue ?? "?")): CPU "
                + "\(Trace.ms(report.threadCPUTime)) of \(Trace.ms(report.cpuMeasuredOver)) watched = "
                + "\(Self.percent(report.cpuRatio)) (\(Self.verdict(report.cpuRatio)))")
        let capture = report.captureError.map { "; capture error: \($0)" } ?? ""
        let stacks = report.stacks.count == 1 ? "1 distinct stack" : "\(report.stacks.count) distinct stacks"
        let topCount = report.stacks.first.map { "; the top one (\($0.count) of \(report.sampleCount)):" } ?? ""
        Out.line(
            "              stuckIn \(report.stuckIn ?? "?"); \(Self.plural(report.sampleCount, "sample")), "
                + "\(stacks)\(capture)\(topCount)")
        if let top = report.stacks.first {
            for frame in top.frames.prefix(4) { Out.line("                \(Self.short(frame.summary))") }
            if top.frames.count > 4 { Out.line("                ... \(top.frames.count - 4) more") }
        }
        for other in outcome.unexpected {
            let report = other.event.report
            Out.line("              (also: \(other.event.kind), a stall in \(report.phase), \(report.stuckIn ?? "?"))")
        }
    }

    private func conclude(_ outcomes: [Outcome]) {
        let seedDeclared = outcomes.filter { $0.counted.contains(where: \.declaredStall) }.count
        let seedActivities = Set(outcomes.flatMap { $0.counted.filter(\.declaredStall).map { Self.name($0.activity) } })
        let reports = outcomes.compactMap { outcome -> StallReport? in
            if case .ended(let report) = outcome.ended?.event { report } else { nil }
        }
        let details = reports.map { "\($0.stuckIn ?? "?") in \($0.phase) at \(Self.percent($0.cpuRatio)) CPU" }
        var text =
            "the seed declared \(seedDeclared) of \(outcomes.count) stalls, each as nothing but \"stalled in "
            + "\(seedActivities.sorted().joined(separator: "/"))\"; StallMonitor reported \(reports.count) of "
            + "\(outcomes.count), with where and how: \(details.joined(separator: "; "))."
        let lateness = outcomes.compactMap { outcome -> Duration? in
            guard let began = outcome.began, let start = outcome.start, case .began(let report) = began.event else {
                return nil
            }
            return began.at - start.at - report.duration
        }
        if let worst = lateness.max(), worst > .milliseconds(20) {
            text +=
                " A .began reached the handler up to \(Trace.ms(worst)) after its report was made: the "
                + "reporting thread symbolicates the stack first (slow on first use in a debug build); the "
                + "sampling thread goes on sampling meanwhile."
        }
        Out.conclusion(text)
    }

    /// CF's name of an activity.
    private static func name(_ activity: RunLoop.Activity) -> String {
        switch activity {
        case .entry: "entry"
        case .beforeTimers: "beforeTimers"
        case .beforeSources: "beforeSources"
        case .beforeWaiting: "beforeWaiting"
        case .afterWaiting: "afterWaiting"
        case .exit: "exit"
        default: "\(activity)"
        }
    }

    /// Busy or blocked, from the CPU share. A busy thread on a loaded machine gets less than a
    /// whole core: its share drops although it never blocks.
    private static func verdict(_ ratio: Double) -> String {
        ratio >= 0.7 ? "busy" : ratio <= 0.1 ? "blocked" : "partly on a CPU"
    }

    private static func percent(_ ratio: Double) -> String { "\(Int((ratio * 100).rounded())) %" }

    private static func plural(_ count: Int, _ noun: String) -> String { "\(count) \(noun)\(count == 1 ? "" : "s")" }

    /// A frame's summary cut to fit a line.
    private static func short(_ text: String) -> String {
        text.count <= 92 ? text : String(text.prefix(89)) + "..."
    }
}

extension StallEvent {
    fileprivate var kind: String {
        switch self {
        case .began: ".began"
        case .ended: ".ended"
        case .suppressed: ".suppressed"
        }
    }
}

// MARK: The stalls

/// Where the busy stalls put their result, so that the work is not optimized away.
private let sink = Atomic<UInt64>(0)

/// Now, in nanoseconds of CLOCK_MONOTONIC, read inline (no Swift frame of its own for a sample to
/// land in).
private var monotonicNanoseconds: UInt64 {
    var now = timespec()
    clock_gettime(CLOCK_MONOTONIC, &now)
    return UInt64(now.tv_sec) &* 1_000_000_000 &+ UInt64(now.tv_nsec)
}

/// Stall (a): pure computation on the loop's thread.
@inline(never)
func decodeHugeImage() {
    var hash: UInt64 = 0xcbf2_9ce4_8422_2325
    let nanoseconds = UInt64(LagMonitorSideBySide.stallLength / .nanoseconds(1))
    let end = monotonicNanoseconds &+ nanoseconds
    repeat {
        var round: UInt64 = 0
        while round < 20_000 {
            hash = (hash ^ round) &* 0x100_0000_01b3
            round &+= 1
        }
    } while monotonicNanoseconds < end
    sink.store(hash, ordering: .relaxed)
}

/// Stall (b): a blocking call, sleeping 10 ms at a time (a read that waits on a slow disk).
@inline(never)
func readConfigSynchronously() {
    let end = monotonicNanoseconds &+ UInt64(LagMonitorSideBySide.stallLength / .nanoseconds(1))
    var step = timespec(tv_sec: 0, tv_nsec: 10_000_000)
    while monotonicNanoseconds < end {
        nanosleep(&step, nil)  // a signal (a stack capture) ends a step early: the loop goes on
    }
}

/// Stall (d): one blocking call, a 400 ms usleep (a synchronous request waiting for its reply);
/// returns usleep's result and errno, so an interrupted sleep shows (-1, EINTR).
@inline(never)
func waitForReply() -> (result: Int32, error: Int32) {
    let result = usleep(UInt32(LagMonitorSideBySide.stallLength / .microseconds(1)))
    return (result, errno)
}

/// Stall (c): computing 5 ms, sleeping 5 ms, over and over.
@inline(never)
func layoutAllCells() {
    var hash: UInt64 = 0xcbf2_9ce4_8422_2325
    let end = monotonicNanoseconds &+ UInt64(LagMonitorSideBySide.stallLength / .nanoseconds(1))
    var step = timespec(tv_sec: 0, tv_nsec: 5_000_000)
    while monotonicNanoseconds < end {
        let busyUntil = monotonicNanoseconds &+ 5_000_000
        repeat {
            var round: UInt64 = 0
            while round < 20_000 {
                hash = (hash ^ round) &* 0x100_0000_01b3
                round &+= 1
            }
        } while monotonicNanoseconds < busyUntil
        nanosleep(&step, nil)
    }
    sink.store(hash, ordering: .relaxed)
}
