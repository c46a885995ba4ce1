import Synchronization

/// Watches a loop's activities: entry, before timers, before sources, before waiting, after
/// waiting, exit (CoreFoundation's CFRunLoopObserver).
///
/// Observers of a mode are called in ascending ``order`` (insertion order among equals). An
/// observer is never re-entered: if its handler runs the loop again, nested activities skip it. A
/// non-repeating observer is invalidated right after its first call. An observer belongs to at
/// most one loop (any number of its modes).
public final class RunLoopObserver: Sendable, Hashable, CustomStringConvertible {
    /// The activities the observer is called for.
    public let activities: RunLoop.Activity
    /// Whether the observer stays after its first call.
    public let repeats: Bool
    /// The order among a mode's observers: lower orders are called first.
    public let order: Int

    let handler: @Sendable (RunLoopObserver, RunLoop.Activity) -> Void
    let valid = Atomic<Bool>(true)
    let firing = Atomic<Bool>(false)
    let registrations = Mutex<[ItemRegistration]>([])
    /// Its name in traces (see `label`).
    let itemLabel = ItemLabel()

    /// Creates an observer.
    ///
    /// - Parameters:
    ///   - activities: The activities to be called for.
    ///   - repeats: `false` to be invalidated after the first call.
    ///   - order: Lower orders are called first.
    ///   - handler: Called on the loop's thread with the observer and the activity.
    public init(
        activities: RunLoop.Activity,
        repeats: Bool = true,
        order: Int = 0,
        handler: @escaping @Sendable (RunLoopObserver, RunLoop.Activity) -> Void
    ) {
        self.activities = activities
        self.repeats = repeats
        self.order = order
        self.handler = handler
    }

    /// Whether the observer is still usable; false after ``invalidate()``.
    public var isValid: Bool { valid.load(ordering: .acquiring) }

    /// Removes the observer from its loop and stops it for good. Safe from any thread and from
    /// inside any callback, its own included.
    public func invalidate() {
        guard valid.exchange(false, ordering: .acquiringAndReleasing) else { return }
        // The loops are retained while the registration lock is held (see LoopRef).
        let places = registrations.locked { list in
            defer { list.removeAll() }
            return list.map { ($0.loop.loop, $0.mode) }
        }
        for (loop, mode) in places { loop.remove(self, forMode: mode) }
    }

    /// A short identity with the activities and order.
    public var description: String {
        "<RunLoopObserver \(objectAddress(self)) activities \(activities) order \(order) repeats: \(repeats) valid: \(isValid)>"
    }

    /// Observers are equal only to themselves.
    public static func == (lhs: RunLoopObserver, rhs: RunLoopObserver) -> Bool { lhs === rhs }

    /// Hashes the observer's identity.
    public func hash(into hasher: inout Hasher) { hasher.combine(ObjectIdentifier(self)) }
}
