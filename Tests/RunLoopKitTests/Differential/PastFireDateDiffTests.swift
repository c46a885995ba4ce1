import CoreFoundation
import Foundation
import SharedTestSupport
import Testing

@testable import RunLoopKit

import class RunLoopKit.RunLoop

/// A timer given a past fire date reports that date, as CoreFoundation's
/// `CFRunLoopTimerGetNextFireDate` does (its `_nextFireDate` keeps the date; only the internal
/// fire time, `_fireTSR`, is clamped to now), and so does the mode's next timer date; it fires at
/// once all the same, and after it fires it reports its schedule's next point. The same steps on
/// CoreFoundation and on RunLoopKit, each date printed as seconds from "now" at the start (whole
/// seconds: the past dates are 8 s and 2 s back, the interval 1000 s).
@Suite struct PastFireDateDiffTests {
    static func rounded(_ seconds: Double) -> String { String(Int(seconds.rounded())) }

    static func onCF() -> [String] {
        var lines: [String] = []
        let loop = CFRunLoopGetCurrent()
        let mode = cfhMode("past-date-diff")
        let start = CFAbsoluteTimeGetCurrent()
        let fired = Lines()
        let timer = CFRunLoopTimerCreateWithHandler(nil, start - 8, 1000, 0, 0) { _ in fired.append("fired") }!
        lines.append("made for -8: fireDate \(rounded(CFRunLoopTimerGetNextFireDate(timer) - start))")
        CFRunLoopAddTimer(loop, timer, mode)
        lines.append("in the mode: next timer date \(rounded(CFRunLoopGetNextTimerFireDate(loop, mode) - start))")
        CFRunLoopTimerSetNextFireDate(timer, start - 2)
        lines.append("set to -2: fireDate \(rounded(CFRunLoopTimerGetNextFireDate(timer) - start))")
        lines.append("next timer date \(rounded(CFRunLoopGetNextTimerFireDate(loop, mode) - start))")
        CFRunLoopRunInMode(mode, 0, false)
        lines.append("ran: \(fired.all)")
        lines.append("after firing: fireDate \(rounded(CFRunLoopTimerGetNextFireDate(timer) - start))")
        CFRunLoopTimerInvalidate(timer)
        return lines
    }

    static func onRunLoopKit() -> [String] {
        var lines: [String] = []
        let loop = RunLoop.current
        let mode: RunLoop.Mode = "past-date-diff"
        let start = ContinuousClock.now
        func seconds(_ instant: ContinuousClock.Instant?) -> String {
            guard let instant else { return "nil" }
            let duration = instant - start
            return rounded(Double(duration.components.seconds) + Double(duration.components.attoseconds) / 1e18)
        }
        let fired = Lines()
        let timer = RunLoopTimer(fireAt: start - .seconds(8), interval: .seconds(1000)) { _ in fired.append("fired") }
        lines.append("made for -8: fireDate \(seconds(timer.fireDate))")
        loop.add(timer, forMode: mode)
        lines.append("in the mode: next timer date \(seconds(loop.nextTimerFireDate(forMode: mode)))")
        timer.fireDate = start - .seconds(2)
        lines.append("set to -2: fireDate \(seconds(timer.fireDate))")
        lines.append("next timer date \(seconds(loop.nextTimerFireDate(forMode: mode)))")
        loop.run(mode: mode, for: .zero)
        lines.append("ran: \(fired.all)")
        lines.append("after firing: fireDate \(seconds(timer.fireDate))")
        timer.invalidate()
        return lines
    }

    @Test func aPastFireDateIsReportedAsGivenAndFiresAtOnce() throws {
        let cf = try #require(TestThreads.runBlocking(name: "past-cf") { Self.onCF() })
        let rlk = try #require(TestThreads.runBlocking(name: "past-rlk") { Self.onRunLoopKit() })
        #expect(
            cf == [
                "made for -8: fireDate -8", "in the mode: next timer date -8", "set to -2: fireDate -2",
                "next timer date -2", "ran: [\"fired\"]", "after firing: fireDate 1000",
            ], "CoreFoundation changed: \(cf)")
        #expect(rlk == cf)
    }

    /// A date far in the past (beyond what nanoseconds since boot can hold) is reported saturated,
    /// and the timer still fires at once (the clamp that keeps the firing from overflowing stays).
    @Test func aFarPastDateStillFiresAtOnce() throws {
        let result = try #require(
            TestThreads.runBlocking(name: "far-past") { () -> [String] in
                let loop = RunLoop.current
                let fired = Lines()
                let farPast = ContinuousClock.now - .seconds(Int64.max / 2)
                let timer = RunLoopTimer(fireAt: farPast) { _ in fired.append("fired") }
                loop.add(timer, forMode: .default)
                let reported = timer.fireDate < ContinuousClock.now - .seconds(1_000_000)
                loop.run(mode: .default, for: .seconds(5), returnAfterSourceHandled: false)
                return ["reported in the far past: \(reported)", "ran: \(fired.all)"]
            })
        #expect(result == ["reported in the far past: true", "ran: [\"fired\"]"])
    }
}
