import Synchronization

/// A timer that fires on a run loop's thread (CoreFoundation's CFRunLoopTimer / NSTimer).
///
/// A timer fires only while its loop runs in one of the timer's modes. A repeating timer keeps its
/// phase: after a late fire its next fire date is the first point of its schedule
/// (`fireDate + k·interval`) after now, so missed points are skipped, not bunched. A fire date set
/// inside the handler is kept. A one-shot timer is invalidated after its handler returns.
///
/// Unlike CoreFoundation on Linux, ``tolerance`` is honoured: the timer may fire anywhere in
/// `[fireDate, fireDate + tolerance]`, and the loop uses that room to serve several timers with
/// one wakeup.
///
/// A fire date in the past counts as now, as in CoreFoundation: the date is clamped when the timer
/// is made and when ``fireDate`` is set, so overdue timers fire in the order they were made or
/// set, and a repeating timer's phase counts from the clamped date. ``fireDate`` still reports
/// the date given until the timer fires (CoreFoundation's `CFRunLoopTimerGetNextFireDate` too).
///
/// A timer belongs to at most one loop (any number of its modes); adding it to a second loop
/// does nothing. ``invalidate()`` lets go of the handler, and so of everything it captured, at
/// once.
public final class RunLoopTimer: Sendable, Hashable, CustomStringConvertible {
    /// The repeat interval; `.zero` for a one-shot timer (saturated to `Int64.max` nanoseconds,
    /// about 292 years).
    public var interval: Duration { .nanoseconds(intervalNs) }
    /// The order among timers due at the same moment in CoreFoundation; kept for API parity
    /// (RunLoopKit fires equal fire dates in insertion order).
    public let order: Int

    let intervalNs: Int64
    /// Bit 0: the timer's handler is running (set and cleared on the loop's thread only). The other
    /// bits: the generation, bumped (under `state`'s lock) on every change of schedule, membership
    /// or validity; a heap entry whose generation differs is stale. Read without the lock.
    ///
    /// One word for both keeps the object at 120 bytes, inside glibc's fast bins: freeing a
    /// fired one-shot timer is then a push on a list rather than a coalescing free.
    private let stamp = Atomic<UInt64>(2)
    let state: Mutex<TimerState>
    /// The handler; nil once the timer is invalid, so nothing it captured outlives the timer's
    /// usefulness (stale heap entries may keep the timer object itself a while longer).
    ///
    /// Outside `state` so that the loop can read it without the lock as it fires the timer.
    /// `nonisolated(unsafe)` is safe by this protocol: it is written only under `state`'s lock
    /// (``invalidate()``, or the thread that fired it, after firing), and ``invalidate()`` writes it
    /// only if its generation bump shows the timer not firing (bit 0 of `stamp` clear; otherwise
    /// the firing thread lets it go after the handler, see ``finishFiring()``). The loop reads it
    /// unlocked only right after its `beginFiring` found the stamp equal to a live entry's
    /// generation with bit 0 clear: no invalidation came before (the generation would differ)
    /// and none after will write it (bit 0 is set). Other reads take the lock.
    nonisolated(unsafe) private var storedHandler: Handler?

    /// The current generation (bit 0 clear).
    @inline(__always)
    var generation: UInt64 { stamp.load(ordering: .acquiring) & ~1 }

    /// Makes every heap entry of the timer stale. Under `state`'s lock. Returns whether the timer
    /// was firing at that moment.
    @inline(__always)
    @discardableResult
    func bumpGeneration() -> Bool { stamp.add(2, ordering: .acquiringAndReleasing).oldValue & 1 != 0 }

    /// Marks the handler as running; returns the stamp as it was (the generation, and bit 0 set if
    /// it was running already).
    @inline(__always)
    func markFiring() -> UInt64 { stamp.bitwiseOr(1, ordering: .acquiringAndReleasing).oldValue }

    /// Marks the handler as running; `false` if it already was (it fires in an outer run).
    @inline(__always)
    func beginFiring() -> Bool { markFiring() & 1 == 0 }

    /// Clears the running mark.
    @inline(__always)
    func endFiring() { stamp.bitwiseAnd(~1, ordering: .releasing) }

    /// The handler, read by the loop without the lock (see `storedHandler`): only right after
    /// ``markFiring()`` returned a live entry's generation.
    @inline(__always)
    var handlerWhileFiring: Handler? { storedHandler }

    /// Takes the handler out, for the caller to release with no lock held. Under `state`'s lock,
    /// by a thread that may write it (see `storedHandler`).
    func takeHandler() -> HeldHandler {
        defer { storedHandler = nil }
        return HeldHandler(storedHandler)
    }

    /// Clears the running mark, and lets go of the handler if the timer was invalidated while it
    /// ran (``invalidate()`` leaves that to the firing thread).
    func finishFiring() {
        endFiring()
        releaseHandlerIfInvalid()
    }

    /// Lets go of the handler if the timer is invalid, by a thread whose firing mark is off.
    func releaseHandlerIfInvalid() {
        let handler = state.locked { timerState -> HeldHandler in timerState.valid ? HeldHandler(nil) : takeHandler() }
        withExtendedLifetime(handler) {}
    }

