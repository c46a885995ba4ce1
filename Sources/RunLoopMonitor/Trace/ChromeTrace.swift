import Glibc
import RunLoopKit

// Chrome Trace Event JSON (the format Perfetto UI and chrome://tracing open): spans as complete
// ("X") events, which an overwritten ring never leaves unmatched; wakeups as instants ("i");
// counters ("C"); stalls as async pairs ("b"/"e", which need not nest with the loop's spans);
// thread names ("M"). Timestamps are microseconds from the recording's start with nanosecond
// decimals. Written byte by byte (no Foundation encoder): a million events take well under a
// second (BENCHMARKS.md).

extension Trace {
    /// The trace as Chrome Trace Event JSON: `{"traceEvents":[...],"displayTimeUnit":"ns"}`.
    /// Every string is escaped so that the text can also sit inside an HTML `<script>` element.
    public func chromeTraceJSON() -> [UInt8] {
        let lanes = self.lanes
        var out = JSONBytes(capacity: 1024 + lanes.reduce(0) { $0 + $1.spans.count } * 176)
        let pid = Int64(getpid())
        out.raw(#"{"traceEvents":["#)
        out.raw(#"{"ph":"M","name":"process_name","pid":"#)
        out.int(pid)
        out.raw(#","tid":0,"args":{"name":"runloop"}}"#)
        var stallID: Int64 = 0
        for (laneIndex, lane) in lanes.enumerated() {
            let tid = Int64(lane.threadID)
            out.raw(#",{"ph":"M","name":"thread_name","pid":"#)
            out.int(pid)
            out.raw(#","tid":"#)
            out.int(tid)
            out.raw(#","args":{"name":"#)
            out.string(lane.threadName)
            out.raw(#"}},{"ph":"M","name":"thread_sort_index","pid":"#)
            out.int(pid)
            out.raw(#","tid":"#)
            out.int(tid)
            out.raw(#","args":{"sort_index":"#)
            out.int(Int64(laneIndex))
            out.raw("}}")
            // Names repeat (a million callouts of a few items): escape each once.
            var escaped: [[UInt8]?] = []
            for span in lane.spans {
                switch span.kind {
                case .counter:
                    out.raw(#",{"ph":"C","name":"#)
                    out.string("\(span.name) (\(lane.threadName))")
                    common(&out, pid: pid, tid: tid, ts: span.start)
                    out.raw(#","args":{"value":"#)
                    out.int(span.value)
                    out.raw("}}")
                case .stall:
                    stallID += 1
                    for (ph, ts) in [("b", span.start), ("e", span.end)] {
                        out.raw(#",{"ph":""#)
                        out.raw(ph)
                        out.raw(#"","cat":"stall","id":"#)
                        out.int(stallID)
                        out.raw(#","name":"#)
                        out.string(span.name)
                        common(&out, pid: pid, tid: tid, ts: ts)
                        out.raw("}")
                    }
                case .run, .phase, .callout, .sleep:
                    out.raw(#",{"ph":"X","cat":""#)
                    out.raw(span.kind.rawValue)
                    out.raw(#"","name":"#)
                    if span.nameKey >= 0 {
                        let key = Int(span.nameKey)
                        if key >= escaped.count { escaped.append(contentsOf: repeatElement(nil, count: key + 1 - escaped.count)) }
                        if escaped[key] == nil {
                            var one = JSONBytes(capacity: span.name.utf8.count + 8)
                            one.string(span.name)
                            escaped[key] = one.bytes
                        }
                        out.bytes.append(contentsOf: escaped[key]!)
                    } else {
                        out.string(span.kind == .run ? "run \(span.name)" : span.name)
                    }
                    common(&out, pid: pid, tid: tid, ts: span.start)
                    out.raw(#","dur":"#)
                    out.micros(span.duration.nanosecondsValue)
                    out.raw(#","args":{"pass":"#)
                    out.int(Int64(truncatingIfNeeded: span.firstPass))
                    if span.lastPass != span.firstPass {
                        out.raw(#","lastPass":"#)
                        out.int(Int64(truncatingIfNeeded: span.lastPass))
                    }
                    out.raw(#","depth":"#)
                    out.int(Int64(span.depth))
                    if let phase = span.phase, span.kind != .phase {
                        out.raw(#","phase":""#)
                        out.raw(phase.description)
                        out.raw(#"""#)
                    }
                    if span.calls > 1 {
                        out.raw(#","calls":"#)
                        out.int(Int64(span.calls))
                    }
                    if let detail = span.detail {
                        out.raw(
                            span.kind == .sleep ? #","wake":"# : span.kind == .run ? #","result":"# : #","activity":"#)
                        // A wake reason, a run result or an activity: fixed ASCII names.
                        out.raw("\"")
                        out.raw(detail)
                        out.raw("\"")
                    }
                    out.raw("}}")
                    if span.kind == .sleep {
                        out.raw(#",{"ph":"i","s":"t","cat":"wake","name":"#)
                        out.string("wake: \(span.detail ?? "none")")
                        common(&out, pid: pid, tid: tid, ts: span.end)
                        out.raw("}")
                    }
                }
            }
        }
        out.raw(#"],"displayTimeUnit":"ns","otherData":{"producer":"RunLoopKit TraceRecorder","overwrittenRecords":"#)
        out.int(Int64(truncatingIfNeeded: threads.reduce(0) { $0 &+ $1.overwritten }))
        out.raw("}}\n")
        return out.bytes
    }

    private func common(_ out: inout JSONBytes, pid: Int64, tid: Int64, ts: Duration) {
        out.raw(#","pid":"#)
        out.int(pid)
        out.raw(#","tid":"#)
        out.int(tid)
        out.raw(#","ts":"#)
        out.micros(ts.nanosecondsValue)
    }
}

extension Duration {
    /// Nanoseconds, saturated.
    var nanosecondsValue: Int64 { saturatedNanoseconds }
}

/// A JSON text being written: raw pieces, escaped strings, integers, and microseconds from
/// nanoseconds.
struct JSONBytes {
    var bytes: [UInt8] = []

    init(capacity: Int = 1 << 16) { bytes.reserveCapacity(capacity) }

    mutating func raw(_ text: StaticString) {
        text.withUTF8Buffer { bytes.append(contentsOf: $0) }
    }

    mutating func raw(_ text: String) {
        bytes.append(contentsOf: text.utf8)
    }

    /// A quoted string: quotes, backslashes and control characters escaped as JSON requires, and
    /// `<`, `>`, `&` as `\u003c`-style escapes so that the text is safe inside HTML.
    mutating func string(_ text: String) {
        bytes.append(UInt8(ascii: "\""))
        for byte in text.utf8 {
            switch byte {
            case UInt8(ascii: "\""): raw(#"\""#)
            case UInt8(ascii: "\\"): raw(#"\\"#)
            case UInt8(ascii: "\n"): raw(#"\n"#)
            case UInt8(ascii: "\r"): raw(#"\r"#)
            case UInt8(ascii: "\t"): raw(#"\t"#)
            case 0..<0x20, UInt8(ascii: "<"), UInt8(ascii: ">"), UInt8(ascii: "&"):
                raw(#"\u00"#)
                bytes.append(Self.hex[Int(byte >> 4)])
                bytes.append(Self.hex[Int(byte & 15)])
            default: bytes.append(byte)
            }
        }
        bytes.append(UInt8(ascii: "\""))
    }

    private static let hex: [UInt8] = Array("0123456789abcdef".utf8)

    mutating func int(_ value: Int64) {
        if value < 0 {
            bytes.append(UInt8(ascii: "-"))
            unsigned(value == .min ? UInt64(Int64.max) + 1 : UInt64(-value))
        } else {
            unsigned(UInt64(value))
        }
    }

    mutating func unsigned(_ value: UInt64) {
        var digits: (UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8,
                     UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8) =
            (0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0)
        var count = 0
        var rest = value
        withUnsafeMutableBytes(of: &digits) { buffer in
            repeat {
                buffer[count] = UInt8(ascii: "0") + UInt8(rest % 10)
                rest /= 10
                count += 1
            } while rest > 0
            var index = count - 1
            while index >= 0 {
                bytes.append(buffer[index])
                index -= 1
            }
        }
    }

    /// `ns` as microseconds with three decimals (`12.345`).
    mutating func micros(_ ns: Int64) {
        let negative = ns < 0
        let magnitude = ns.magnitude
        if negative { bytes.append(UInt8(ascii: "-")) }
        unsigned(magnitude / 1000)
        let fraction = magnitude % 1000
        bytes.append(UInt8(ascii: "."))
        bytes.append(UInt8(ascii: "0") + UInt8(fraction / 100))
        bytes.append(UInt8(ascii: "0") + UInt8(fraction / 10 % 10))
        bytes.append(UInt8(ascii: "0") + UInt8(fraction % 10))
    }
}
