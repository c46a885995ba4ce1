import Metrics
import RunLoopKit
import Synchronization

/// Frames per second and dropped-frame buckets of a ``DisplayLink``, over windows, to
/// swift-metrics and to a handler: YYFPSLabel's count and Matrix's buckets.
///
/// Each frame's ``DisplayLink/Frame/droppedFrames`` lands in a bucket, Matrix's thresholds:
/// ``Bucket/best`` (0), ``Bucket/normal`` (1–2), ``Bucket/middle`` (3–8), ``Bucket/high``
/// (9–23), ``Bucket/critical`` (24–41), ``Bucket/frozen`` (42 or more). At the end of each window
/// a ``Report`` gives the frames handled, the frames dropped, frames per second (handled frames
/// over the window's length) and the buckets' counts.
///
/// Metrics (label `loop`: the monitor's `label`):
/// - `runloop_fps` (gauge): frames per second of the last window;
/// - `runloop_frames_total` (counter): frames handled;
/// - `runloop_frames_dropped_total` (counter): frames dropped;
/// - `runloop_frame_drops_total` (counter, label `bucket`): handled frames by bucket.
public final class FrameRateMonitor: Sendable {
    /// How many frames were dropped before a handled frame.
    public enum Bucket: String, Sendable, CaseIterable, Codable {
        /// None.
        case best
        /// 1 or 2.
        case normal
        /// 3 to 8.
        case middle
        /// 9 to 23.
        case high
        /// 24 to 41.
        case critical
        /// 42 or more.
        case frozen

        /// The bucket of a frame that followed `dropped` dropped frames.
        public init(dropped: Int) {
            switch dropped {
            case ..<1: self = .best
            case 1...2: self = .normal
            case 3...8: self = .middle
            case 9...23: self = .high
            case 24...41: self = .critical
            default: self = .frozen
            }
        }
    }

    /// One window's figures.
    public struct Report: Sendable, Hashable {
        /// The window's length (from its first frame's timestamp to its last's).
        public var window: Duration
        /// Frames handled.
        public var frames: Int
        /// Frames dropped.
        public var droppedFrames: Int
        /// Handled frames per second.
        public var framesPerSecond: Double
        /// Handled frames by bucket.
        public var buckets: [Bucket: Int]
    }

    /// The loop's name in the metrics' `loop` label.
    public let label: String
    /// The window length.
    public let window: Duration

    private let core: FrameCounter

    /// Watches `link`'s frames; `report` (if any) is called on the link's loop at the end of each
    /// window.
    ///
    /// - Precondition: `window` is positive.
    public init(link: DisplayLink, window: Duration = .seconds(1), label: String = "main",
                report: (@Sendable (Report) -> Void)? = nil) {
        requirePositive(window, "FrameRateMonitor window")
        self.label = label
        self.window = window
        let core = FrameCounter(window: window, label: label, report: report)
        self.core = core
        link.addListener { [core] frame in core.record(frame) }
    }

    /// The last complete window's report, if any.
    public var lastReport: Report? { core.state.locked { $0.last } }

    /// Frames handled and dropped since the monitor began, and the buckets.
    public var totals: Report { core.state.locked { $0.totals } }
}

extension FrameRateMonitor {
    struct State: ~Copyable {
        var windowStart: ContinuousClock.Instant?
        var current = Report(window: .zero, frames: 0, droppedFrames: 0, framesPerSecond: 0, buckets: [:])
        var totals = Report(window: .zero, frames: 0, droppedFrames: 0, framesPerSecond: 0, buckets: [:])
        var last: Report?
    }

    /// What the display link's listener holds: the frame windows and their reports.
    final class FrameCounter: Sendable {
        let window: Duration
        let state = Mutex(State())
        let report: (@Sendable (Report) -> Void)?
        let fps: Gauge
        let frames: Counter
        let dropped: Counter
        let drops: [Bucket: Counter]

        init(window: Duration, label: String, report: (@Sendable (Report) -> Void)?) {
            self.window = window
            self.report = report
            fps = Gauge(label: "runloop_fps", dimensions: [("loop", label)])
            frames = Counter(label: "runloop_frames_total", dimensions: [("loop", label)])
            dropped = Counter(label: "runloop_frames_dropped_total", dimensions: [("loop", label)])
            var drops: [Bucket: Counter] = [:]
            for bucket in Bucket.allCases {
                drops[bucket] = Counter(label: "runloop_frame_drops_total", dimensions: [("loop", label), ("bucket", bucket.rawValue)])
            }
            self.drops = drops
        }

        func record(_ frame: DisplayLink.Frame) {
            let bucket = Bucket(dropped: frame.droppedFrames)
            frames.increment()
            if frame.droppedFrames > 0 { dropped.increment(by: Int64(frame.droppedFrames)) }
            drops[bucket]?.increment()
            let finished = state.locked { state -> Report? in
                state.totals.frames += 1
                state.totals.droppedFrames += frame.droppedFrames
                state.totals.buckets[bucket, default: 0] += 1
                guard let start = state.windowStart else {
                    state.windowStart = frame.timestamp
                    state.current.frames = 1
                    state.current.droppedFrames = frame.droppedFrames
                    state.current.buckets = [bucket: 1]
                    return nil
                }
                state.current.frames += 1
                state.current.droppedFrames += frame.droppedFrames
                state.current.buckets[bucket, default: 0] += 1
                let length = start.duration(to: frame.timestamp)
                guard length >= window else { return nil }
                var done = state.current
                done.window = length
                let seconds = Double(length.components.seconds) + Double(length.components.attoseconds) / 1e18
                // Frames after the window's first: the first one opened it.
                done.framesPerSecond = Double(done.frames - 1) / seconds
                state.last = done
                state.windowStart = frame.timestamp
                state.current = Report(window: .zero, frames: 1, droppedFrames: 0, framesPerSecond: 0, buckets: [bucket: 1])
                return done
            }
            guard let finished else { return }
            fps.record(finished.framesPerSecond)
            report?(finished)
        }
    }
}
