import RunLoopKit

import class RunLoopKit.RunLoop

/// The callouts a virtual-time loop made last, for the errors that must say what never settled:
/// the loop records into a small trace ring (the same records `RunLoopMonitor`'s traces read)
/// while the scope lasts.
final class ActivityTrail {
    /// Lines an error shows (each one item's consecutive calls).
    static let length = 12
    private let buffer = TraceBuffer(capacity: 1_024)
    private var token: RunLoop.InstrumentationToken?
    private var firstRecord: UInt64 = 0

    init(loop: RunLoop) {
        token = loop.attachTraceBuffer(buffer)
    }

    /// Stops recording.
    func detach() {
        token?.cancel()
        token = nil
    }

    /// Marks the start of a drive: the trail names only what came after.
    func begin() {
        firstRecord = buffer.recordsWritten
    }

    /// The last callouts since ``begin()``, oldest first: `"pass N: <phase> <item>"`, with the
    /// observer's activity; consecutive calls of one item merge into `"passes A–B: ... ×calls"`.
    func lastCallouts() -> [String] {
        let (records, overwritten) = buffer.snapshot()
        let names = buffer.nameTable
        let skip = firstRecord > overwritten ? Int(firstRecord - overwritten) : 0
        var runs: [(first: UInt64, last: UInt64, what: String, calls: Int)] = []
        for record in records.dropFirst(skip) where record.kind == .callout {
            let name = Int(record.name) < names.count ? names[Int(record.name)] : "?"
            var what = "\(record.phase) \(name)"
            if record.phase == .observers {
                what += " (\(RunLoop.Activity(rawValue: 1 << UInt(record.detail))))"
            }
            let last = record.firstPass + UInt64(record.passSpan)
            if let previous = runs.last, previous.what == what {
                runs[runs.count - 1].last = last
                runs[runs.count - 1].calls += Int(record.count)
            } else {
                runs.append((record.firstPass, last, what, Int(record.count)))
            }
        }
        return runs.suffix(Self.length).map { run in
            let passes = run.first == run.last ? "pass \(run.first)" : "passes \(run.first)–\(run.last)"
            return "\(passes): \(run.what)" + (run.calls > 1 ? " ×\(run.calls)" : "")
        }
    }
}
