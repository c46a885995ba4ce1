import Synchronization

// Labels: the names a loop's items carry for recorders (RunLoopMonitor's TraceRecorder) and in the
// loop's description. An item with no label is named by its kind and a stable identity, not by its
// `description`, which shows state that changes from one call to the next.

extension RunLoopSource: TraceNamed {
    /// A name for the source in traces and in its loop's description (e.g. `"touch dispatch"`);
    /// nil (the default) names it `RunLoopSource 0x… order N`. Any thread.
    public var label: String? {
        get { itemLabel.label }
        set { itemLabel.label = newValue }
    }

    var traceName: String { label ?? "RunLoopSource \(objectAddress(self)) order \(order)" }
}

extension RunLoopTimer: TraceNamed {
    /// A name for the timer in traces (e.g. `"frame timer"`); nil (the default) names it
    /// `RunLoopTimer 0x… interval …`. Any thread.
    ///
    /// Timers keep their labels in a table beside them, not in the object: a timer is allocated
    /// per schedule, and its size is kept within glibc's fast bins (ObjectSizeTests).
    public var label: String? {
        get { TimerLabels.table.locked { $0[ObjectIdentifier(self)] } }
        set {
            TimerLabels.table.locked { labels in
                labels[ObjectIdentifier(self)] = newValue
                TimerLabels.count.store(labels.count, ordering: .relaxed)
            }
            ItemLabels.changed()
        }
    }

    var traceName: String {
        label
            ?? (intervalNs == 0
                ? "RunLoopTimer \(objectAddress(self)) one-shot"
                : "RunLoopTimer \(objectAddress(self)) interval \(formatNanoseconds(intervalNs))")
    }
}

/// The labels of timers, by identity (see ``RunLoopTimer/label``). An entry is removed when its
/// timer is freed, so a later timer at the same address does not inherit it.
enum TimerLabels {
    static let table = Mutex<[ObjectIdentifier: String]>([:])
    /// Labelled timers: while none is, a timer's deinit does nothing here (one relaxed load).
    static let count = Atomic<Int>(0)

    /// The ``CalloutLabels`` id of `timer`'s label (0: none): no lock while no timer is labelled.
    @inline(__always)
    static func calloutLabel(of timer: RunLoopTimer) -> UInt32 {
        guard count.load(ordering: .relaxed) > 0 else { return 0 }
        guard let label = table.locked({ $0[ObjectIdentifier(timer)] }) else { return 0 }
        return CalloutLabels.id(for: label)
    }

    static func forget(_ id: ObjectIdentifier) {
        let removed = table.locked { labels -> Bool in
            guard labels.removeValue(forKey: id) != nil else { return false }
            count.store(labels.count, ordering: .relaxed)
            return true
        }
        // A later timer at the same address must not show this one's label from a loop's cache.
        if removed { ItemLabels.changed() }
    }
}

extension RunLoopObserver: TraceNamed {
    /// A name for the observer in traces and in its loop's description (e.g.
    /// `"_wrapRunLoopWithAutoreleasePoolHandler"`); nil (the default) names it
    /// `RunLoopObserver 0x… order N`. Any thread.
    public var label: String? {
        get { itemLabel.label }
        set { itemLabel.label = newValue }
    }

    var traceName: String { label ?? "RunLoopObserver \(objectAddress(self)) order \(order)" }
}

extension MessagePort: TraceNamed {
    /// A name for the port in traces and in its loop's description; nil (the default) names it
    /// `MessagePort<Message> 0x…`. Any thread.
    public var label: String? {
        get { itemLabel.label }
        set { itemLabel.label = newValue }
    }

    var traceName: String { label ?? "MessagePort<\(Message.self)> \(objectAddress(self))" }
}

extension FileDescriptorSource: TraceNamed {
    /// A name for the source in traces and in its loop's description; nil (the default) names it
    /// `FileDescriptorSource fd N`. Any thread.
    public var label: String? {
        get { itemLabel.label }
        set { itemLabel.label = newValue }
    }

    var traceName: String { label ?? "FileDescriptorSource fd \(descriptor)" }
}
