import Foundation
import RunLoopKit
import SharedTestSupport

import class RunLoopKit.RunLoop

// The RunLoopKit side of the differential tests: the same `LoopDriver` interface as
// `CFLoopDriver` (Support/CFHarness.swift), implemented with RunLoopKit's public API (the names RunLoopKit.md documents).

final class RLKDiffSource: DiffSource {
    let source: RunLoopSource
    init(order: Int, perform: @escaping @Sendable () -> Void) {
        source = RunLoopSource(order: order, perform: perform)
    }
    func signal() { source.signal() }
    func invalidate() { source.invalidate() }
    var isValid: Bool { source.isValid }
}

final class RLKDiffTimer: DiffTimer, @unchecked Sendable {
    // Set once, right after init, before the timer is handed out.
    var timer: RunLoopTimer!
    let epoch: ContinuousClock.Instant
    init(epoch: ContinuousClock.Instant) { self.epoch = epoch }
    func invalidate() { timer.invalidate() }
    var isValid: Bool { timer.isValid }
    func setFireDate(_ seconds: Double) { timer.fireDate = epoch + .seconds(seconds) }
    var fireDate: Double {
        let elapsed = epoch.duration(to: timer.fireDate)
        return Double(elapsed.components.seconds) + Double(elapsed.components.attoseconds) * 1e-18
    }
}

final class RLKDiffObserver: DiffObserver, @unchecked Sendable {
    // Set once, right after init, before the observer is handed out.
    var observer: RunLoopObserver!
    func invalidate() { observer.invalidate() }
    var isValid: Bool { observer.isValid }
}

final class RLKLoopDriver: LoopDriver {
    let loop: RunLoop
    let epoch: ContinuousClock.Instant
    var kind: String { "RunLoopKit" }

    init() {
        loop = RunLoop.current
        epoch = .now
    }

    private func mode(_ name: String) -> RunLoop.Mode { RunLoop.Mode(rawValue: name) }

    func now() -> Double {
        let elapsed = epoch.duration(to: .now)
        return Double(elapsed.components.seconds) + Double(elapsed.components.attoseconds) * 1e-18
    }

    func run(_ mode: String, _ seconds: Double, returnAfterSourceHandled: Bool) -> String {
        let result = loop.run(
            mode: self.mode(mode), for: .seconds(seconds), returnAfterSourceHandled: returnAfterSourceHandled)
        switch result {
        case .finished: return "finished"
        case .stopped: return "stopped"
        case .timedOut: return "timedOut"
        case .handledSource: return "handledSource"
        }
    }

    func runUntilStoppedOrFinished() { loop.run() }
    func sibling() -> any LoopDriver { RLKLoopDriver() }
    func acceptInput(_ mode: String, _ seconds: Double) {
        loop.acceptInput(mode: self.mode(mode), before: Date(timeIntervalSinceNow: seconds))
    }
    func nextTimerFireDate(_ mode: String) -> Double? {
        guard let instant = loop.nextTimerFireDate(forMode: self.mode(mode)) else { return nil }
        let elapsed = epoch.duration(to: instant)
        return Double(elapsed.components.seconds) + Double(elapsed.components.attoseconds) * 1e-18
    }
    func runBefore(_ mode: String, _ seconds: Double) -> Bool {
        loop.run(mode: self.mode(mode), before: Date(timeIntervalSinceNow: seconds))
    }
    func runUntil(_ seconds: Double) { loop.run(until: Date(timeIntervalSinceNow: seconds)) }
    var allModes: [String] { loop.allModes.map(\.rawValue).sorted() }

    func makeSource(order: Int, _ perform: @escaping @Sendable () -> Void) -> any DiffSource {
        RLKDiffSource(order: order, perform: perform)
    }
    func add(_ source: any DiffSource, _ mode: String) {
        loop.add((source as! RLKDiffSource).source, forMode: self.mode(mode))
    }
    func remove(_ source: any DiffSource, _ mode: String) {
        loop.remove((source as! RLKDiffSource).source, forMode: self.mode(mode))
    }

    func makeTimer(
        fireAt: Double, interval: Double, tolerance: Double, order: Int,
        _ handler: @escaping @Sendable (any DiffTimer) -> Void
    ) -> any DiffTimer {
        let handle = RLKDiffTimer(epoch: epoch)
        // The handler gets a fresh view of the timer it is passed, not `handle`: capturing `handle` (which
        // holds the timer) would make a reference cycle that leaks every timer.
        let epoch = self.epoch
        handle.timer = RunLoopTimer(
            fireAt: epoch + .seconds(fireAt), interval: .seconds(interval),
            tolerance: .seconds(tolerance), order: order
        ) { timer in
            let view = RLKDiffTimer(epoch: epoch)
            view.timer = timer
            handler(view)
        }
        return handle
    }
    func add(_ timer: any DiffTimer, _ mode: String) {
        loop.add((timer as! RLKDiffTimer).timer, forMode: self.mode(mode))
    }
    func remove(_ timer: any DiffTimer, _ mode: String) {
        loop.remove((timer as! RLKDiffTimer).timer, forMode: self.mode(mode))
    }

    func makeObserver(
        _ activities: UInt, repeats: Bool, order: Int,
        _ handler: @escaping @Sendable (any DiffObserver, UInt) -> Void
    ) -> any DiffObserver {
        let handle = RLKDiffObserver()
        handle.observer = RunLoopObserver(
            activities: RunLoop.Activity(rawValue: activities), repeats: repeats,
            order: order
        ) { observer, activity in
            // A fresh view, not `handle`, so the observer does not keep itself alive (see makeTimer).
            let view = RLKDiffObserver()
            view.observer = observer
            handler(view, activity.rawValue)
        }
        return handle
    }
    func add(_ observer: any DiffObserver, _ mode: String) {
        loop.add((observer as! RLKDiffObserver).observer, forMode: self.mode(mode))
    }
    func remove(_ observer: any DiffObserver, _ mode: String) {
        loop.remove((observer as! RLKDiffObserver).observer, forMode: self.mode(mode))
    }

    func contains(_ source: any DiffSource, _ mode: String) -> Bool {
        loop.contains((source as! RLKDiffSource).source, inMode: self.mode(mode))
    }
    func contains(_ timer: any DiffTimer, _ mode: String) -> Bool {
        loop.contains((timer as! RLKDiffTimer).timer, inMode: self.mode(mode))
    }
    func contains(_ observer: any DiffObserver, _ mode: String) -> Bool {
        loop.contains((observer as! RLKDiffObserver).observer, inMode: self.mode(mode))
    }

    func perform(_ modes: [String], _ block: @escaping @Sendable () -> Void) {
        loop.perform(inModes: modes.map { self.mode($0) }, block)
    }
    func stop() { loop.stop() }
    func wakeUp() { loop.wakeUp() }
    var currentMode: String? { loop.currentMode?.rawValue }
    func addCommonMode(_ mode: String) { loop.addCommonMode(self.mode(mode)) }
    var isWaiting: Bool { loop.isWaiting }
}
