import Synchronization

// Callouts, published for a stall monitor: which item the loop is calling out to now.
//
// The loop publishes one word per change, `(label << 8 | kind) << 32 | sequence`: at each callout's
// start (its kind and its item's label id) and end (kind `none`: the loop's own work). One relaxed
// store each, no clock read; a monitor that sees the same word for longer than its threshold has
// found one callout (or one stretch of the loop's own work) that is stuck. Labels are interned
// once, when an item is labelled, so the loop only copies a number.

extension RunLoop {
    /// What kind of item the loop is calling out to (see ``CalloutSnapshot``).
    public enum CalloutKind: UInt8, Sendable, Hashable, CustomStringConvertible {
        /// No callout: the loop's own work between callouts (or no run in progress).
        case none = 0
        /// A ``RunLoopObserver``.
        case observer
        /// A block queued with `perform` (or a task queued on a loop thread).
        case block
        /// A version-0 source (``RunLoopSource``).
        case source
        /// A ``RunLoopTimer``.
        case timer
        /// A ``FileDescriptorSource`` (the main queue's drain is one, labelled `main queue`).
        case descriptor
        /// One message of a ``MessagePort``.
        case port

        /// The kind in words: `block`, `timer`, `message port`, …
        public var description: String {
            switch self {
            case .none: "the loop's own work"
            case .observer: "observer"
            case .block: "block"
            case .source: "source"
            case .timer: "timer"
            case .descriptor: "descriptor source"
            case .port: "message port"
            }
        }
    }

    /// The callout in progress, read from any thread without a lock (see ``calloutSnapshot``).
    public struct CalloutSnapshot: Sendable, Hashable, CustomStringConvertible {
        /// Changes at every callout's start and end (it wraps after 2³² changes): a value that
        /// stays the same means the loop is still in the same callout, or the same stretch of its
        /// own work.
        public let sequence: UInt32
        /// What kind of item is being called out to; ``CalloutKind/none`` between callouts.
        public let kind: CalloutKind
        /// The item's label (``RunLoopTimer/label`` and the like), nil when it has none.
        public let label: String?
        /// The label's interned id (0: none), what callout describers are registered under.
        let labelID: UInt32

        /// The item in words: its label, else its kind (`timer`, `block`, …).
        public var description: String { label ?? kind.description }
    }

    /// The callout the loop is in now (or its own work between callouts). Any thread; one relaxed
    /// load, plus a table look-up for a labelled item.
    public var calloutSnapshot: CalloutSnapshot {
        let word = instrumentation.calloutWord.load(ordering: .relaxed)
        let labelID = UInt32(truncatingIfNeeded: word >> 40)
        return CalloutSnapshot(
            sequence: UInt32(truncatingIfNeeded: word),
            kind: CalloutKind(rawValue: UInt8(truncatingIfNeeded: word >> 32)) ?? .none,
            label: labelID == 0 ? nil : CalloutLabels.name(labelID), labelID: labelID)
    }

    /// Registers `describe`, which says more about a callout of an item labelled `label` than
    /// the label does, when someone asks (``calloutDetail(of:)``): the stall monitor asks while
    /// the loop is busy in such a callout, to name a stall's item. Until the token is cancelled.
    ///
    /// For an item whose one callout runs many things of a foreign loop's (RunLoopGLib's dispatch
    /// runs GLib's ready sources: its describer names the GLib source being dispatched). The loop
    /// never calls `describe` and does nothing more per callout: the cost is on the asking side
    /// (one relaxed load while no describer is registered on the loop).
    ///
    /// `describe` runs on the asking thread while the loop's thread goes on: it must not block or
    /// wait for the loop's thread, and it reads what the callout publishes without a lock (nil
    /// when it has nothing to say). Any thread.
    public func describeCallouts(labelled label: String, _ describe: @escaping @Sendable () -> String?) -> InstrumentationToken {
        let id = instrumentation.addDescriber(label: CalloutLabels.id(for: label), describe)
        let instrumentation = self.instrumentation
        return InstrumentationToken { instrumentation.removeDescriber(id) }
    }

    /// What the describer registered for the label of `snapshot`'s callout says about it
    /// (``describeCallouts(labelled:_:)``), while the loop is still in that callout; nil when no
    /// describer is registered for the label, it has nothing to say, or the loop has left the
    /// callout (the describer may have looked at the next one). Any thread; one relaxed load when
    /// the loop has no describer.
    public func calloutDetail(of snapshot: CalloutSnapshot) -> String? {
        guard snapshot.labelID != 0, instrumentation.describerCount.load(ordering: .relaxed) > 0,
            let describe = instrumentation.describer(for: snapshot.labelID)
        else { return nil }
        let detail = describe()
        // Still the same callout after the describer looked: it described this one.
        let sequence = UInt32(truncatingIfNeeded: instrumentation.calloutWord.load(ordering: .acquiring))
        return sequence == snapshot.sequence ? detail : nil
    }

    /// Publishes a callout's start. Loop thread only. The sequence is the word's own low half
    /// (only this thread writes it): a 32-bit increment of what was stored, and the item above it.
    @inline(__always)
    func calloutBegins(_ kind: CalloutKind, label: UInt32) {
        let instrumentation = self.instrumentation
        let sequence = UInt32(truncatingIfNeeded: instrumentation.calloutWord.load(ordering: .relaxed)) &+ 1
        instrumentation.calloutWord.store(
            UInt64(label << 8 | UInt32(kind.rawValue)) << 32 | UInt64(sequence), ordering: .relaxed)
    }

    /// ``calloutBegins(_:label:)`` for a port's message, callable from code specialized outside
    /// the module (``MessagePort``'s delivery).
    @usableFromInline
    func portCalloutBegins(label: UInt32) { calloutBegins(.port, label: label) }

    /// ``calloutEnds()``, callable from code specialized outside the module.
    @usableFromInline
    func portCalloutEnds() { calloutEnds() }

    /// Publishes a callout's end: the loop's own work from here. Loop thread only.
    @inline(__always)
    func calloutEnds() {
        let instrumentation = self.instrumentation
        let sequence = UInt32(truncatingIfNeeded: instrumentation.calloutWord.load(ordering: .relaxed)) &+ 1
        instrumentation.calloutWord.store(UInt64(sequence), ordering: .relaxed)
    }
}

/// Item labels as small numbers, so that a loop publishes its callout's label with one store.
/// Interned when an item is labelled; never removed (a label's text is kept once however many
/// items carry it), at most ``limit`` distinct texts (later ones are published as
/// ``overflowName``).
enum CalloutLabels {
    static let limit = 65_536
    static let overflowName = "(label table full)"
    private static let table = Mutex<(names: [String], ids: [String: UInt32])>(([overflowName], [overflowName: 1]))

    /// The id of `label` (0 for nil).
    static func id(for label: String?) -> UInt32 {
        guard let label else { return 0 }
        return table.locked { table in
            if let id = table.ids[label] { return id }
            guard table.names.count < limit else { return 1 }
            table.names.append(label)
            // Ids start at 1 (the overflow name); 0 means no label.
            let id = UInt32(table.names.count)
            table.ids[label] = id
            return id
        }
    }

    /// The label of `id` (nil for 0 or an unknown id).
    static func name(_ id: UInt32) -> String? {
        table.locked { table in id >= 1 && Int(id) <= table.names.count ? table.names[Int(id) - 1] : nil }
    }
}
