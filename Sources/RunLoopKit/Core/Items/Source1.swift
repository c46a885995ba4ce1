import Synchronization

/// Where a version-1 source (``FileDescriptorSource``, ``MessagePort``) is scheduled, under the
/// item's registration lock (taken after the loop's lock when both are held).
struct Source1Registration: Sendable {
    var valid = true
    /// The one loop the item belongs to while it is in any of that loop's modes.
    var loop: LoopRef?
    /// Indexes (into the loop's mode table) of the modes the item is in.
    var modes = ModeIndexSet()
    /// Whether it was added for ``RunLoop/Mode/common`` (and so joins modes made common later).
    var inCommonModes = false
}

/// The loop's view of a version-1 source: CoreFoundation's port-based source, here an item that
/// the kernel (a descriptor becoming ready) or another thread (a message sent) makes ready, and
/// that wakes the loop. Handled after the sleep, in ascending order.
protocol Source1Item: TraceNamed, Sendable {
    /// Position among the mode's version-1 sources (ascending, stable for equal orders).
    var order: Int { get }
    /// Unique for the process's life: tags the item's kernel events.
    var id: UInt64 { get }
    /// Runs `body` with the registration, under its lock.
    func withRegistration<R>(_ body: (inout Source1Registration) -> R) -> R
    /// Whether it has something to deliver that did not come from its own epoll events (queued
    /// messages; a descriptor found closed). Any thread.
    var needsAttention: Bool { get }
    /// Delivers what is ready, on the loop's thread: `events` are what the last wait reported for
    /// its descriptor (empty if none). With `onlyOne`, delivers at most one callout. Returns
    /// whether a callout ran.
    func perform(events: FileDescriptorSource.Events, onlyOne: Bool, on loop: RunLoop) -> Bool
    /// What its callouts are published as (see Callouts.swift).
    var calloutKind: RunLoop.CalloutKind { get }
    /// Its label's ``CalloutLabels`` id (0: none).
    var calloutLabel: UInt32 { get }
    /// The descriptor source behind it, if it is one.
    var descriptorSource: FileDescriptorSource? { get }
    /// Stops it for good, as its public `invalidate()` does: when its loop's thread exits, or when
    /// it is added to a loop whose thread has exited (it could never deliver).
    func invalidateItem()
}

/// Ids for version-1 sources (and tags for their registrations), never reused; above the
/// backend's own tags.
enum Source1IDs {
    private static let next = Atomic<UInt64>(EpollBackend.firstCallerTag)
    static func make() -> UInt64 { next.add(1, ordering: .relaxed).newValue }
}
