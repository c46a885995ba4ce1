import CRunLoopKit
import Glibc
import SystemPackage

/// Version-1 sources: adding, removing and the bookkeeping behind ``FileDescriptorSource`` and
/// ``MessagePort``. Which descriptors a mode watches is decided here; the kernel calls are
/// `EpollBackend`'s. The phase that handles them is `doSources1` in Loop/RunLoop+Run.swift.
extension RunLoop {
    // MARK: Descriptor sources

    /// Adds a descriptor source to `mode` (``Mode/common``: every common mode); the loop starts
    /// watching its descriptor. A source belongs to one loop: adding it to a second loop, or
    /// adding an invalidated source, does nothing.
    ///
    /// - Complexity: O(n) in the mode's version-1 sources, plus one `epoll_ctl` per mode joined.
    public func add(_ source: FileDescriptorSource, forMode mode: Mode) { addSource1(source, forMode: mode) }

    /// Removes a descriptor source from `mode` (``Mode/common``: from every common mode and from
    /// the common items). The source stays valid and can be added again.
    public func remove(_ source: FileDescriptorSource, forMode mode: Mode) { removeSource1(source, forMode: mode) }

    /// Whether `source` is in `mode` (for ``Mode/common``: whether it was added for the common
    /// modes).
    public func contains(_ source: FileDescriptorSource, inMode mode: Mode) -> Bool {
        containsSource1(source, inMode: mode)
    }

    // MARK: Message ports

    /// Adds a message port to `mode` (``Mode/common``: every common mode); messages already sent to
    /// it are delivered from the loop's next pass in that mode. A port belongs to one loop:
    /// adding it to a second loop, or adding an invalidated port, does nothing.
    ///
    /// - Complexity: O(n) in the mode's version-1 sources.
    public func add<Message>(_ port: MessagePort<Message>, forMode mode: Mode) { addSource1(port, forMode: mode) }

    /// Removes a message port from `mode`; its messages wait until it runs in a mode again.
    public func remove<Message>(_ port: MessagePort<Message>, forMode mode: Mode) {
        removeSource1(port, forMode: mode)
    }

    /// Whether `port` is in `mode` (for ``Mode/common``: whether it was added for the common
    /// modes).
    public func contains<Message>(_ port: MessagePort<Message>, inMode mode: Mode) -> Bool {
        containsSource1(port, inMode: mode)
    }

    // MARK: Shared

    func addSource1(_ item: any Source1Item, forMode mode: Mode) {
        var foreign = false
        let accepted = mutatingItems { state -> Bool in
            guard !state.tornDown else { return false }
            item.withRegistration { registration in
                guard registration.valid else { return }
                if let owner = registration.loop, owner !== self {
                    foreign = true
                    return
                }
                registration.loop = LoopRef(self)
                if mode == .common && !registration.inCommonModes {
                    registration.inCommonModes = true
                    state.commonSources1.append(item)
                }
                for index in state.indexes(for: mode) { join(item, &registration, index, &state) }
                if registration.modes.isEmpty && !registration.inCommonModes { registration.loop = nil }
            }
            return true
        }
        guard accepted else {
            // It could never be served: a port would take messages it cannot deliver.
            warnAddedAfterExit(item)
            item.invalidateItem()
            return
        }
        if foreign {
            Diagnostics.warning("\(item) already belongs to another run loop; not added to \(shortDescription)")
        }
        // Messages sent before the port was added, or a descriptor found closed while joining.
        if item.needsAttention { source1NeedsAttention() }
    }