    /// Whether the handler is running.
    @inline(__always)
    var isFiring: Bool { stamp.load(ordering: .relaxed) & 1 != 0 }

    /// Creates a timer that first fires at `fireAt`.
    ///
    /// - Parameters:
    ///   - fireAt: The first fire date.
    ///   - interval: The repeat interval; `.zero` (or a negative value) for a one-shot timer.
    ///   - tolerance: How late the timer may fire to share a wakeup; negative values count as zero.
    ///   - order: Kept for parity with CoreFoundation.
    ///   - handler: Called on the loop's thread with the timer.
    public init(
        fireAt: ContinuousClock.Instant,
        interval: Duration = .zero,
        tolerance: Duration = .zero,
        order: Int = 0,
        handler: @escaping @Sendable (RunLoopTimer) -> Void
    ) {
        let intervalNs = max(0, interval.saturatedNanoseconds)
        self.intervalNs = intervalNs
        self.order = order
        self.state = Mutex(
            TimerState(
                fireNs: LoopClock.notBeforeNow(LoopClock.nanoseconds(fireAt)),
                reportedNs: LoopClock.nanoseconds(fireAt),
                toleranceNs: max(0, tolerance.saturatedNanoseconds)
            )
        )
        self.storedHandler = handler
    }

    // A label lives in a table beside the timers (see `label`): forgotten with its timer.
    deinit {
        if TimerLabels.count.load(ordering: .relaxed) > 0 { TimerLabels.forget(ObjectIdentifier(self)) }
    }

    /// The timer's own initializer for a fire date already known to be now or later.
    init(fireNs: Int64, intervalNs: Int64, toleranceNs: Int64, handler: @escaping @Sendable (RunLoopTimer) -> Void) {
        self.intervalNs = max(0, intervalNs)
        self.order = 0
        self.state = Mutex(TimerState(fireNs: fireNs, toleranceNs: max(0, toleranceNs)))
        self.storedHandler = handler
    }

    /// Creates a timer that first fires `after` from now and then, if `repeating` is given,
    /// every `repeating`.
    public convenience init(
        after delay: Duration,
        repeating: Duration? = nil,
        tolerance: Duration = .zero,
        handler: @escaping @Sendable (RunLoopTimer) -> Void
    ) {
        self.init(
            fireNs: LoopClock.deadline(after: delay, from: LoopClock.now()),
            intervalNs: (repeating ?? .zero).saturatedNanoseconds,
            toleranceNs: tolerance.saturatedNanoseconds, handler: handler)
    }

    /// The next fire date. Setting it reschedules the timer, from any thread, and wakes the loop
    /// when the timer becomes its earliest; a date in the past counts as now. Set inside the
    /// handler to a date later than the one firing, it replaces the next point of the schedule.
    ///
    /// After the timer is invalidated (or a one-shot timer fired) it keeps its last fire date
    /// (CoreFoundation answers its reference date, 2001-01-01).
    public var fireDate: ContinuousClock.Instant {
        get { LoopClock.instant(state.locked { $0.reportedNs }) }
        set {
            let requested = LoopClock.nanoseconds(newValue)
            reschedule(fire: (LoopClock.notBeforeNow(requested), requested), toleranceNs: nil)
        }
    }

    /// How late the timer may fire; negative values count as zero.
    public var tolerance: Duration {
        get { .nanoseconds(state.locked { $0.toleranceNs }) }
        set { reschedule(fire: nil, toleranceNs: max(0, newValue.saturatedNanoseconds)) }
    }

    /// Whether the timer is still usable; false after ``invalidate()`` or after a one-shot timer
    /// fired.
    public var isValid: Bool { state.locked { $0.valid } }

    /// Removes the timer from its loop and stops it for good, letting go of its handler (and what
    /// the handler captured) at once. Safe from any thread and from inside any callback, its own
    /// included.
    public func invalidate() {
        let (loop, handler) = state.locked { timer -> (RunLoop?, HeldHandler) in
            guard timer.valid else { return (nil, HeldHandler(nil)) }
            timer.valid = false
            let firing = bumpGeneration()
            // A firing timer's handler is let go by the firing thread when it returns.
            return (timer.loop?.loop, firing ? HeldHandler(nil) : takeHandler())
        }
        loop?.detach(self)
        // Released here, with no lock held: what it captured may run any code in its deinit.
        withExtendedLifetime(handler) {}
    }

    /// The handler's type.
    typealias Handler = @Sendable (RunLoopTimer) -> Void

    /// The handler, while the timer is valid.
    var handler: Handler? { state.locked { HeldHandler($0.valid ? storedHandler : nil) }.value }

