import CRunLoopMonitor
import struct Foundation.Date
import Glibc
import Logging
import RunLoopKit
import Synchronization

// The reporting thread: symbolicates what the sampling thread found and delivers it, in order
// (StallMonitor.swift starts both threads; StallWorker.swift is the sampling side).

extension StallMonitor {
    /// The reporting thread: symbolicates each event's stacks (milliseconds for new addresses in
    /// a large binary, which must not delay sampling) and delivers it, in order.
    func runReporter() {
        // `began` reports stored unsymbolicated: stored again, symbolicated, once their addresses
        // are resolved, so that a hang that ends in a kill is found with names at the next launch.
        var storedUnsymbolicated: [(StallReport, StackSampler)] = []
        while true {
            let (batch, done) = shared.locked { shared in
                defer { shared.pending.removeAll() }
                return (shared.pending, shared.samplerDone)
            }
            for item in batch {
                storeSymbolicated(&storedUnsymbolicated)
                if let unsymbolicated = deliver(item.kind, item.report, item.sampler), store != nil {
                    storedUnsymbolicated.append((unsymbolicated, item.sampler))
                }
            }
            storeSymbolicated(&storedUnsymbolicated)
            if batch.isEmpty {
                if !storedUnsymbolicated.isEmpty && !done {
                    reporter.locked { $0 }?.sleep(until: .now + .milliseconds(20))  // until they are resolved
                    continue
                }
                if done {
                    // Let go of the handler: one that captures the monitor (to stop it) would
                    // otherwise keep both alive forever.
                    let handler = shared.locked { shared in
                        defer { shared.handler = nil }
                        return shared.handler
                    }
                    _ = consume handler
                    return
                }
                reporter.locked { $0 }?.sleep(until: .now + .seconds(3600))
            }
        }
    }

    /// How long a stall's first report waits for names when the names thread is still loading its
    /// symbol tables (a stall in the first tens to hundreds of milliseconds after ``start(_:)``).
    static let namesWarmUpPatience: Duration = .milliseconds(500)

    /// Symbolicates a report (reporting thread) and delivers it or counts it. A stall's first
    /// report waits at most one sample interval for symbols (its counter must reach `/metrics` at
    /// once, and a large binary's symbol and line tables take from hundreds of milliseconds to
    /// seconds to read the first time): full frames if they come within half of it, else names,
    /// else it goes out unsymbolicated while they are resolved in the background. Later reports
    /// of the stall wait for them. Only before the names thread has loaded its tables (tens to
    /// hundreds of milliseconds after ``start(_:)``) does a first report wait longer for names: up to
    /// `namesWarmUpPatience`.
    /// Returns the raw report of a `began` delivered without names.
    private func deliver(
        _ kind: PendingKind, _ raw: StallReport, _ sampler: StackSampler
    ) -> StallReport? {
        var report = raw
        let first = kind == .began || kind == .heldBackBegan
        // Once the symbolication thread has its tables (loaded from start()), a stack not seen
        // before resolves in well under a millisecond: the first report waits for it up to half a
        // sample interval, since only full frames tell a handler from the synthesized code it
        // calls (a `Codable` conformance's `encode(to:)` is the application's image, its file
        // `<compiler-generated>`).
        let warm = first && Symbolicator.shared.isWarm
        if first, let resolved = warm ? sampler.samplesSymbolicated(patience: sampleInterval / 2) : sampler.samplesIfSymbolicated() {
            report.attribute(resolved)
        } else if first {
            // Names only while the full frames (files, lines, inlined functions) are resolved in
            // the background: enough for the blame and the fingerprint.
            // Within one sample interval in all once the names thread has its tables (loaded from
            // start(), in tens to hundreds of milliseconds); a stall that begins before then (a
            // program that stalls as it starts) waits for them, up to half a second, rather than
            // go out nameless.
            let patience = !Symbolicator.shared.namesAreWarm ? max(sampleInterval, Self.namesWarmUpPatience) : warm ? sampleInterval / 2 : sampleInterval
            if let named = sampler.namedSamples(patience: patience), named.contains(where: { $0.frames.contains { $0.symbol != nil } }) {
                report.attribute(named)
            } else {
                report.attribute(sampler.samples(symbolicated: false), symbolicated: false)
            }
        } else {
            report.attribute(sampler.samples())
        }
        if let raw = report.rawAllThreads { report.allThreads = raw.map(ThreadStack.symbolicate) }
        // Counted under its first report's blame (one sample, at once), timed under its whole
        // blame (every sample, fully symbolicated).
        let (stuckIn, fingerprint) = MonitorMetrics.stallLabels(report)
        switch kind {
        case .began, .heldBackBegan:
            MonitorMetrics.increment(
                MonitorReporting.MetricName.stalls,
                [("loop", report.loop), ("phase", report.phase), ("stuck_in", stuckIn), ("fingerprint", fingerprint)])
        case .ended, .heldBackEnded:
            MonitorMetrics.record(MonitorReporting.MetricName.stallDuration, [("loop", report.loop), ("stuck_in", stuckIn)], duration: report.duration)
        case .suppressed:
            break
        }
        switch kind {
        case .began: emit(.began(report))
        case .ended: emit(.ended(report))
        case .suppressed: emit(.suppressed(report))
        case .heldBackBegan:
            MonitorMetrics.increment(MonitorReporting.MetricName.stallsSuppressed, [("loop", report.loop)])
            logger?.debug("run loop stall suppressed (same stack as earlier ones)", metadata: MonitorReporting.metadata(report))
        case .heldBackEnded:
            break
        }
        return kind == .began && !report.isSymbolicated ? raw : nil
    }

    /// Stores again, symbolicated, the `began` reports stored before the symbol tables were loaded,
    /// once they are (a later `began` line of a stall replaces the earlier one in the store).
    private func storeSymbolicated(_ reports: inout [(StallReport, StackSampler)]) {
        guard !reports.isEmpty, let store else { return }
        reports.removeAll { raw, sampler in
            guard let samples = sampler.samplesIfSymbolicated() else { return false }
            var report = raw
            report.attribute(samples)
            do { try store.record(.began(report)) } catch {
                logger?.error("cannot write the stall report to \(store.fileURL.path): \(error)")
            }
            return true
        }
    }

    /// Hands an event to the reporting thread (sampling thread).
    func enqueue(_ kind: PendingKind, _ report: StallReport, _ sampler: StackSampler) {
        shared.locked { $0.pending.append((kind, report, sampler)) }
        reporter.locked { $0 }?.wake()
    }
}