    /// Puts `item` in the mode at `index`. Under the loop's lock and the item's registration lock.
    func join(
        _ item: any Source1Item, _ registration: inout Source1Registration, _ index: Int, _ state: inout LoopState
    ) {
        guard registration.modes.insert(index) else { return }
        state.modes[index].sources1.insert(item, at: Self.slot(of: item, in: state.modes[index].sources1))
        guard let source = item.descriptorSource else { return }
        // The number may have been closed and reused since the source was made: then it names
        // someone else's descriptor, which this source must never watch.
        guard source.stillNamesItsDescriptor() else {
            source.markClosed(reused: true)
            state.attentionAfterChange = true
            return
        }
        let number = source.descriptor
        var owners = state.descriptorOwners[number] ?? []
        // Earlier sources on this number whose descriptor was another file: it was closed and the
        // number reused. Sources on the same file share it (a read and a write source).
        let reused = owners.filter { $0 !== source && !$0.identity.isSameFile(as: source.identity) }
        if !reused.isEmpty {
            for earlier in reused { forget(earlier, number: number, &state) }
            owners.removeAll { earlier in reused.contains { $0 === earlier } }
            state.attentionAfterChange = true
        }
        if !owners.contains(where: { $0 === source }) { owners.append(source) }
        state.descriptorOwners[number] = owners
        if var watch = state.modes[index].descriptors[number] {
            watch.sources.append(source)
            state.modes[index].descriptors[number] = watch
            applyInterest(number, index, &state)
            return
        }
        let tag = Source1IDs.make()
        state.modes[index].descriptors[number] = WatchedDescriptor(tag: tag, sources: [source], interest: [])
        state.modes[index].descriptorNumbers[tag] = number
        let hadSet = state.modes[index].interestSet != nil
        if !hadSet && state.runningModes.contains(index) {
            // The loop sleeps in its base set (or cannot make this one): woken, it sleeps in the
            // mode's new set, or retries making it.
            state.attentionAfterChange = true
        }
        guard let set = interestSet(index, &state) else { return }
        // A new set registered every descriptor of the mode, this one included.
        if hadSet { register(number, index, in: set, &state) }
    }

    /// Where `item` is or goes in a mode's version-1 sources, kept sorted by (order, id): the order
    /// they are handled in. A binary search, so that adding or removing one of n sources does not
    /// walk the others (invalidating 10,000 sources one by one stays linear in all).
    ///
    /// - Complexity: O(log n).
    static func slot(of item: any Source1Item, in list: ContiguousArray<any Source1Item>) -> Int {
        let key = (item.order, item.id)
        var low = 0
        var high = list.count
        while low < high {
            let middle = (low + high) / 2
            if (list[middle].order, list[middle].id) < key { low = middle + 1 } else { high = middle }
        }
        return low
    }

    /// Takes a source whose number was reused out of every mode's registrations and tells it
    /// `.closed`. Its registrations cannot be deleted by number (the number names another file
    /// now); if its old file is still open elsewhere they live on, so the sets are rebuilt.
    private func forget(_ source: FileDescriptorSource, number: Int32, _ state: inout LoopState) {
        source.markClosed(reused: true)
        for index in state.modes.indices {
            guard var watch = state.modes[index].descriptors[number] else { continue }
            watch.sources.removeAll { $0 === source }
            if watch.sources.isEmpty {
                state.modes[index].descriptors[number] = nil
                state.modes[index].descriptorNumbers[watch.tag] = nil
            } else {
                state.modes[index].descriptors[number] = watch
            }
            state.modes[index].interestSetStale = true
        }
    }

    /// Registers descriptor `number` of the mode at `index` in `set`, for what its sources watch.
    /// Under the loop's lock.
    private func register(_ number: Int32, _ index: Int, in set: EpollBackend.InterestSet, _ state: inout LoopState) {
        guard var watch = state.modes[index].descriptors[number], let backend else { return }
        // Checked again: the set may be made (or made anew) long after the sources joined.
        guard watch.sources.first?.stillNamesItsDescriptor() ?? false else {
            for source in watch.sources { source.markClosed(reused: true) }
            state.attentionAfterChange = true
            return
        }
        watch.interest = watch.wantedInterest
        state.modes[index].descriptors[number] = watch
        let outcome = backend.watch(number, for: watch.interest, tag: watch.tag, in: set)
        descriptorNotWatched(outcome, number, watch, &state)
    }

