extension RunLoop {
    /// A dump of the loop in the manner of CoreFoundation's `CFRunLoop` description: the owning
    /// thread, whether it sleeps, the current mode, the common modes and common items, then each
    /// mode with its sources, its descriptor sources and ports (with their descriptors and watched
    /// events), timers (with their next fire date) and observers (with their activities and order),
    /// each item headed by its `label` when it has one.
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
        let snapshot = state.locked { state in
            (
                state.modes, state.commonModes, state.runningModes.last.map { state.modes[$0].name },
                state.commonSources.count + state.commonSources1.count,
                state.commonTimers.count, state.commonObservers.count
            )
        }
        let (modes, commonModes, current, commonSources, commonTimers, commonObservers) = snapshot
        var lines: [String] = []
        lines.append(
            "\(shortDescription) {sleeping = \(isWaiting), wake requested = \(wakeRequested.load(ordering: .relaxed)),")
        lines.append("current mode = \(current?.rawValue ?? "(none)"),")
        lines.append("common modes = { \(commonModes.map(\.rawValue).joined(separator: ", ")) },")
        lines.append(
            "common mode items = { \(commonSources) sources, \(commonTimers) timers, \(commonObservers) observers },"
        )
        lines.append("modes = {")
        for (index, mode) in modes.enumerated() {
            lines.append("  <RunLoopMode '\(mode.name.rawValue)'> {")
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
