import Foundation
import RunLoopKit
import Synchronization

/// Timestamped lines recorded from any thread while an experiment runs, printed afterwards.
///
/// Loop threads only append (a lock and an array append, no I/O), so recording barely disturbs
/// the timings it measures; the main thread prints the lines once the loop threads have finished.
/// Times are relative to ``origin``, in milliseconds with one decimal.
final class TourLog: Sendable {
    /// One recorded line.
    struct Event: Sendable {
        /// When it happened, relative to the trace's origin.
        let at: Duration
        /// What happened.
        let text: String
    }

    /// The moment the trace counts from.
    let origin: ContinuousClock.Instant
    private let recorded = Mutex<[Event]>([])

    /// Starts a trace whose clock reads zero now.
    init() { origin = .now }

    /// The time since ``origin``.
    var elapsed: Duration { .now - origin }

    /// Records `text` at the current time and returns that time.
    @discardableResult
    func log(_ text: String) -> Duration {
        let at = elapsed
        recorded.locked { $0.append(Event(at: at, text: text)) }
        return at
    }

    /// Every event so far, in the order they were recorded.
    var events: [Event] { recorded.locked { $0 } }

    /// Prints every event as `   123.4 ms  text`, indented.
    func printEvents() {
        for event in events { Out.line("\(TourLog.ms(event.at, width: 8))  \(event.text)") }
    }

    /// A duration as Swift source, e.g. `.milliseconds(350)`, for echoing calls in traces.
    static func literal(_ duration: Duration) -> String {
        let ms = duration / .milliseconds(1)
        return ms == ms.rounded() ? ".milliseconds(\(Int(ms)))" : "\(duration)"
    }

    /// A duration in milliseconds with one decimal, right-aligned in `width` digits, e.g. `  99.8 ms`.
    static func ms(_ duration: Duration, width: Int = 0) -> String {
        let value = Double(duration.components.seconds) * 1e3 + Double(duration.components.attoseconds) / 1e15
        return String(format: "%\(width).1f ms", value)
    }
}

/// The tour's printer: headings, short wrapped explanations and indented trace lines.
enum Out {
    /// The column explanations wrap at.
    static let width = 100

    /// A numbered experiment heading, with a rule under it.
    static func heading(_ number: Int, _ title: String) {
        let text = "\(number). \(title)"
        print("")
        print(text)
        print(String(repeating: "=", count: text.count))
    }

    /// A sub-heading inside an experiment.
    static func subheading(_ text: String) {
        print("")
        print("  \(text)")
    }

    /// A paragraph, word-wrapped to ``width`` columns with `indent` spaces.
    static func paragraph(_ text: String, indent: Int = 0) {
        let pad = String(repeating: " ", count: indent)
        var line = ""
        for word in text.split(separator: " ") {
            if !line.isEmpty, pad.count + line.count + 1 + word.count > width {
                print(pad + line)
                line = ""
            }
            line += line.isEmpty ? String(word) : " " + word
        }
        if !line.isEmpty { print(pad + line) }
    }

    /// An experiment's conclusion, `=> text`, wrapped and indented by four spaces.
    static func conclusion(_ text: String) { paragraph("=> " + text, indent: 4) }

    /// A trace line, indented by four spaces.
    static func line(_ text: String) { print("    " + text) }
}
