import RunLoopKit

import class RunLoopKit.RunLoop

/// The callouts a virtual-time loop made last, for the errors that must say what never settled:
/// a recorder (RunLoopKit's `LoopRecorder` seam) attached while the scope lasts, which keeps the
/// last ``capacity`` callouts.
///
/// `@unchecked Sendable` is safe: the recorder is attached to the virtual-time loop, whose thread
/// is the only one that calls it and the only one that reads it (`VirtualTimeLoop` is used on the
/// thread `withVirtualTime` runs its body on, which is the loop's).
final class ActivityTrail: LoopRecorder, @unchecked Sendable {
    /// Lines an error shows (each one item's consecutive calls).
    static let length = 12
    /// Callouts kept (the oldest are dropped).
    static let capacity = 1_024

    private struct Callout {
        let pass: UInt64
        let phase: RunLoop.Phase
        let name: UInt32
        let detail: UInt8
    }

    private var callouts: [Callout] = []
    /// Callouts recorded in all (``callouts`` holds the last ``capacity``).
    private var recorded: UInt64 = 0
    private var firstOfDrive: UInt64 = 0
    private var names: [String] = []
    private var nameIndex: [String: UInt32] = [:]
    private let tag: UInt32
    private var token: RunLoop.InstrumentationToken?

    init(loop: RunLoop) {
        tag = RecorderTags.next()
        callouts.reserveCapacity(Self.capacity)
        token = loop.attachRecorder(self)
    }

    /// Stops recording.
    func detach() {
        token?.cancel()
        token = nil
    }

    /// Marks the start of a drive: the trail names only what came after.
    func begin() {
        firstOfDrive = recorded
    }

    /// The last callouts since ``begin()``, oldest first: `"pass N: <phase> <item>"`, with the
    /// observer's activity; consecutive calls of one item merge into `"passes A–B: ... ×calls"`.
    func lastCallouts() -> [String] {
        let kept = UInt64(callouts.count)
        let firstKept = recorded - kept
        let skip = firstOfDrive > firstKept ? Int(firstOfDrive - firstKept) : 0
        // The ring's oldest entry is at `recorded % capacity` once it is full.
        let start = recorded > UInt64(Self.capacity) ? Int(recorded % UInt64(Self.capacity)) : 0
        var runs: [(first: UInt64, last: UInt64, what: String, calls: Int)] = []
        for offset in skip..<callouts.count {
            let callout = callouts[(start + offset) % callouts.count]
            let name = Int(callout.name) < names.count ? names[Int(callout.name)] : "?"
            var what = "\(callout.phase) \(name)"
            if callout.phase == .observers {
                what += " (\(RunLoop.Activity(rawValue: 1 << UInt(callout.detail))))"
            }
            if let previous = runs.last, previous.what == what {
                runs[runs.count - 1].last = callout.pass
                runs[runs.count - 1].calls += 1
            } else {
                runs.append((callout.pass, callout.pass, what, 1))
            }
        }
        return runs.suffix(Self.length).map { run in
            let passes = run.first == run.last ? "pass \(run.first)" : "passes \(run.first)–\(run.last)"
            return "\(passes): \(run.what)" + (run.calls > 1 ? " ×\(run.calls)" : "")
        }
    }

    // MARK: LoopRecorder

    var nameTag: UInt32 { tag }

    func intern(_ name: String) -> UInt32 {
        if let index = nameIndex[name] { return index }
        let index = UInt32(names.count)
        names.append(name)
        nameIndex[name] = index
        return index
    }

    func calloutBegan(_ phase: RunLoop.Phase, name: UInt32, detail: UInt8, depth: UInt8, pass: UInt64) {
        let callout = Callout(pass: pass, phase: phase, name: name, detail: detail)
        if callouts.count < Self.capacity {
            callouts.append(callout)
        } else {
            callouts[Int(recorded % UInt64(Self.capacity))] = callout
        }
        recorded += 1
    }

    func blockBegan(depth: UInt8, pass: UInt64) {
        calloutBegan(.blocks, name: intern("block"), detail: 0, depth: depth, pass: pass)
    }

    func runBegan(mode name: UInt32, depth: UInt8, pass: UInt64) {}
    func runEnded(result: UInt8, depth: UInt8, pass: UInt64) {}
    func calloutEnded(depth: UInt8, pass: UInt64) {}
    /// 1: every call is its own callout (the trail lists calls, not records).
    var foldLimit: UInt32 { 1 }
    func calloutRepeated(times: UInt32, lastPass: UInt64) {}
    func sleepBegan(depth: UInt8, pass: UInt64) {}
    func woke(reason: UInt8, readyDescriptors: Int, depth: UInt8, pass: UInt64) {}
    func detached() {}
}
