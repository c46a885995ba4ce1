#if OpenCombine
import OpenCombine
public import RunLoopKit
import Synchronization
#if canImport(FoundationEssentials)
public import FoundationEssentials
#else
public import Foundation
#endif

// A RunLoop is an OpenCombine scheduler, as NSRunLoop is Combine's: `receive(on: loop)` runs the
// downstream as a block of the loop, and a delayed or repeating schedule is a timer of the loop.
// Its time is a `Date`, as Combine's RunLoop scheduler's is (so `now` follows the wall clock, and
// code written against `RunLoop.SchedulerTimeType` on Darwin reads the same), and each schedule
// may name the modes it runs in (Combine's has no options: its work runs in the default mode only,
// so `receive(on: RunLoop.main)` stalls while a tracking run is in progress; `.modes([.common])`
// is the way out here).

extension RunLoop: OpenCombine.Scheduler {
    /// A point in a loop scheduler's time: a `Date`, as for Combine's `RunLoop` scheduler.
    public struct SchedulerTimeType: Strideable, Codable, Hashable, Sendable {
        /// The date this time stands for.
        public var date: Date

        /// The time at `date`.
        public init(_ date: Date) { self.date = date }

        /// The seconds from this time to `other` (negative if `other` is earlier).
        public func distance(to other: SchedulerTimeType) -> Stride {
            Stride(other.date.timeIntervalSinceReferenceDate - date.timeIntervalSinceReferenceDate)
        }

        /// This time moved by `stride`.
        public func advanced(by stride: Stride) -> SchedulerTimeType {
            SchedulerTimeType(date.addingTimeInterval(stride.magnitude))
        }

        /// A signed number of seconds between two scheduler times.
        public struct Stride: SchedulerTimeIntervalConvertible, Comparable, SignedNumeric,
            ExpressibleByFloatLiteral, Codable, Sendable
        {
            /// Seconds, as a floating-point literal.
            public typealias FloatLiteralType = TimeInterval
            /// Seconds, as an integer literal (a `TimeInterval`, as in Combine).
            public typealias IntegerLiteralType = TimeInterval
            /// The stride's value in seconds.
            public typealias Magnitude = TimeInterval

            /// The stride in seconds (signed, unlike most `magnitude`s: Combine's shape).
            public var magnitude: TimeInterval

            /// The stride in seconds.
            public var timeInterval: TimeInterval { magnitude }

            /// A stride of `seconds`.
            public init(_ seconds: TimeInterval) { magnitude = seconds }
            /// A stride of `value` seconds.
            public init(floatLiteral value: TimeInterval) { magnitude = value }
            /// A stride of `value` seconds.
            public init(integerLiteral value: TimeInterval) { magnitude = value }
            /// A stride of `source` seconds, or nil when a `TimeInterval` cannot hold it exactly.
            public init?<Source: BinaryInteger>(exactly source: Source) {
                guard let seconds = TimeInterval(exactly: source) else { return nil }
                magnitude = seconds
            }

            /// A stride of `s` seconds.
            public static func seconds(_ s: Int) -> Stride { Stride(TimeInterval(s)) }
            /// A stride of `s` seconds.
            public static func seconds(_ s: Double) -> Stride { Stride(s) }
            /// A stride of `ms` milliseconds.
            public static func milliseconds(_ ms: Int) -> Stride { Stride(TimeInterval(ms) / 1e3) }
            /// A stride of `us` microseconds.
            public static func microseconds(_ us: Int) -> Stride { Stride(TimeInterval(us) / 1e6) }
            /// A stride of `ns` nanoseconds.
            public static func nanoseconds(_ ns: Int) -> Stride { Stride(TimeInterval(ns) / 1e9) }

            /// Whether `lhs` is shorter than `rhs`.
            public static func < (lhs: Stride, rhs: Stride) -> Bool { lhs.magnitude < rhs.magnitude }
            /// The product of the two strides' seconds.
            public static func * (lhs: Stride, rhs: Stride) -> Stride { Stride(lhs.magnitude * rhs.magnitude) }
            /// The sum of the two strides.
            public static func + (lhs: Stride, rhs: Stride) -> Stride { Stride(lhs.magnitude + rhs.magnitude) }
            /// The difference of the two strides.
            public static func - (lhs: Stride, rhs: Stride) -> Stride { Stride(lhs.magnitude - rhs.magnitude) }
            /// Multiplies `lhs` by `rhs`'s seconds.
            public static func *= (lhs: inout Stride, rhs: Stride) { lhs.magnitude *= rhs.magnitude }
            /// Adds `rhs` to `lhs`.
            public static func += (lhs: inout Stride, rhs: Stride) { lhs.magnitude += rhs.magnitude }
            /// Subtracts `rhs` from `lhs`.
            public static func -= (lhs: inout Stride, rhs: Stride) { lhs.magnitude -= rhs.magnitude }
        }
    }

    /// Where a schedule's work runs: the loop modes (`RunLoop.Mode.default` unless given).
    public struct SchedulerOptions: Sendable, Hashable {
        /// The modes the work runs in; an empty list counts as the default mode.
        public var modes: [Mode]

