import RunLoopKit

/// The back-off of repeated similar stalls (see ``StallMonitor/Backoff``). Monitor thread only.
struct StallBackoff {
    let rule: StallMonitor.Backoff
    private var seen: [[UInt64]: Entry] = [:]

    struct Entry {
        var count = 0
        /// Held back since the last report of this signature (counted in its next report).
        var suppressed = 0
        var last: ContinuousClock.Instant
        /// The last stall held back, for the summary.
        var lastHeldBack: (report: StallReport, sampler: StackSampler)?
    }

    init(_ rule: StallMonitor.Backoff) { self.rule = rule }

    private var forgetAfter: Duration? {
        switch rule {
        case .none: nil
        case .fibonacci(let forgetAfter): max(forgetAfter, .zero)
        }
    }

    /// Whether the stall with `signature` is reported, and how many like it were held back since
    /// the last one reported (what its report says).
    mutating func decide(_ signature: [UInt64], at now: ContinuousClock.Instant) -> (report: Bool, suppressedBefore: Int) {
        guard let forgetAfter, !signature.isEmpty else { return (true, 0) }
        var entry = seen[signature] ?? Entry(last: now)
        if now - entry.last > forgetAfter { entry = Entry(last: now) }
        entry.count += 1
        entry.last = now
        let report = Self.isFibonacci(entry.count)
        let suppressedBefore = entry.suppressed
        if report {
            entry.suppressed = 0
            entry.lastHeldBack = nil
        } else {
            entry.suppressed += 1
        }
        seen[signature] = entry
        return (report, report ? suppressedBefore : 0)
    }

    /// A held-back stall ended: kept for the summary.
    mutating func heldBack(_ signature: [UInt64], _ report: StallReport, _ sampler: StackSampler) {
        guard seen[signature] != nil else { return }
        seen[signature]!.lastHeldBack = (report, sampler)
    }

    /// A held-back stall lasted long enough to be reported after all: not counted as held back.
    mutating func reportedAfterAll(_ signature: [UInt64]) {
        guard let entry = seen[signature], entry.suppressed > 0 else { return }
        seen[signature]!.suppressed = entry.suppressed - 1
    }

    /// Summaries of the signatures forgotten by now (no such stall for `forgetAfter`) that held
    /// stalls back since their last report.
    mutating func expiredSummaries(at now: ContinuousClock.Instant) -> [(StallReport, StackSampler)] {
        guard let forgetAfter, !seen.isEmpty else { return [] }
        var summaries: [(StallReport, StackSampler)] = []
        for (signature, entry) in seen where now - entry.last > forgetAfter {
            if let summary = Self.summary(entry) { summaries.append(summary) }
            seen[signature] = nil
        }
        return summaries
    }

    /// Summaries of every signature that held stalls back since its last report (at stop).
    mutating func drainSummaries() -> [(StallReport, StackSampler)] {
        defer { seen.removeAll() }
        return seen.values.compactMap(Self.summary).sorted { $0.0.startedAt < $1.0.startedAt }
    }

    private static func summary(_ entry: Entry) -> (StallReport, StackSampler)? {
        guard entry.suppressed > 0, let (last, sampler) = entry.lastHeldBack else { return nil }
        var report = last
        report.suppressedSimilar = entry.suppressed
        return (report, sampler)
    }

    static func isFibonacci(_ n: Int) -> Bool {
        var (a, b) = (1, 2)
        if n == 1 { return true }
        while b < n { (a, b) = (b, a + b) }
        return b == n
    }
}
