import CoreMetrics
import RunLoopKit
import Synchronization

/// swift-metrics recorders fed by a loop's per-iteration reports: how long its passes work and
/// sleep, the time in each phase, and what woke it — per loop, for the backend the application
/// bootstrapped (Prometheus, StatsD, OpenTelemetry...).
///
/// ```swift
/// let metrics = IterationMetrics(loop: loop, name: "ui")   // on from the loop's next pass
/// // ...
/// metrics.stop()                                           // or let it go
/// ```
///
/// Off unless made: a loop with no `IterationMetrics` reads no clock for it. While on, the loop
/// reads the clock at each phase change and hands each pass's report to these recorders (no
/// allocation per pass once a mode's recorders exist; the cost is in BENCHMARKS.md, `tracecost`).
///
/// Metrics (dimensions `loop` = the name given, or the thread's name; `mode` = the run's mode;
/// Timers record nanoseconds, which Prometheus backends export in seconds, hence `_seconds`):
/// - `runloop_iteration_duration_seconds` (Timer): a pass's time awake (every phase but waiting).
/// - `runloop_sleep_duration_seconds` (Timer): a pass's sleep, for passes that slept.
/// - `runloop_phase_duration_seconds` (Timer, dimension `phase`): the time in each phase but
///   `waiting` (which is the sleep above), recorded only for phases that had work in the pass; a
///   phase's timer is made the first time it has work, so phases that never do have no series.
/// - `runloop_wakeups_total` (Counter, dimension `reason`: timer, descriptor, port, wakeUp,
///   timeout): what ended each sleep.
public final class IterationMetrics: Sendable {
    /// The Timer of a pass's time awake.
    public static let iterationLabel = "runloop_iteration_duration_seconds"
    /// The Timer of a pass's sleep.
    public static let sleepLabel = "runloop_sleep_duration_seconds"
    /// The Timer of the time in each phase (dimension `phase`).
    public static let phaseLabel = "runloop_phase_duration_seconds"
    /// The Counter of wakeups by reason (dimension `reason`).
    public static let wakeupsLabel = "runloop_wakeups_total"

    /// The `loop` dimension's value.
    public let name: String
    private let token: RunLoop.InstrumentationToken

    /// Starts feeding the recorders from `loop`'s passes (any thread).
    ///
    /// - Parameters:
    ///   - loop: The loop whose passes are recorded.
    ///   - name: The `loop` dimension; the loop thread's name if nil.
    public init(loop: RunLoop, name: String? = nil) {
        let name = name ?? loop.threadName
        self.name = name
        let recorders = Recorders(loop: name)
        token = loop.addIterationReporter { report in recorders.record(report) }
    }

    /// Stops feeding the recorders (any thread); also done when the object is released.
    public func stop() { token.cancel() }

    /// One mode's recorders, made on first use. Touched only by the iteration reporter, which runs
    /// on the loop's thread and is never re-entered: `@unchecked Sendable` is safe because no two
    /// threads ever use it.
    private final class Recorders: @unchecked Sendable {
        final class ForMode {
            let iteration: Timer
            let sleep: Timer
            /// Made on a phase's first pass with work (nil before).
            var phases: [Timer?]
            let wakeups: [Counter]
            let base: [(String, String)]

            init(base: [(String, String)]) {
                self.base = base
                iteration = Timer(label: IterationMetrics.iterationLabel, dimensions: base)
                sleep = Timer(label: IterationMetrics.sleepLabel, dimensions: base)
                phases = Array(repeating: nil, count: Recorders.phases.count)
                wakeups = Recorders.reasons.map {
                    Counter(label: IterationMetrics.wakeupsLabel, dimensions: base + [("reason", $0.description)])
                }
            }

            func phase(_ index: Int) -> Timer {
                if let timer = phases[index] { return timer }
                let timer = Timer(
                    label: IterationMetrics.phaseLabel, dimensions: base + [("phase", Recorders.phases[index].description)])
                phases[index] = timer
                return timer
            }
        }

        let loop: String
        var modes: [(mode: RunLoop.Mode, recorders: ForMode)] = []
        static let phases = RunLoop.Phase.allCases.filter { $0 != .notRunning && $0 != .waiting }
        static let reasons: [RunLoop.WakeReason] = [.timer, .descriptor, .port, .wakeUp, .timeout]

        init(loop: String) { self.loop = loop }

        func recorders(for mode: RunLoop.Mode) -> ForMode {
            // A loop runs in a few modes: a linear search beats hashing a string per pass.
            for entry in modes where entry.mode == mode { return entry.recorders }
            let made = ForMode(base: [("loop", loop), ("mode", mode.rawValue)])
            modes.append((mode, made))
            return made
        }

        func record(_ report: RunLoop.IterationReport) {
            let recorders = recorders(for: report.mode)
            let times = report.phaseTimes
            var awake: Int64 = 0
            var index = 0
            while index < Self.phases.count {
                let phase = Self.phases[index]
                let ns = times[phase].nanosecondsValue
                if ns > 0 {
                    recorders.phase(index).recordNanoseconds(ns)
                    awake += ns
                }
                index += 1
            }
            recorders.iteration.recordNanoseconds(awake)
            if report.wakeReason != .none {
                recorders.sleep.recordNanoseconds(report.slept.nanosecondsValue)
                if let reason = Self.reasons.firstIndex(of: report.wakeReason) { recorders.wakeups[reason].increment() }
            }
        }
    }
}
