import SharedTestSupport
import Testing

@testable import RunLoopKit

/// `Duration.saturatedNanoseconds` avoids 128-bit division; it must agree with the plain
/// division everywhere, the edges of `Int64` nanoseconds included.
@Suite struct TimeConversionTests {
    @Test func fastNanosecondsMatchDivision() {
        var random = SplitMix(seed: 0x7123)
        var samples: [Duration] = [
            .zero, .nanoseconds(1), .nanoseconds(-1), .nanoseconds(Int64.max), .nanoseconds(Int64.min),
            .nanoseconds(Int64.max) + .nanoseconds(1), .nanoseconds(Int64.min) - .nanoseconds(1),
            .seconds(Int64.max), .seconds(Int64.min), .seconds(1_000_000), .milliseconds(1), .microseconds(-1),
        ]
        for _ in 0..<200_000 {
            let seconds = Int64(bitPattern: random.next()) >> Int64.random(in: 0..<64, using: &random)
            let atto = Int64.random(in: 0..<1_000_000_000_000_000_000, using: &random)
            samples.append(Duration(secondsComponent: seconds, attosecondsComponent: atto))
        }
        for sample in samples {
            #expect(
                sample.saturatedNanoseconds == sample.saturatedNanosecondsByDivision,
                "\(sample): \(sample.saturatedNanoseconds) vs \(sample.saturatedNanosecondsByDivision)")
            if sample.saturatedNanoseconds != sample.saturatedNanosecondsByDivision { return }
        }
    }
}

extension Duration {
    /// `saturatedNanoseconds` computed the plain way, with one 128-by-64-bit division: the
    /// reference the tests compare the fast version with.
    var saturatedNanosecondsByDivision: Int64 {
        let atto = attoseconds
        let magnitude = atto.magnitude
        let high = UInt64(truncatingIfNeeded: magnitude >> 64)
        let low = UInt64(truncatingIfNeeded: magnitude)
        let divisor: UInt64 = 1_000_000_000
        guard high < divisor else { return atto < 0 ? .min : .max }
        let (quotient, _) = divisor.dividingFullWidth((high: high, low: low))
        guard quotient <= UInt64(Int64.max) else { return atto < 0 ? .min : .max }
        return atto < 0 ? -Int64(quotient) : Int64(quotient)
    }
}
