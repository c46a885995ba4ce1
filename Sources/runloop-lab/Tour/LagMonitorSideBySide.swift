import Foundation
import RunLoopKit
import RunLoopMonitor
import Synchronization

import class RunLoopKit.RunLoop

/// Experiment 8 (seeds 000/001 and 004, 监控卡顿): the seeds' semaphore watchdogs, with each
/// seed's own wait and count, and ``StallMonitor`` watch the same loops through the same stalls.
struct LagMonitorSideBySide: Experiment {
    let title = "Lag monitor: the seeds' semaphore watchdogs, as written, beside StallMonitor"
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
        The seeds' detector (an all-activities observer that stores the activity and signals a \
        semaphore; a watchdog that declares a stall when a wait times out in beforeSources or \
        afterWaiting) runs with each seed's values: HCCMonitor's 20 ms × 1 and seed 004's 80 ms × 1 \
        beside a StallMonitor (threshold 200 ms, a stack every 25 ms). They watch a \
        PermanentThread 'ui-loop' through 400 ms stalls (a busy timer callback, a blocking task), \
        the main loop through a slow DispatchQueue.main block, and a task blocked in one 400 ms \
        usleep, which the monitor must not cut short. Seeds 000/001's first listing waits 3 s: it \
        cannot see a 400 ms stall, so it runs once, on a 3.2 s blocked task (e), which makes this \
        experiment about 4 s longer. Each stall's .ended is awaited before the next. The seeds' \
        verdict is a yes or no and an activity, repeated at every timeout while the stall lasts; \
        the monitor's report names the function, the phase, the CPU used and the stacks; the \
        stalled thread's own schedstat is the truth to compare with.
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
        /// Each seed detector's configuration and the timeouts it counted during the stall.
        let counted: [(SeedLagDetector.Configuration, [SeedLagDetector.CountedTimeout])]
        let unexpected: [Delivered]

