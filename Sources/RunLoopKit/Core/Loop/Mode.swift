extension RunLoop {
    /// A run loop mode: the named set of sources, timers and observers a run watches.
    ///
    /// Modes are created on demand, the first time an item is added for them, and are never
    /// removed. ``common`` is not a real mode but a placeholder for every mode in
    /// ``RunLoop/commonModes``.
    public struct Mode: RawRepresentable, Hashable, Sendable, ExpressibleByStringLiteral,
        CustomStringConvertible
    {
        /// The mode's name, as CoreFoundation spells it.
        public let rawValue: String

        /// Creates a mode with the given name.
        public init(rawValue: String) { self.rawValue = rawValue }

        /// Creates a mode from a string literal, as in `let mode: RunLoop.Mode = "MyMode"`.
        public init(stringLiteral value: String) { self.rawValue = value }

        /// The default mode (`kCFRunLoopDefaultMode`), in which threads usually run.
        public static let `default` = Mode(rawValue: "kCFRunLoopDefaultMode")

        /// The common-modes placeholder (`kCFRunLoopCommonModes`): an item added for it is added to
        /// every mode in ``RunLoop/commonModes``, now and later. A loop cannot run in it.
        public static let common = Mode(rawValue: "kCFRunLoopCommonModes")

        /// UIKit's tracking mode (`UITrackingRunLoopMode`), which the main loop enters while a
        /// scroll view tracks a touch.
        public static let tracking = Mode(rawValue: "UITrackingRunLoopMode")

        /// The mode's name.
        public var description: String { rawValue }
    }

    /// The stages of a run that a ``RunLoopObserver`` can watch (CFRunLoopActivity).
    public struct Activity: OptionSet, Sendable, Hashable, CustomStringConvertible {
        /// The activity bits, with CoreFoundation's values.
        public let rawValue: UInt

        /// Creates an activity set from CoreFoundation's bits.
        public init(rawValue: UInt) { self.rawValue = rawValue }

        /// A run is starting (`kCFRunLoopEntry`).
        public static let entry = Activity(rawValue: 1 << 0)
        /// The loop is about to process timers (`kCFRunLoopBeforeTimers`).
        public static let beforeTimers = Activity(rawValue: 1 << 1)
        /// The loop is about to process sources (`kCFRunLoopBeforeSources`).
        public static let beforeSources = Activity(rawValue: 1 << 2)
        /// The loop is about to sleep in the kernel (`kCFRunLoopBeforeWaiting`).
        public static let beforeWaiting = Activity(rawValue: 1 << 5)
        /// The loop has woken up (`kCFRunLoopAfterWaiting`).
        public static let afterWaiting = Activity(rawValue: 1 << 6)
        /// A run is ending (`kCFRunLoopExit`).
        public static let exit = Activity(rawValue: 1 << 7)
        /// Every activity (`kCFRunLoopAllActivities`).
        public static let allActivities = Activity(rawValue: 0x0FFF_FFFF)

        /// The activity names, as in `[entry, beforeTimers]`.
        public var description: String {
            if self == .allActivities { return "allActivities" }
            let names: [(Activity, String)] = [
                (.entry, "entry"), (.beforeTimers, "beforeTimers"), (.beforeSources, "beforeSources"),
                (.beforeWaiting, "beforeWaiting"), (.afterWaiting, "afterWaiting"), (.exit, "exit"),
            ]
            let parts = names.filter { contains($0.0) }.map(\.1)
            return parts.count == 1 ? parts[0] : "[" + parts.joined(separator: ", ") + "]"
        }
    }

    /// Why a run returned (CFRunLoopRunResult, with CoreFoundation's raw values).
    public enum RunResult: Int32, Sendable, CustomStringConvertible {
        /// The mode has no sources, timers, pending blocks or pending work (``RunLoopPendingWork``),
        /// or was ``Mode/common``.
        case finished = 1
        /// ``RunLoop/stop()`` ended the run.
        case stopped = 2
        /// The timeout passed.
        case timedOut = 3
        /// A source was handled and the run was asked to return after one.
        case handledSource = 4

        /// The case's name.
        public var description: String {
            switch self {
            case .finished: "finished"
            case .stopped: "stopped"
            case .timedOut: "timedOut"
            case .handledSource: "handledSource"
            }
        }
    }
}
