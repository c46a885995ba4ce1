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
