import Synchronization

/// A version-0 input source (CoreFoundation's "Source0"): work that another thread or a callback
/// marks ready with ``signal()`` and the loop performs on its own thread.
///
/// Signalling does not wake a sleeping loop, as in CoreFoundation: call ``RunLoop/wakeUp()``
/// after ``signal()`` when the loop may be asleep. As in CoreFoundation, a pass first collects the
/// signalled sources, then performs them in ascending ``order`` (the earliest signalled first
/// among equal orders), clearing each signal before its callback runs: a source may re-signal
/// itself, and a source signalled by a callback of the pass runs in the next pass.
///
/// A source can be added to any number of loops and modes. ``invalidate()`` removes it from all of
/// them, calling `onCancel` once for each mode it leaves.
public final class RunLoopSource: Sendable, Hashable, CustomStringConvertible {
    /// The order among the sources of a mode: lower orders run first.
    public let order: Int

    let performCallout: @Sendable () -> Void
    let scheduleCallout: (@Sendable (RunLoop, RunLoop.Mode) -> Void)?
    let cancelCallout: (@Sendable (RunLoop, RunLoop.Mode) -> Void)?

    /// 0 when not signalled; otherwise when it was signalled, on ``SignalClock``'s count.
    let signalStamp = Atomic<UInt64>(0)
    let valid = Atomic<Bool>(true)
    /// Where the source was added, in the modes it was added for (``RunLoop/Mode/common``
    /// included), so that ``invalidate()`` can remove it everywhere.
    let registrations = Mutex<[ItemRegistration]>([])
    /// Its name in traces (see `label`).
    let itemLabel = ItemLabel()

    /// Creates a source.
    ///
    /// - Parameters:
    ///   - order: Lower orders run first when several sources are signalled in the same pass.
    ///   - onSchedule: Called on the adding thread each time the source joins a mode of a loop.
    ///   - onCancel: Called each time the source leaves a mode of a loop (removal, invalidation,
    ///     or the loop's thread exiting).
    ///   - perform: The work, called on the loop's thread when the source is signalled.
    public init(
        order: Int = 0,
        onSchedule: (@Sendable (RunLoop, RunLoop.Mode) -> Void)? = nil,
        onCancel: (@Sendable (RunLoop, RunLoop.Mode) -> Void)? = nil,
        perform: @escaping @Sendable () -> Void
    ) {
        self.order = order
        self.scheduleCallout = onSchedule
        self.cancelCallout = onCancel
        self.performCallout = perform
    }

    /// Marks the source ready to perform. Safe from any thread; does not wake the loop.
    ///
    /// - Complexity: O(1), one atomic store.
    @inline(__always)
    public func signal() {
        // The first signal's time counts, as in CoreFoundation. A load and a store, not a
        // compare-and-swap: of two threads signalling at the same moment either may win, and
        // either time is right.
        guard valid.load(ordering: .relaxed), signalStamp.load(ordering: .relaxed) == 0 else { return }
        signalStamp.store(SignalClock.tick(), ordering: .releasing)
    }

    /// Whether the source is signalled and waiting to perform.
    public var isSignalled: Bool { signalStamp.load(ordering: .acquiring) != 0 }

    /// Whether the source is still usable; false after ``invalidate()``.
    public var isValid: Bool { valid.load(ordering: .acquiring) }

    /// Removes the source from every loop and mode it is in and stops it for good. Safe from any
    /// thread and from inside any callback, its own included; later calls do nothing.
    public func invalidate() {
        guard valid.exchange(false, ordering: .acquiringAndReleasing) else { return }
        signalStamp.store(0, ordering: .relaxed)
        // The loops are retained while the registration lock is held (see LoopRef).
        let places = registrations.locked { list in
            defer { list.removeAll() }
            return list.map { ($0.loop.loop, $0.mode) }
        }
        for (loop, mode) in places { loop.remove(self, forMode: mode) }
    }

    /// A short identity, as in `<RunLoopSource 0x... order 0 signalled: false>`.
    public var description: String {
        "<RunLoopSource \(objectAddress(self)) order \(order) valid: \(isValid) signalled: \(isSignalled)>"
    }

    /// Sources are equal only to themselves.
    public static func == (lhs: RunLoopSource, rhs: RunLoopSource) -> Bool { lhs === rhs }

    /// Hashes the source's identity.
    public func hash(into hasher: inout Hasher) { hasher.combine(ObjectIdentifier(self)) }
}

/// The order in which version-0 sources were signalled, process-wide: CoreFoundation performs
/// signalled sources of equal order by signal time. A counter rather than a clock: cheaper to
/// read, and never equal for two signals.
enum SignalClock {
    private static let count = Atomic<UInt64>(0)

    /// The next tick (never 0).
    @inline(__always)
    static func tick() -> UInt64 { count.add(1, ordering: .relaxed).newValue }
}

/// A place an item was added: a loop (unretained: the loop owns its items, not the reverse; see
/// ``LoopRef``) and the mode it was added for.
struct ItemRegistration: Sendable {
    let loop: LoopRef
    let mode: RunLoop.Mode
}

/// `0x…`: an object's address, for descriptions.
func objectAddress(_ object: AnyObject) -> String {
    "0x" + String(UInt(bitPattern: ObjectIdentifier(object)), radix: 16)
}