    private func reschedule(fire: (ns: Int64, reported: Int64)?, toleranceNs: Int64?) {
        while true {
            // An unscheduled timer is updated under its own lock; a scheduled one under its loop's,
            // which also moves its heap entries. Retry if it was scheduled in between.
            let loop: RunLoop? = state.locked { timer in
                if let loop = timer.loop { return loop.loop }
                if let fire { timer.setFire(fire.ns, reported: fire.reported) }
                if let toleranceNs { timer.toleranceNs = toleranceNs }
                return nil
            }
            guard let loop else { return }
            if loop.reschedule(self, fire: fire, toleranceNs: toleranceNs) { return }
        }
    }

    /// A short identity with the next fire date and interval.
    public var description: String {
        let (fireNs, valid) = state.locked { ($0.fireNs, $0.valid) }
        let inNs = fireNs.subtractingSaturated(LoopClock.now())
        return
            "<RunLoopTimer \(objectAddress(self)) fires in \(formatNanoseconds(inNs)) interval \(interval) valid: \(valid)>"
    }

    /// Timers are equal only to themselves.
    public static func == (lhs: RunLoopTimer, rhs: RunLoopTimer) -> Bool { lhs === rhs }

    /// Hashes the timer's identity.
    public func hash(into hasher: inout Hasher) { hasher.combine(ObjectIdentifier(self)) }
}

/// A timer's handler on its way out of a locked section. A struct around the closure because a
/// closure returned as a generic result (`Mutex.withLock`'s) is re-abstracted through a thunk
/// allocated on the heap: measured as a tenth of a fired timer's cost. A struct is passed as it is.
struct HeldHandler: Sendable {
    let value: RunLoopTimer.Handler?
    init(_ value: RunLoopTimer.Handler?) { self.value = value }
}

/// A timer's mutable state, under the timer's lock. When the timer is scheduled, changes are also
/// made under its loop's lock (taken first), so the loop's heaps and this state agree.
struct TimerState: Sendable {
    /// When the timer fires: the date it was given, not before the moment it was given (a past
    /// date counts as then: CoreFoundation's `_fireTSR`), or the next point of its schedule.
    private(set) var fireNs: Int64
    /// What ``RunLoopTimer/fireDate`` reports: the date given, a past one included
    /// (CoreFoundation's `_nextFireDate`), until the timer fires or is given another date.
    private(set) var reportedNs: Int64
    var toleranceNs: Int64
    var loop: LoopRef?
    /// Indexes (into the loop's mode table) of the modes the timer is in.
    var modes = ModeIndexSet()
    /// The insertion number (bits 0-61) and the two flags (62: valid, 63: added for `.common`),
    /// in one word: the object stays inside glibc's fast bins (see `stamp`).
    private var packed: UInt64 = TimerState.validBit

    private static let validBit: UInt64 = 1 << 62
    private static let commonBit: UInt64 = 1 << 63
    private static let sequenceMask: UInt64 = (1 << 62) - 1

    /// A timer that fires at `fireNs` (already clamped) and reports `reportedNs` (the date given).
    init(fireNs: Int64, reportedNs: Int64? = nil, toleranceNs: Int64) {
        self.fireNs = fireNs
        self.reportedNs = reportedNs ?? fireNs
        self.toleranceNs = toleranceNs
    }

    /// Sets when the timer fires, and what it reports (`fireNs` itself unless given).
    mutating func setFire(_ fireNs: Int64, reported: Int64? = nil) {
        self.fireNs = fireNs
        self.reportedNs = reported ?? fireNs
    }

    /// Insertion number in its loop: equal fire dates fire in this order.
    var sequence: UInt64 {
        get { packed & Self.sequenceMask }
        set { packed = (packed & ~Self.sequenceMask) | (newValue & Self.sequenceMask) }
    }

    /// Whether the timer is still usable.
    var valid: Bool {
        get { packed & Self.validBit != 0 }
        set { packed = newValue ? packed | Self.validBit : packed & ~Self.validBit }
    }

    /// Whether it was added for ``RunLoop/Mode/common`` (and so joins modes made common later).
    var inCommonModes: Bool {
        get { packed & Self.commonBit != 0 }
        set { packed = newValue ? packed | Self.commonBit : packed & ~Self.commonBit }
    }
}

/// `1.5ms`, `-20µs`, `3.000s`: a nanosecond count for people.
func formatNanoseconds(_ ns: Int64) -> String {
    let magnitude = ns.magnitude
    if magnitude >= 1_000_000_000 * 1_000_000 { return ns > 0 ? "never" : "long ago" }
    if magnitude >= 1_000_000_000 { return String(format3(Double(ns) / 1e9)) + "s" }
    if magnitude >= 1_000_000 { return String(format3(Double(ns) / 1e6)) + "ms" }
    if magnitude >= 1_000 { return String(format3(Double(ns) / 1e3)) + "µs" }
    return "\(ns)ns"
}

/// A number with three decimals, without Foundation.
func format3(_ value: Double) -> String {
    let scaled = (value * 1000).rounded()
    let sign = scaled < 0 ? "-" : ""
    let whole = Int(abs(scaled)) / 1000
    let fraction = Int(abs(scaled)) % 1000
    let padded = String(fraction)
    return "\(sign)\(whole)." + String(repeating: "0", count: 3 - padded.count) + padded
}