    /// Updates the registration of descriptor `number` in the mode at `index` to what its sources
    /// watch now. Under the loop's lock.
    private func applyInterest(_ number: Int32, _ index: Int, _ state: inout LoopState) {
        guard var watch = state.modes[index].descriptors[number] else { return }
        let wanted = watch.wantedInterest
        guard wanted != watch.interest else { return }
        watch.interest = wanted
        state.modes[index].descriptors[number] = watch
        guard let set = state.modes[index].interestSet, let backend else { return }
        let outcome = backend.changeInterest(number, to: wanted, tag: watch.tag, in: set)
        if outcome != .watching { state.modes[index].interestSetStale = true }
        descriptorNotWatched(outcome, number, watch, &state)
    }

    /// Tells the sources of a descriptor the backend could not watch: `.closed` for a descriptor
    /// closed behind their backs; for a refusal (the kernel's memory or `max_user_watches`), an
    /// error in the log as well. Under the loop's lock.
    private func descriptorNotWatched(
        _ outcome: EpollBackend.WatchOutcome, _ number: Int32, _ watch: WatchedDescriptor, _ state: inout LoopState
    ) {
        switch outcome {
        case .watching:
            return
        case .closed:
            break
        case .failed(let error):
            state.deferredErrors.append(
                "\(shortDescription) cannot watch descriptor \(number): epoll_ctl failed with \(error); its sources are told .closed and invalidated"
            )
        }
        for source in watch.sources { source.markClosed(reused: false) }
        state.attentionAfterChange = true
    }

    /// Makes the mode's interest set anew from its live registrations: the way to get rid of a
    /// registration that cannot be deleted (`EPOLL_CTL_DEL` names it by number, and the number was
    /// closed while a `dup`, a child process or an `SCM_RIGHTS` message keeps its file open, so
    /// the kernel keeps reporting it). Loop thread, under the loop's lock.
    func remakeInterestSet(_ index: Int, _ state: inout LoopState) {
        state.modes[index].interestSetStale = false
        guard let old = state.modes[index].interestSet, let backend else { return }
        state.modes[index].interestSet = nil
        backend.closeSet(old)
        _ = interestSet(index, &state)
    }

    /// The interest set of the mode at `index`, made on first use with every descriptor source the
    /// mode has (some may have joined while it could not be made). Under the loop's lock.
    func interestSet(_ index: Int, _ state: inout LoopState) -> EpollBackend.InterestSet? {
        if let set = state.modes[index].interestSet { return set }
        guard let backend else { return nil }
        do throws(Errno) {
            let set = try backend.makeSet()
            state.modes[index].interestSet = set
            state.modes[index].interestSetFailed = false
            for number in Array(state.modes[index].descriptors.keys) { register(number, index, in: set, &state) }
            return set
        } catch {
            if !state.modes[index].interestSetFailed {
                state.modes[index].interestSetFailed = true
                state.deferredErrors.append(
                    "could not make an epoll set for mode \(state.modes[index].name) of \(shortDescription): \(error); its descriptor sources are watched once it can be made (retried while the loop runs in the mode)"
                )
            }
            return nil
        }
    }

    /// Takes `item` out of the mode at `index`. Under the loop's lock and the item's lock.
    private func leave(
        _ item: any Source1Item, _ registration: inout Source1Registration, _ index: Int, _ state: inout LoopState
    ) {
        guard registration.modes.remove(index) else { return }
        let slot = Self.slot(of: item, in: state.modes[index].sources1)
        if slot < state.modes[index].sources1.count, state.modes[index].sources1[slot] === item {
            state.modes[index].sources1.remove(at: slot)
        }
        guard let source = item.descriptorSource else { return }
        let number = source.descriptor
        guard var watch = state.modes[index].descriptors[number], watch.sources.contains(where: { $0 === source })
        else { return }
        watch.sources.removeAll { $0 === source }
        guard watch.sources.isEmpty else {
            state.modes[index].descriptors[number] = watch
            applyInterest(number, index, &state)
            return
        }
        state.modes[index].descriptors[number] = nil
        state.modes[index].descriptorNumbers[watch.tag] = nil
        guard let set = state.modes[index].interestSet, let backend, !source.numberReused.load(ordering: .relaxed)
        else { return }
        // Not deleted (the number was closed already): fine if the file is closed too. If it
        // lives on elsewhere, its events come with a tag the mode no longer knows, and the set is
        // made anew then (see doSources1).
        backend.unwatch(number, in: set)
    }

