/// When one watched source is stalled, decided from what the monitor sees of it and nothing else:
/// each look (a ``StallSnapshot`` and the time) goes in, what the monitor must do comes out. No
/// threads, no clocks, no stacks: the monitor's thread does what it is told (samples, CPU reads,
/// reports) and says how it went, and tests drive a detector with scripted snapshots.
///
/// A look:
///
///     look(snapshot, at: now)          -> ended?  (the stall in progress moved on)
///                                         exited? (the thread exited: forget the source)
///                                         newWork? (busy in work not seen before: read its CPU)
///                                         then one of: idle, wait(until:), sample, begin(since:)
///     sampled(ok, at: now)             after a `sample`: the thread's gone (ended), or a hang to
///                                         report now, and when to look again
///     began(ok, reported:, at: now)    after a `begin`: the first sample taken or not, reported
///                                         or held back by the back-off; when to look again
///
/// Monitor thread only (a value owned by one watch).
struct StallDetector {
    /// What the monitor was made with.
    struct Settings {
        var threshold: Duration
        var sampleInterval: Duration
        /// A stall the back-off held back is reported all the same once it lasts this long: a
        /// hang is never hidden.
        var hangAfter: Duration { max(.seconds(2), threshold * 4) }
    }

    /// What the source is doing: a pass, and a callout (or a stretch of its own work) in it.
    struct Key: Equatable {
        let generation: UInt64
        let callout: UInt32
    }

    /// Work seen busy, not (yet) a stall.
    struct Candidate: Equatable {
        let key: Key
        /// When it began, as well as the looks and the source's stamps tell.
        let busySince: ContinuousClock.Instant
        /// The look that first saw it.
        let seenAt: ContinuousClock.Instant
    }

    /// The stall in progress.
    struct Stall: Equatable {
        let key: Key
        let busySince: ContinuousClock.Instant
        /// The look that first saw its work: the work was running then.
        let seenAt: ContinuousClock.Instant
        var nextSample: ContinuousClock.Instant
        /// Reported (`began` sent), or held back by the back-off until it ends or becomes a hang.
        var reported: Bool

        /// Whether a held-back stall is a hang now (and from now on reported).
        mutating func becomesAHang(at now: ContinuousClock.Instant, _ settings: Settings) -> Bool {
            guard !reported, now - busySince >= settings.hangAfter else { return false }
            reported = true
            return true
        }
    }

    /// What a look leaves to do once the stall bookkeeping is done.
    enum Next: Equatable {
        /// Nothing is busy: look again in the usual round.
        case idle
        /// Busy, not stalled (yet), or a stall between samples: look again by then (or in the
        /// usual round, if sooner).
        case wait(until: ContinuousClock.Instant)
        /// Busy, seen late: a stall may begin only at the next usual round.
        case waitForRound
        /// Sample the stall in progress, then call ``sampled(_:at:)``.
        case sample
        /// A stall begins: take its first sample, decide the back-off, then call
        /// ``began(_:reported:at:)``.
        case begin(busySince: ContinuousClock.Instant)
    }

    /// The outcome of a look.
    struct Look: Equatable {
        /// The stall in progress ended (its end and why): report it.
        var ended: (reason: StallReport.EndReason, at: ContinuousClock.Instant)?
        /// The source's thread exited: forget the source (nothing more follows).
        var threadExited = false
        /// Busy in work not seen before (``candidate``): read its thread's CPU clock now.
        var newWork = false
        /// The stall in progress was held back by the back-off and now lasts long enough to be a
        /// hang: report it now.
        var reportHang = false
        var next: Next = .idle

        static func == (lhs: Look, rhs: Look) -> Bool {
            lhs.ended?.reason == rhs.ended?.reason && lhs.ended?.at == rhs.ended?.at && lhs.threadExited == rhs.threadExited
                && lhs.newWork == rhs.newWork && lhs.reportHang == rhs.reportHang && lhs.next == rhs.next
        }
    }

    let settings: Settings
    private(set) var candidate: Candidate?
    private(set) var stall: Stall?
    /// When the monitor last began to look: the instant before it read the snapshot, so work that
    /// snapshot did not show began after it.
    private(set) var lastLook: ContinuousClock.Instant?

    init(_ settings: Settings) { self.settings = settings }