        /// `instant` as a time since the stall started.
        func since(_ instant: ContinuousClock.Instant) -> String { start.map { TourLog.ms(instant - $0.at) } ?? "?" }
    }

    func run() {
        let worker = PermanentThread(name: "ui-loop")
        LabTrace.recordIfTracing(worker.loop)
        let dump = AllThreadsDump()
        let seedOnWorker = [SeedLagDetector(.hccMonitor, onStall: dump.atTrigger), SeedLagDetector(.seed004)]
        for detector in seedOnWorker { detector.begin(on: worker.loop) }
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
            "StallMonitor(loops: [ui-loop\(main == nil ? "" : ", main")], threshold: \(TourLog.literal(Self.threshold)), "
                + "sampleInterval: \(TourLog.literal(Self.sampleInterval))).start")
        Out.line(
            "the seeds' detectors beside it on each loop: observer + semaphore + watchdog, "
                + seedOnWorker.map { "\($0.configuration.name) \($0.configuration.shortDescription)" }.joined(separator: ", "))

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
            let seedOnMain = [SeedLagDetector(.hccMonitor), SeedLagDetector(.seed004)]
            for detector in seedOnMain { detector.begin(on: main) }
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
            for detector in seedOnMain { detector.end() }
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
                    slept.locked { $0 = (outcome.result, outcome.error, ContinuousClock.now - began) }
                }
            })

        // (e) Seeds 000/001's first listing waits 3 s: only a stall longer than that shows it, so it
        // is watched once, on a task blocked for 3.2 s (nanosleep steps, like (b)).
        let firstListing = SeedLagDetector(.firstListing)
        firstListing.begin(on: worker.loop)
        outcomes.append(
            stall("(e) waitForSlowServer(): a task blocked for 3.2 s on 'ui-loop'", inbox, seedOnWorker + [firstListing]) {
                start, end in
                try? worker.execute {
                    start.mark()
                    waitForSlowServer()
                    end.mark()
                }
            })
        firstListing.end()

        monitor.stop()
        for detector in seedOnWorker { detector.end() }
        worker.stop()

        for (index, outcome) in outcomes.enumerated() {
            Self.print(outcome)
            if index == 0 { Self.print(dump) }
        }
        if let (result, error, took) = slept.locked({ $0 }) {
            Out.line(
                "(d) usleep(400 ms) returned \(result)\(result == 0 ? "" : " (errno \(error))") after \(TourLog.ms(took)): "
                    + (result == 0 && took >= Self.stallLength
                        ? "the whole sleep, though the monitor sampled the thread every \(TourLog.ms(Self.sampleInterval)) (read where the kernel parked it, never signalled)"
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
            let letter = ["a", "b", "c", "d", "e"][min(index, 4)]
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
        _ label: String, _ inbox: EventInbox<Delivered>, _ seeds: [SeedLagDetector],
        trigger: (ThreadMark, ThreadMark) -> Void
    ) -> Outcome {
        let start = ThreadMark()
        let end = ThreadMark()
        for seed in seeds { _ = seed.takeCounted() }
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
        for seed in seeds { seed.sync() }
        return Outcome(
            label: label, start: start.reading, end: end.reading, began: began, ended: ended,
            counted: seeds.map { ($0.configuration, $0.takeCounted()) }, unexpected: unexpected)
    }

    /// Prints the all-threads dump taken at the seeds' first trigger (after stall (a)).
    private static func print(_ dump: AllThreadsDump) {
        guard let lines = dump.captured else {
            Out.line("all threads' stacks at the first \"monitor trigger\" (the seeds' HCCCallStackTypeAll): the detector did not trigger")
            return
        }
        Out.line("all threads' stacks at the first \"monitor trigger\" (the seeds' HCCCallStackTypeAll):")
        for line in lines { Out.line("  \(line)") }
    }

    private static func print(_ outcome: Outcome) {
        Out.subheading(outcome.label)
        if let start = outcome.start, let end = outcome.end {
            let split = ThreadMark.split(start, end)
            Out.line(
                "the stall:    \(TourLog.ms(split.wall)) (schedstat: \(TourLog.ms(split.onCPU)) on a CPU, "
                    + "\(TourLog.ms(split.waiting)) waiting for one, \(TourLog.ms(split.blocked)) blocked)")
        }

        // The seeds' verdicts: one line per detector.
        for (configuration, counted) in outcome.counted {
            let name = "\(configuration.name) (\(configuration.shortDescription)):".padding(
                toLength: 44, withPad: " ", startingAt: 0)
            let declared = counted.filter(\.declaredStall)
            let activities = Set(counted.map { Self.name($0.activity) }).sorted().joined(separator: ", ")
            if declared.isEmpty {
                Out.line("\(name) no stall declared (\(counted.count) timeout(s) counted\(activities.isEmpty ? "" : " in \(activities)"))")
            } else {
                let first = declared[0]
                Out.line(
                    "\(name) \"monitor trigger\" \(declared.count == 1 ? "once" : "\(declared.count) times"), "
                        + "first \(outcome.since(first.at)) in (\(Self.name(first.activity)))")
            }
        }

        // The monitor's reports.
        guard let began = outcome.began, case .began(let first) = began.event else {
            Out.line("StallMonitor: no report within \(TourLog.ms(Self.patience))")
            return
        }
        Out.line(
            "StallMonitor: .began at \(TourLog.ms(first.duration)) (handed over at \(outcome.since(began.at))), "
                + "'\(first.threadName)' in phase \(first.phase)")
        guard let ended = outcome.ended, case .ended(let report) = ended.event else {
            Out.line("              no .ended within \(TourLog.ms(Self.patience))")
            return
        }
        Out.line(
            "              .ended after \(TourLog.ms(report.duration)) (\(report.endReason?.rawValue ?? "?")): CPU "
                + "\(TourLog.ms(report.threadCPUTime)) of \(TourLog.ms(report.cpuMeasuredOver)) watched = "
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
        // Per seed configuration: how many of the stalls it watched it declared.
        var verdicts: [String] = []
        for configuration in [SeedLagDetector.Configuration.hccMonitor, .seed004, .firstListing] {
            let watched = outcomes.filter { $0.counted.contains { $0.0.name == configuration.name } }
            let declared = watched.filter { outcome in
                outcome.counted.contains { $0.0.name == configuration.name && $0.1.contains(where: \.declaredStall) }
            }
            verdicts.append("\(configuration.name) (\(configuration.shortDescription)) \(declared.count) of \(watched.count)")
        }
        let reports = outcomes.compactMap { outcome -> StallReport? in
            if case .ended(let report) = outcome.ended?.event { report } else { nil }
        }
        let details = reports.map { "\($0.stuckIn ?? "?") in \($0.phase) at \(Self.percent($0.cpuRatio)) CPU" }
        var text =
            "the seeds' detectors declared \(verdicts.joined(separator: ", ")) stalls, each as nothing but "
            + "\"monitor trigger\" and an activity, again at every timeout while it lasts (with one timeout "
            + "to a verdict, the short waits also fire on any pass longer than the wait); StallMonitor "
            + "reported \(reports.count) of \(outcomes.count), once each, with where and how: "
            + "\(details.joined(separator: "; "))."
        let lateness = outcomes.compactMap { outcome -> Duration? in
            guard let began = outcome.began, let start = outcome.start, case .began(let report) = began.event else {
                return nil
            }
            return began.at - start.at - report.duration
        }
        if let worst = lateness.max(), worst > .milliseconds(20) {
            text +=
                " A .began reached the handler up to \(TourLog.ms(worst)) after its report was made: the "
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

/// Stall (e): a task blocked for 3.2 s (a request to a slow server), long enough for seeds 000/001's
/// first listing, whose watchdog waits 3 s.
@inline(never)
func waitForSlowServer() {
    let end = monotonicNanoseconds &+ 3_200_000_000
    var step = timespec(tv_sec: 0, tv_nsec: 10_000_000)
    while monotonicNanoseconds < end {
        nanosleep(&step, nil)
    }
}

// MARK: The seeds' all-threads dump

/// What the seeds do at a trigger: `[HCCCallStack callStackWithType:HCCCallStackTypeAll]`, every
/// thread's stack (seeds 000/001; the call is commented out there). Kept for the first trigger only.
final class AllThreadsDump: Sendable {
    private let lines = Mutex<[String]?>(nil)
    private let triggered = Atomic<Bool>(false)

    /// The detector's `onStall`: captures every thread's stack at the first trigger.
    @Sendable func atTrigger(_ timeout: SeedLagDetector.CountedTimeout) {
        guard !triggered.exchange(true, ordering: .acquiringAndReleasing) else { return }
        let captured = Self.captureAllThreads()
        lines.locked { $0 = captured }
    }

    /// The dump, if one was taken.
    var captured: [String]? { lines.locked { $0 } }

    /// Frames shown per thread: enough to see where each one is; the report keeps them all.
    static let framesShown = 6

    /// `ThreadStack.captureAll()`: one line per thread (id, name, how its stack was read), then its
    /// innermost frames. Threads parked in the kernel are read without a signal.
    static func captureAllThreads() -> [String]? {
        var lines: [String] = []
        for thread in ThreadStack.captureAll() {
            let how = thread.unwinder.map { $0 == .parkedInKernel ? "parked in the kernel, read without a signal" : "running, signalled" }
            lines.append("thread \(thread.threadID) '\(thread.name)'\(thread.isCallingThread ? " (the detector's own)" : ""): \(how ?? "not captured: \(thread.error ?? "?")")")
            for frame in thread.frames.prefix(framesShown) { lines.append("  \(frame.symbol ?? frame.summary)") }
            if thread.frames.count > framesShown { lines.append("  … \(thread.frames.count - framesShown) more") }
        }
        return lines
    }
}
