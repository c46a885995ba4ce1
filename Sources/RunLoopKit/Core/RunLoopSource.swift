import Synchronization

/// A version-0 input source (CoreFoundation's "Source0"): work that another thread or a callback
/// marks ready with ``signal()`` and the loop performs on its own thread.
///
/// Signalling does not wake a sleeping loop, as in CoreFoundation: call ``RunLoop/wakeUp()``
/// after ``signal()`` when the loop may be asleep. Signalled sources run once per pass in ascending
/// ``order`` (insertion order among equal orders), each pass clearing the signal before the
/// callback runs, so a source may re-signal itself.
///
/// A source can be added to any number of loops and modes. ``invalidate()`` removes it from all of
/// them, calling `onCancel` once for each mode it leaves.
public final class RunLoopSource: Sendable, Hashable, CustomStringConvertible {
    /// The order among the sources of a mode: lower orders run first.
    public let order: Int

    let performCallout: @Sendable () -> Void
    let scheduleCallout: (@Sendable (RunLoop, RunLoop.Mode) -> Void)?
    let cancelCallout: (@Sendable (RunLoop, RunLoop.Mode) -> Void)?

    let signalled = Atomic<Bool>(false)
    let valid = Atomic<Bool>(true)
    /// Where the source was added, in the modes it was added for (``RunLoop/Mode/common``
    /// included), so that ``invalidate()`` can remove it everywhere.
    let registrations = Mutex<[ItemRegistration]>([])

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
        if valid.load(ordering: .relaxed) { signalled.store(true, ordering: .releasing) }
    }

    /// Whether the source is signalled and waiting to perform.
    public var isSignalled: Bool { signalled.load(ordering: .acquiring) }

    /// Whether the source is still usable; false after ``invalidate()``.
    public var isValid: Bool { valid.load(ordering: .acquiring) }

    /// Removes the source from every loop and mode it is in and stops it for good. Safe from any
    /// thread and from inside any callback, its own included; later calls do nothing.
    public func invalidate() {
        guard valid.exchange(false, ordering: .acquiringAndReleasing) else { return }
        signalled.store(false, ordering: .relaxed)
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
