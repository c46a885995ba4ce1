import Foundation
import RunLoopKit
import RunLoopMonitor
import Synchronization

import class RunLoopKit.RunLoop

/// `tour --trace DIR`: a TraceRecorder per experiment, which every ``LoopThread`` records its loop
/// into, and the files written when the experiment ends.
enum LabTrace {
    /// The recorder of the experiment running now, if the tour records traces.
    private static let current = Mutex<TraceRecorder?>(nil)

    /// Records `loop` if an experiment is being traced: called by ``LoopThread`` before its body,
    /// and by experiments for the loops they do not make with it (a PermanentThread's, the main
    /// loop).
    static func recordIfTracing(_ loop: RunLoop) {
        current.locked { $0 }?.record(loop)
    }

    /// The recorder of the experiment running now, if the tour records traces: an experiment that
    /// reads its own loops' trace uses this one (a loop records into one buffer at a time).
    static var recording: TraceRecorder? { current.locked { $0 } }

    /// Where the tour writes its traces (`tour --trace DIR`), while an experiment is traced.
    static var directory: String? { currentDirectory.locked { $0 } }
    private static let currentDirectory = Mutex<String?>(nil)

    /// Adds a stall a StallMonitor reported to the trace, if an experiment is being traced: a
    /// span over the stalled thread's lane.
    static func recordIfTracing(_ event: StallEvent) {
        current.locked { $0 }?.record(event)
    }

    /// Runs `body` with a recorder installed, then writes `DIR/NN-slug.json` and `.html`; prints
    /// where they went.
    static func tracing(number: Int, title: String, into directory: String?, _ body: () -> Void) throws {
        guard let directory else { return body() }
        let recorder = try TraceRecorder(capacityPerLoop: 65_536)
        current.locked { $0 = recorder }
        currentDirectory.locked { $0 = directory }
        body()
        current.locked { $0 = nil }
        currentDirectory.locked { $0 = nil }
        recorder.stop()
        let trace = recorder.snapshot()
        let spans = trace.lanes.reduce(0) { $0 + $1.spans.count }
        guard spans > 0 else {
            Out.line("(no trace: no loop ran in this experiment's process)")
            return
        }
        let stem = String(format: "%02d-", number) + slug(title)
        let json = URL(filePath: directory).appending(path: stem + ".json")
        let html = URL(filePath: directory).appending(path: stem + ".html")
        try Data(trace.chromeTraceJSON()).write(to: json)
        try trace.timelineHTML(title: "\(number). \(title)").write(to: html, atomically: true, encoding: .utf8)
        Out.line("trace: \(json.path) and \(html.path) (\(trace.lanes.count) loop(s), \(spans) spans)")
    }

    /// `Observer log of a loop` -> `observer-log-of-a-loop` (at most 40 characters).
    static func slug(_ title: String) -> String {
        var words: [String] = []
        var word = ""
        for character in title.lowercased() {
            if character.isLetter || character.isNumber, character.isASCII {
                word.append(character)
            } else if !word.isEmpty {
                words.append(word)
                word = ""
            }
        }
        if !word.isEmpty { words.append(word) }
        var slug = ""
        for word in words where slug.count + word.count < 40 { slug += (slug.isEmpty ? "" : "-") + word }
        return slug
    }
}
