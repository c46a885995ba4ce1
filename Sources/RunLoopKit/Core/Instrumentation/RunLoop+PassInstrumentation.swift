// What a pass publishes for the instrumentation seam (Instrumentation.swift): its phase and
// generation, the phases' times while watched, the wake reason, and the iteration reports.

extension RunLoop {
    /// Enters `phase`: publishes it with the pass's generation (one relaxed store), and while the
    /// loop is instrumented, stamps its start and charges the time since the last change to the
    /// phase that ends.
    @inline(__always)
    func enterPhase(_ phase: Phase, _ context: inout RunContext) {
        if _slowPath(context.pass.flags != 0) {
            stampPhase(phase, &context)
            context.pass.phase = phase
        } else if confined.passes.phase == phase {
            return  // published already (observers for beforeTimers, then for beforeSources)
        }
        publishPhase(phase)
    }

    @inline(__always)
    func publishPhase(_ phase: Phase) {
        confined.passes.phase = phase
        instrumentation.phaseWord.store(confined.passes.generation << 8 | UInt64(phase.rawValue), ordering: .relaxed)
    }

    private func stampPhase(_ phase: Phase, _ context: inout RunContext) {
        let now = LoopClock.now()
        if context.pass.phaseStartNs != 0 {
            context.pass.times.add(now - context.pass.phaseStartNs, to: context.pass.phase)
        }
        context.pass.phaseStartNs = now
        instrumentation.phaseStartNs.store(now, ordering: .releasing)
        if phase == .waiting {
            context.pass.busyStamped = false
        } else if !context.pass.busyStamped {
            context.pass.busyStamped = true
            instrumentation.busyStartNs.store(now, ordering: .releasing)
        }
    }

    /// What ended the pass's wait, read from what the wait left behind.
    func noteWakeReason(_ poll: Bool, _ context: inout RunContext) {
        context.pass.wakeReason =
            if poll {
                .none
            } else if !context.scratch.kernelEvents.isEmpty {
                .descriptor
            } else if confined.recentCrossThreadWakeUp {
                wake.source1Attention.load(ordering: .relaxed) ? .port : .wakeUp
            } else if LoopClock.now() >= context.deadline {
                .timeout
            } else {
                .timer
            }
    }

    /// Hands the pass's report to the loop's iteration reporters, on the loop's thread, with no
    /// lock held.
    func reportPass(_ context: inout RunContext) {
        enterPhase(context.pass.phase, &context)  // charges the phase in progress up to now
        let report = IterationReport(
            mode: context.mode, generation: confined.passes.generation, wakeReason: context.pass.wakeReason,
            slept: context.pass.wakeReason == .none ? .zero : context.pass.times[.waiting],
            phaseTimes: context.pass.times)
        if confined.passes.reportersVersion != instrumentation.reportersVersion.load(ordering: .acquiring) {
            confined.passes.reportersVersion = instrumentation.reportersVersion.load(ordering: .acquiring)
            confined.passes.reporters = instrumentation.currentReporters
        }
        // A reporter that runs the loop (a nested run) is not re-entered by the nested passes'
        // reports, as an observer is not: those are not delivered.
        guard !confined.passes.reporting else { return }
        confined.passes.reporting = true
        defer { confined.passes.reporting = false }
        // An index loop over the loop's own copy: no lock, no iterator (nothing to allocate).
        let reporters = confined.passes.reporters
        var index = 0
        while index < reporters.count {
            reporters[index].call(report)
            index += 1
        }
    }
}
