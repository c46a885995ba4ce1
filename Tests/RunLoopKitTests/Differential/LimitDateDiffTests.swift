import CoreFoundation
import Foundation
import SharedTestSupport
import Synchronization
import Testing

@testable import RunLoopKit

import class RunLoopKit.RunLoop

// NSRunLoop's limitDateForMode: on CFRunLoop (Foundation's RunLoop.limitDate(forMode:)) and
// RunLoopKit's limitDate(forMode:), the same scenarios, traces compared.

/// Lines appended from the thread a scenario runs on.
final class Lines: Sendable {
    let lines = Mutex<[String]>([])
    func append(_ line: String) { lines.locked { $0.append(line) } }
    var all: [String] { lines.locked { $0 } }
}

func activityName(_ raw: UInt) -> String {
    switch raw {
    case 1: "entry"
    case 2: "beforeTimers"
    case 4: "beforeSources"
    case 32: "beforeWaiting"
    case 64: "afterWaiting"
    case 128: "exit"
    default: "activity \(raw)"
    }
}

/// The shape of what limitDate returned, the same for both implementations: nil, the distant
/// future, or a date within (0, 0.5 s] from now (the scenarios' timer is 0.5 s away).
func limitShape(secondsFromNow: Double?, isDistantFuture: Bool) -> String {
    guard let seconds = secondsFromNow else { return "nil" }
    if isDistantFuture { return "distantFuture" }
    return seconds > 0 && seconds <= 0.5 ? "within 0.5 s" : "at \(seconds) s"
}

@Suite struct LimitDateDiffTests {
    enum LimitScenario: String, CaseIterable, Sendable {
        /// A mode with nothing in it.
        case emptyMode
        /// One timer 0.5 s away: not fired; its date is returned.
        case futureTimer
        /// A due one-shot timer and one 0.5 s away: the due one fires, the other's date returns.
        case dueAndFutureTimers
        /// A due one-shot timer only: it fires, and the mode is empty afterwards.
        case onlyDueOneShot
        /// A version-0 source and no timer: the distant future.
        case onlySource0
        /// The common-modes placeholder.
        case commonModes
    }

    /// Foundation's `limitDate(forMode:)` on CFRunLoop, with an observer of every activity.
    private static func limitDateOnCF(_ scenario: LimitScenario) -> [String] {
        let trace = Lines()
        let loop = Foundation.RunLoop.current
        let cfLoop = CFRunLoopGetCurrent()
        let observer = CFRunLoopObserverCreateWithHandler(nil, CFRunLoopActivity.allActivities.rawValue, true, 0) {
            _, activity in trace.append(activityName(UInt(activity.rawValue)))
        }
        CFRunLoopAddObserver(cfLoop, observer, kCFRunLoopDefaultMode)
        var timers: [Foundation.Timer] = []
        func timer(_ name: String, in seconds: Double) {
            let timer = Foundation.Timer(fire: Date(timeIntervalSinceNow: seconds), interval: 0, repeats: false) { _ in
                trace.append("fired \(name)")
            }
            loop.add(timer, forMode: .default)
            timers.append(timer)
        }
        var context = CFRunLoopSourceContext()
        context.perform = { _ in }
        let source = CFRunLoopSourceCreate(nil, 0, &context)
        switch scenario {
        case .emptyMode, .commonModes: break
        case .futureTimer: timer("B", in: 0.5)
        case .dueAndFutureTimers:
            timer("A", in: -0.01)
            timer("B", in: 0.5)
        case .onlyDueOneShot: timer("A", in: -0.01)
        case .onlySource0: CFRunLoopAddSource(cfLoop, source, kCFRunLoopDefaultMode)
        }
        // An empty mode is not run: the observer would see nothing either way.
        let mode: Foundation.RunLoop.Mode = scenario == .commonModes ? .common : .default
        let date = loop.limitDate(forMode: mode)
        trace.append(
            "limit " + limitShape(secondsFromNow: date?.timeIntervalSinceNow, isDistantFuture: date == .distantFuture))
        for timer in timers { timer.invalidate() }
        CFRunLoopSourceInvalidate(source)
        CFRunLoopObserverInvalidate(observer)
        return trace.all
    }

    /// The same scenario on RunLoopKit.
    private static func limitDateOnRunLoopKit(_ scenario: LimitScenario) -> [String] {
        let trace = Lines()
        let loop = RunLoop.current
        let observer = RunLoopObserver(activities: .allActivities) { _, activity in
            trace.append(activityName(activity.rawValue))
        }
        loop.add(observer, forMode: .default)
        var timers: [RunLoopTimer] = []
        func timer(_ name: String, in seconds: Double) {
            let timer = RunLoopTimer(fireAt: .now + .seconds(seconds)) { _ in trace.append("fired \(name)") }
            loop.add(timer, forMode: .default)
            timers.append(timer)
        }
        let source = RunLoopSource(perform: {})
        switch scenario {
        case .emptyMode, .commonModes: break
        case .futureTimer: timer("B", in: 0.5)
        case .dueAndFutureTimers:
            timer("A", in: -0.01)
            timer("B", in: 0.5)
        case .onlyDueOneShot: timer("A", in: -0.01)
        case .onlySource0: loop.add(source, forMode: .default)
        }
        let instant = loop.limitDate(forMode: scenario == .commonModes ? .common : .default)
        let seconds = instant.map { instant -> Double in
            let components = ContinuousClock.now.duration(to: instant).components
            return Double(components.seconds) + Double(components.attoseconds) / 1e18
        }
        trace.append("limit " + limitShape(secondsFromNow: seconds, isDistantFuture: instant == RunLoop.distantFuture))
        for timer in timers { timer.invalidate() }
        source.invalidate()
        observer.invalidate()
        return trace.all
    }

    /// `limitDate(forMode:)` runs the loop once without sleeping (the observers see the same
    /// activities as on CFRunLoop, due timers fire) and returns what Foundation returns: nil for an
    /// empty mode and for `.common`, the distant future for work without a timer, the next fire
    /// date otherwise.
    @Test(arguments: LimitScenario.allCases)
    func limitDateMatchesFoundationOnCFRunLoop(_ scenario: LimitScenario) async throws {
        let cf = try #require(await TestThreads.run(name: "limit-cf") { Self.limitDateOnCF(scenario) })
        let kit = try #require(await TestThreads.run(name: "limit-rlk") { Self.limitDateOnRunLoopKit(scenario) })
        #expect(kit == cf, "\(scenario): CF \(cf), RunLoopKit \(kit)")
        // What each scenario is about, so that an agreement on something wrong is caught too.
        let expectedLimit: String =
            switch scenario {
            case .emptyMode, .commonModes, .onlyDueOneShot: "limit nil"
            case .futureTimer, .dueAndFutureTimers: "limit within 0.5 s"
            case .onlySource0: "limit distantFuture"
            }
        #expect(kit.last == expectedLimit, "\(scenario): \(kit)")
        if scenario != .emptyMode && scenario != .commonModes {
            #expect(kit.first == "entry" && kit.contains("exit"), "the loop ran once: \(kit)")
        }
    }

}