    func removeSource1(_ item: any Source1Item, forMode mode: Mode) {
        mutatingItems { state in
            item.withRegistration { registration in
                guard registration.loop === self else { return }
                if mode == .common {
                    guard registration.inCommonModes else { return }
                    registration.inCommonModes = false
                    state.commonSources1.removeAll { $0 === item }
                } else if state.modeIndex[mode] == nil {
                    return
                }
                for index in state.indexes(for: mode) { leave(item, &registration, index, &state) }
                if registration.modes.isEmpty && !registration.inCommonModes { untie(item, &registration, &state) }
            }
        }
    }

    func containsSource1(_ item: any Source1Item, inMode mode: Mode) -> Bool {
        state.locked { state in
            item.withRegistration { registration in
                guard registration.loop === self else { return false }
                if mode == .common { return registration.inCommonModes }
                guard let index = state.modeIndex[mode] else { return false }
                return registration.modes.contains(index)
            }
        }
    }

    /// Takes an invalidated item out of every mode. Any thread.
    func detachSource1(_ item: any Source1Item) {
        mutatingItems { state in
            item.withRegistration { registration in
                guard registration.loop === self else { return }
                var indexes: [Int] = []
                registration.modes.forEach { indexes.append($0) }
                for index in indexes { leave(item, &registration, index, &state) }
                if registration.inCommonModes {
                    registration.inCommonModes = false
                    state.commonSources1.removeAll { $0 === item }
                }
                untie(item, &registration, &state)
            }
        }
    }

    private func untie(_ item: any Source1Item, _ registration: inout Source1Registration, _ state: inout LoopState) {
        registration.loop = nil
        guard let source = item.descriptorSource, var owners = state.descriptorOwners[source.descriptor] else { return }
        owners.removeAll { $0 === source }
        state.descriptorOwners[source.descriptor] = owners.isEmpty ? nil : owners
    }

    /// Applies a descriptor source's watched events in each of its modes (the value current when
    /// the locks are held, so racing setters end with the last one's value). Any thread; takes
    /// the loop's lock, then the source's.
    func updateInterest(_ source: FileDescriptorSource) {
        mutatingItems { state in
            source.registration.locked { registration in
                guard registration.loop === self, !source.numberReused.load(ordering: .relaxed) else { return }
                registration.modes.forEach { index in applyInterest(source.descriptor, index, &state) }
            }
        }
    }

    /// A descriptor source found its number closed or reused while its mode's epoll set still
    /// reported it: the registration outlives the number, so every set holding the number is
    /// rebuilt before the loop sleeps again. Loop thread.
    func descriptorFoundClosed(_ source: FileDescriptorSource) {
        mutatingItems { state in
            for index in state.modes.indices where state.modes[index].descriptors[source.descriptor] != nil {
                state.modes[index].interestSetStale = true
            }
        }
    }

    /// Tells the loop a version-1 source has something to deliver, and wakes it. Any thread.
    func source1NeedsAttention() {
        // Sequentially consistent: see the wake protocol in Loop/WakeProtocol.swift (with a releasing store a
        // sender can be left with the loop asleep: MessagePortTests.aSenderIsNeverLeftWithTheLoopAsleep).
        wake.source1Attention.store(true, ordering: .sequentiallyConsistent)
        requestWakeUp()
    }
}
