extension RunLoop {
    /// A dump of the loop in the manner of CoreFoundation's `CFRunLoop` description: the owning
    /// thread, whether it sleeps, the current mode, the common modes and common items, then each
    /// mode with its sources, its descriptor sources and ports (with their descriptors and watched
    /// events), timers (with their next fire date) and observers (with their activities and order),
    /// each item headed by its `label` when it has one.
    ///
    /// As CoreFoundation's shows its wake-up port, its flags and each mode's port set and
    /// deadlines, the header shows the loop's wake-up eventfd, its epoll and timer descriptors (and
    /// the timerfd's armed deadline), whether a stop is pending and whether wake-ups are ignored
    /// (from the end of a wait to the next pass); each mode shows the epoll set its runs sleep in
    /// and its next timer deadline, soft (the earliest fire date) and hard (the earliest latest
    /// fire date within tolerance).
    public var description: String {
        let now = LoopClock.now()
        // Timer lines are made under the lock: heap entries do not keep their timers alive
        // outside it.
        let timerLines: [[String]] = state.locked { state in
            state.modes.map { mode in
                mode.timers.entries.filter(\.isLive).sorted { TimerEntry.precedes($0, $1) }.map { entry in
                    "      \(labelPrefix(entry.timer.label))next fire in \(formatNanoseconds(entry.fireNs - now)), interval \(entry.timer.interval), tolerance \(formatNanoseconds(entry.latestNs - entry.fireNs))"
                }
            }
        }
        let deadlineLines: [String] = state.locked { state in
            state.modes.map { mode in
                let live = mode.timers.entries.filter(\.isLive)
                guard let soft = live.map(\.fireNs).min(), let hard = live.map(\.latestNs).min() else {
                    return "    next deadline = none,"
                }
                return "    next deadline = { soft in \(formatNanoseconds(soft - now)), hard in \(formatNanoseconds(hard - now)) },"
            }
        }
        let snapshot = state.locked { state in
            (
                state.modes, state.commonModes, state.runningModes.last.map { state.modes[$0].name },
                state.commonSources.count
                    + state.commonSources1.count { !($0.descriptorSource?.isLibrarySource.load(ordering: .relaxed) ?? false) },
                state.commonTimers.count, state.commonObservers.count, state.armedDeadline
            )
        }
        let (modes, commonModes, current, commonSources, commonTimers, commonObservers, armed) = snapshot
        var lines: [String] = []
        lines.append(
            "\(shortDescription) {sleeping = \(isWaiting), wake requested = \(wake.hasRequest),")
        if let backend {
            let (epoll, wakeUp, timer) = backend.descriptors
            let armedText =
                armed == LoopClock.never
                ? "disarmed" : armed > now ? "armed for \(formatNanoseconds(armed - now)) from now" : "expired \(formatNanoseconds(now - armed)) ago"
            lines.append("wake-up descriptor = \(wakeUp) (eventfd), epoll descriptor = \(epoll), timer descriptor = \(timer) (timerfd, \(armedText)),")
        } else {
            lines.append("wake-up = futex (no descriptors: the loop could not open its epoll set),")
        }
        lines.append(
            "stopped = \(wake.hasStopRequest), ignoring wake-ups = \(!wake.accepting.load(ordering: .relaxed)),")
        lines.append("current mode = \(current?.rawValue ?? "(none)"),")
        lines.append("common modes = { \(commonModes.map(\.rawValue).joined(separator: ", ")) },")
        lines.append(
            "common mode items = { \(commonSources) sources, \(commonTimers) timers, \(commonObservers) observers },"
        )
        lines.append("modes = {")
        for (index, mode) in modes.enumerated() {
            lines.append("  <RunLoopMode '\(mode.name.rawValue)'> {")
            if backend != nil {
                let set = mode.interestSet.map { "epoll descriptor \($0.descriptor) (its own: it has descriptor sources)" }
                lines.append("    sleeps in = \(set ?? "the loop's epoll set"),")
            }
            if index < deadlineLines.count { lines.append(deadlineLines[index]) }
            lines.append("    sources0 = {")
            for source in mode.sources {
                lines.append(
                    "      \(labelPrefix(source.label))order \(source.order), signalled \(source.isSignalled), valid \(source.isValid)"
                )
            }
            lines.append("    },")
            // Descriptions of the items themselves (fd, watched events; a port's queue), made
            // outside the loop's lock: each takes its item's own lock.
            lines.append("    sources1 = {")
            for item in mode.sources1 where !(item.descriptorSource?.isLibrarySource.load(ordering: .relaxed) ?? false) {
                lines.append("      \(item)")
            }
            lines.append("    },")
            lines.append("    timers = {")
            lines.append(contentsOf: index < timerLines.count ? timerLines[index] : [])
            lines.append("    },")
            lines.append("    observers = {")
            for observer in mode.observers {
                lines.append(
                    "      \(labelPrefix(observer.label))order \(observer.order), activities \(observer.activities), repeats \(observer.repeats)"
                )
            }
            lines.append("    },")
            lines.append("  },")
        }
        lines.append("}}")
        return lines.joined(separator: "\n")
    }

    /// `"label", ` for an item with a label (see ItemLabels.swift), nothing otherwise.
    private func labelPrefix(_ label: String?) -> String {
        label.map { "\"\($0)\", " } ?? ""
    }
}