    /// One look at the source: `snapshot`, read after `readFrom` (the monitor's clock before the
    /// read; `now` when nil), judged at `now` (the clock after the read).
    ///
    /// The two instants differ when the monitor's thread is preempted between the read and the
    /// clock: work the snapshot did not show may have begun before `now`, never before `readFrom`.
    mutating func look(_ snapshot: StallSnapshot, at now: ContinuousClock.Instant, readFrom: ContinuousClock.Instant? = nil)
        -> Look
    {
        var look = Look()
        let previousLook = lastLook
        lastLook = min(readFrom ?? now, now)
        let busy = snapshot.activity == .busy
        let current = Key(generation: snapshot.work, callout: snapshot.step)
        // Moved on, whatever the thread did next (even if it has exited since).
        if let stall, !busy || stall.key != current {
            look.ended = (.movedOn, Self.movedOnAt(snapshot, stall, now))
            self.stall = nil
        }
        if snapshot.threadExited {
            if stall != nil { look.ended = (.threadExited, now) }
            stall = nil
            candidate = nil
            look.threadExited = true
            return look
        }
        guard busy else {
            candidate = nil
            return look
        }
        if candidate?.key != current {
            // Timed from the last look that saw the source elsewhere (the work began after it), or
            // from when the source stamped its busy stretch, if that is later: the stretch holds
            // the work (a later callout of a RunLoopKit pass began after its pass's stamp), so a
            // duration is never shorter than the work, and at most a sample interval longer at
            // its start.
            var since = previousLook ?? now
            if let stamped = snapshot.busySince, stamped > since { since = stamped }
            // A source that knows when the work began (a heartbeat's send time) says so exactly.
            if snapshot.busySinceIsExact, let stamped = snapshot.busySince { since = stamped }
            candidate = Candidate(key: current, busySince: min(since, now), seenAt: now)
            look.newWork = true
        }
        guard let candidate else { return look }
        if var stall {
            if now >= stall.nextSample {
                look.next = .sample  // the hang is looked for after the sample
                return look
            }
            look.reportHang = stall.becomesAHang(at: now, settings)
            self.stall = stall
            look.next = .wait(until: stall.nextSample)
            return look
        }
        let due = candidate.busySince + settings.threshold
        guard now >= due else {
            look.next = .wait(until: due)
            return look
        }
        // Seen busy for the first time already past due: the monitor's own round was late (it
        // sampled another stall, or waited for a CPU), so the work may be young. A stall begins
        // only at a later look that still sees it (the usual round, one sample interval on).
        if candidate.seenAt == now && !snapshot.busySinceIsExact {
            look.next = .waitForRound
            return look
        }
        look.next = .begin(busySince: candidate.busySince)
        return look
    }

    /// After a look's ``Next/sample``: whether the sample was taken (false: the thread is gone,
    /// and the stall ends there). Returns the stall's end if it ended, whether a held-back stall
    /// is now a hang to report, and when to look again.
    mutating func sampled(_ taken: Bool, at now: ContinuousClock.Instant)
        -> (ended: StallReport.EndReason?, reportHang: Bool, next: ContinuousClock.Instant?)
    {
        guard var stall else { return (nil, false, nil) }
        guard taken else {
            self.stall = nil
            return (.threadExited, false, nil)
        }
        stall.nextSample = max(stall.nextSample + settings.sampleInterval, now)
        let hang = stall.becomesAHang(at: now, settings)
        self.stall = stall
        return (nil, hang, stall.nextSample)
    }

    /// After a look's ``Next/begin(busySince:)``: whether the first sample was taken (false: the
    /// thread is gone, no stall), and whether the back-off let it be reported. Returns when to
    /// look again.
    mutating func began(_ taken: Bool, reported: Bool, at now: ContinuousClock.Instant) -> ContinuousClock.Instant? {
        guard taken, let candidate else { return nil }
        let stall = Stall(
            key: candidate.key, busySince: candidate.busySince, seenAt: candidate.seenAt, nextSample: now + settings.sampleInterval,
            reported: reported)
        self.stall = stall
        return stall.nextSample
    }

    /// The stall in progress ends without a look (the monitor stops, or no longer watches it).
    mutating func endStall() { stall = nil }

    /// When the source moved on, as it stamped it: the start of its sleep, or of the next pass's
    /// work; the monitor's own time only when it stamped nothing usable (the monitor may look up
    /// to a sample interval late, or later when its thread waits for the CPU).
    static func movedOnAt(_ snapshot: StallSnapshot, _ stall: Stall, _ now: ContinuousClock.Instant) -> ContinuousClock.Instant {
        // A stamp is when the source's current stretch of work (or its sleep) began. The stall's
        // work was running when a look first saw it, so a stamp later than that look is a
        // stretch or a sleep begun after the work ended: its start is the end. A stamp not later
        // is the stall's own stretch, or an older one a snapshot read across a sleep paired with
        // the work's key (a pass that slept and woke in the same generation): it tells nothing of
        // the end.
        let stamped = snapshot.activity == .idle ? snapshot.idleSince : snapshot.busySince
        guard let stamped, stamped > stall.seenAt, stamped <= now else { return now }
        return stamped
    }
}
