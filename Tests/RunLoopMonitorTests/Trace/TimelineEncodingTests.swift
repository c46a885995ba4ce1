import Foundation
import RunLoopMonitor
import SharedTestSupport
import Testing

/// `TimelinePage` on a trace in an encoding other than UTF-8, which the page would embed as bytes
/// and render blank.
@Suite("Timeline input encoding")
struct TimelineEncodingTests {
    static let trace = #"{"traceEvents":[{"ph":"X","ts":0,"dur":1,"pid":1,"tid":1,"name":"a"}]}"#

    static func utf16(_ text: String, bigEndian: Bool, byteOrderMark: Bool) -> [UInt8] {
        var bytes: [UInt8] = byteOrderMark ? (bigEndian ? [0xFE, 0xFF] : [0xFF, 0xFE]) : []
        for unit in text.utf16 {
            let pair = [UInt8(unit >> 8), UInt8(unit & 0xFF)]
            bytes += bigEndian ? pair : pair.reversed()
        }
        return bytes
    }

    @Test("UTF-16 (with or without a byte-order mark) and UTF-32 are refused, naming UTF-8")
    func notUTF8IsRefused() throws {
        var utf32LE: [UInt8] = []
        for scalar in Self.trace.unicodeScalars {
            let value = scalar.value
            utf32LE += [UInt8(value & 0xFF), UInt8(value >> 8 & 0xFF), UInt8(value >> 16 & 0xFF), UInt8(value >> 24)]
        }
        let inputs: [(String, [UInt8])] = [
            ("UTF-16LE with BOM", Self.utf16(Self.trace, bigEndian: false, byteOrderMark: true)),
            ("UTF-16BE with BOM", Self.utf16(Self.trace, bigEndian: true, byteOrderMark: true)),
            ("UTF-16LE", Self.utf16(Self.trace, bigEndian: false, byteOrderMark: false)),
            ("UTF-16BE", Self.utf16(Self.trace, bigEndian: true, byteOrderMark: false)),
            ("UTF-32LE", utf32LE),
            ("Latin-1 in a name", Array(#"[{"ph":"X","ts":0,"dur":1,"name":""#.utf8) + [0xE9] + Array(#""}]"#.utf8)),
        ]
        for (name, bytes) in inputs {
            #expect(throws: TimelinePage.InputError.self, "\(name)") { try TimelinePage.validate(bytes) }
            do {
                _ = try TimelinePage.validate(bytes)
            } catch {
                #expect(error.description.contains("UTF-8"), "\(name): \(error)")
            }
        }
        #expect(try TimelinePage.validate(Array(Self.trace.utf8)) == 1)
    }
}