        /// Work that runs in `modes`.
        public init(modes: [Mode]) { self.modes = modes }

        /// Work that runs in `modes`: `receive(on: loop, options: .modes([.common]))` keeps
        /// delivering while a tracking run is in progress.
        public static func modes(_ modes: [Mode]) -> SchedulerOptions { SchedulerOptions(modes: modes) }
    }

    /// The current time (the wall clock, as for Combine's `RunLoop` scheduler).
    public var now: SchedulerTimeType { SchedulerTimeType(Date()) }

    /// Zero: a loop timer may fire exactly on time.
    public var minimumTolerance: SchedulerTimeType.Stride { 0 }

    /// Runs `action` on the loop's thread at its next pass in the options' modes (a block of the
    /// loop, which is woken for it).
    ///
    /// On a loop whose thread has exited (before the action was scheduled, or before it ran), the
    /// action runs at once on the thread that finds the loop gone, with a warning, so that a
    /// subscription delivers its values and completes instead of waiting forever.
    public func schedule(options: SchedulerOptions?, _ action: @escaping () -> Void) {
        let action = OnceAction(action, loop: self)
        perform(inModes: Self.modes(options)) { action.run() }
        wakeUp()
    }

    /// Runs `action` once on the loop's thread at `date`, up to `tolerance` late, in the options'
    /// modes: a one-shot loop timer. A date in the past runs at the next pass; a non-finite
    /// tolerance counts as none. On a loop whose thread has exited, the action runs at once, as
    /// for ``schedule(options:_:)``: `delay` and `debounce` on a dead loop complete early rather
    /// than never.
    public func schedule(
        after date: SchedulerTimeType, tolerance: SchedulerTimeType.Stride, options: SchedulerOptions?,
        _ action: @escaping () -> Void
    ) {
        let action = OnceAction(action, loop: self)
        let timer = RunLoopTimer(fire: date.date, interval: 0, repeats: false) { _ in action.run() }
        add(timer, tolerance: tolerance, options: options)
    }

    /// Runs `action` on the loop's thread at `date` and then every `interval`, in the options'
    /// modes: a repeating loop timer, stopped by cancelling the result (from any thread). As for
    /// Foundation's timers, an interval of 0.1 ms or less repeats every 0.1 ms.
    public func schedule(
        after date: SchedulerTimeType, interval: SchedulerTimeType.Stride, tolerance: SchedulerTimeType.Stride,
        options: SchedulerOptions?, _ action: @escaping () -> Void
    ) -> any Cancellable {
        let action = SchedulerAction(action)
        let timer = RunLoopTimer(fire: date.date, interval: interval.timeInterval, repeats: true) { _ in action.run() }
        add(timer, tolerance: tolerance, options: options)
        return AnyCancellable { timer.invalidate() }
    }

    private func add(_ timer: RunLoopTimer, tolerance: SchedulerTimeType.Stride, options: SchedulerOptions?) {
        let seconds = tolerance.timeInterval
        if seconds > 0, seconds.isFinite { timer.tolerance = .seconds(Swift.min(seconds, 1e9)) }
        for mode in Self.modes(options) { add(timer, forMode: mode) }
    }

    private static func modes(_ options: SchedulerOptions?) -> [Mode] {
        guard let modes = options?.modes, !modes.isEmpty else { return [.default] }
        return modes
    }
}

/// A one-shot action on its way to the loop's thread, run exactly once: by the loop, or — when the
/// loop lets go of it without running it (its thread exited, before or after it was scheduled) —
/// by whoever releases it last, at once, with a warning. A subscription on a dead loop then
/// completes instead of hanging.
///
/// `@unchecked Sendable` as ``SchedulerAction``; `claimed` makes the run exactly-once.
final class OnceAction: @unchecked Sendable {
    private let body: () -> Void
    private let claimed = Atomic<Bool>(false)
    private weak let loop: RunLoop?

    init(_ body: @escaping () -> Void, loop: RunLoop) {
        self.body = body
        self.loop = loop
    }

    func run() {
        guard !claimed.exchange(true, ordering: .acquiringAndReleasing) else { return }
        body()
    }

    deinit {
        guard !claimed.load(ordering: .acquiring) else { return }
        print(
            "RunLoopCombine: warning: an action scheduled on \(loop?.shortDescription ?? "a run loop") never ran there: its thread has exited; it runs now, on the thread that found the loop gone"
        )
        body()
    }
}

/// A scheduler's action on its way to the loop's thread.
///
/// Safe to send (hence `@unchecked`): OpenCombine's `Scheduler` predates Sendable, and hands the
/// action over to the scheduler, as it does to a `DispatchQueue`; from then on only the loop
/// calls it, on the loop's own thread, one call at a time (a block runs once; a repeating timer's
/// fires never overlap). What the action captures is the caller's, as with any Combine scheduler.
struct SchedulerAction: @unchecked Sendable {
    private let body: () -> Void
    init(_ body: @escaping () -> Void) { self.body = body }
    func run() { body() }
}
#endif
