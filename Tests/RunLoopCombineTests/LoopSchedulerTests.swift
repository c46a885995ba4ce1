// RunLoopCombine beyond the ported peer tests: delivery on the loop's thread, the modes option,
// cancellation, non-finite times, a subscriber that cancels itself, a publisher dropped while
// connected. XCTest, as the ported suites: its methods run on the main thread, where RunLoop.main
// runs, and `run(timeout:until:)` waits for events, not for guessed times.
#if OpenCombine
import Foundation
import OpenCombine
import RunLoopCombine
import RunLoopKit
import RunLoopTesting
import XCTest

private typealias RunLoop = RunLoopKit.RunLoop

final class LoopSchedulerTests: XCTestCase {
    /// A mode no other test uses, so a test can see that its timers are gone.
    private lazy var privateMode = RunLoop.Mode(rawValue: "RunLoopCombineTests \(name)")

    func testReceiveOnDeliversInOrderOnTheLoopsThread() {
        let subject = PassthroughSubject<Int, Never>()
        let received = Locked([Int]())
        let offThread = Locked(0)
        let subscription = subject.receive(on: RunLoop.main).sink { value in
            if !Thread.isMainThread { offThread.value += 1 }
            received.value.append(value)
        }
        let box = SubjectBox(subject)
        executeOnBackgroundThread { for value in 0..<500 { box.subject.send(value) } }
        XCTAssertTrue(RunLoop.main.run(timeout: .seconds(60)) { received.value.count == 500 })
        XCTAssertEqual(received.value, Array(0..<500))
        XCTAssertEqual(offThread.value, 0)
        subscription.cancel()
    }

    /// Combine's RunLoop scheduler runs work in the default mode only; `.modes([.common])` keeps
    /// it running during a tracking run, as NSTimer in the common modes does.
    func testCommonModesOptionRunsDuringATrackingRun() {
        let loop = RunLoop.main
        // As UIKit does on iOS: the tracking mode is one of the main loop's common modes.
        loop.addCommonMode(.tracking)
        let inCommon = Locked(false)
        let inDefault = Locked(false)
        loop.schedule(options: .modes([.common])) { inCommon.value = true }
        loop.schedule(options: nil) { inDefault.value = true }
        // Something to keep the tracking mode alive while the test waits in it.
        let keepAlive = RunLoopTimer(after: .seconds(3600)) { _ in }
        loop.add(keepAlive, forMode: .tracking)
        defer { keepAlive.invalidate() }
        XCTAssertTrue(loop.run(mode: .tracking, timeout: .seconds(60)) { inCommon.value })
        XCTAssertFalse(inDefault.value, "default-mode work ran inside the tracking run")
        XCTAssertTrue(loop.run(timeout: .seconds(60)) { inDefault.value })
    }

    func testScheduledTimesAreLoopTimersInTheGivenModes() {
        let loop = RunLoop.main
        let ran = Locked(0)
        let options = RunLoop.SchedulerOptions.modes([privateMode])
        loop.schedule(after: loop.now.advanced(by: .milliseconds(20)), tolerance: .milliseconds(5), options: options) {
            ran.value += 1
        }
        XCTAssertNotNil(loop.nextTimerFireDate(forMode: privateMode))
        XCTAssertNil(loop.nextTimerFireDate(forMode: .tracking))
        XCTAssertTrue(loop.run(mode: privateMode, timeout: .seconds(60)) { ran.value == 1 })
        // The one-shot timer is gone once fired.
        XCTAssertNil(loop.nextTimerFireDate(forMode: privateMode))
    }

    func testCancellingARepeatingScheduleRemovesItsTimer() {
        let loop = RunLoop.main
        let ticks = Locked(0)
        let cancellable = loop.schedule(
            after: loop.now.advanced(by: .milliseconds(1)), interval: .milliseconds(1), tolerance: .zero,
            options: .modes([privateMode])
        ) { ticks.value += 1 }
        XCTAssertTrue(loop.run(mode: privateMode, timeout: .seconds(60)) { ticks.value >= 3 })
        cancellable.cancel()
        XCTAssertNil(loop.nextTimerFireDate(forMode: privateMode))
        let after = ticks.value
        // The mode is empty now: the run returns at once and nothing fires again.
        XCTAssertFalse(loop.run(mode: privateMode, timeout: .milliseconds(50)) { false })
        XCTAssertEqual(ticks.value, after)
    }

    func testNonFiniteTimes() {
        let loop = RunLoop.main
        let ran = Locked([String]())
        // A NaN date is "now" (as Foundation's timers take a NaN fire date); an infinite one never.
        let nan = RunLoop.SchedulerTimeType(Date(timeIntervalSinceReferenceDate: .nan))
        let never = RunLoop.SchedulerTimeType(Date(timeIntervalSinceReferenceDate: .infinity))
        loop.schedule(after: nan, tolerance: .seconds(.infinity), options: .modes([privateMode])) { ran.value.append("nan") }
        loop.schedule(after: never, tolerance: .seconds(.nan), options: .modes([privateMode])) { ran.value.append("never") }
        XCTAssertTrue(loop.run(mode: privateMode, timeout: .seconds(60)) { ran.value == ["nan"] })
        XCTAssertFalse(loop.run(mode: privateMode, timeout: .milliseconds(50)) { ran.value.count > 1 })
        // A repeating schedule with an infinite interval fires once.
        let once = loop.schedule(after: loop.now, interval: .seconds(.infinity), tolerance: .zero, options: .modes([privateMode])) {
            ran.value.append("repeat")
        }
        XCTAssertTrue(loop.run(mode: privateMode, timeout: .seconds(60)) { ran.value.last == "repeat" })
        XCTAssertFalse(loop.run(mode: privateMode, timeout: .milliseconds(50)) { ran.value.count > 2 })
        once.cancel()
        // The never-due one-shot timer stays in this test's mode: a one-shot schedule cannot be
        // cancelled (Combine's API returns nothing), as with Foundation's RunLoop scheduler.
    }

    func testTimerPublisherSubscriberThatCancelsItselfInsideReceive() {
        let publisher = RunLoopTimer.publish(every: 0.005, on: .main, in: privateMode)
        let first = Locked(0)
        let second = Locked(0)
        let own = Locked<AnyCancellable?>(nil)
        own.value = publisher.sink { _ in
            first.value += 1
            own.value?.cancel()
        }
        let other = publisher.sink { _ in second.value += 1 }
        let connection = publisher.connect()
        XCTAssertTrue(RunLoop.main.run(mode: privateMode, timeout: .seconds(60)) { second.value >= 3 })
        XCTAssertEqual(first.value, 1)
        connection.cancel()
        other.cancel()
        XCTAssertNil(RunLoop.main.nextTimerFireDate(forMode: privateMode))
    }

    func testTimerPublisherDroppedWhileConnectedStopsItsTimer() {
        weak var weakPublisher: RunLoop.TimerPublisher?
        do {
            let publisher = RunLoopTimer.publish(every: 0.01, on: .main, in: privateMode)
            weakPublisher = publisher
            _ = publisher.connect()  // the connection is dropped too, without a cancel
            XCTAssertNotNil(RunLoop.main.nextTimerFireDate(forMode: privateMode))
        }
        XCTAssertNil(weakPublisher)
        XCTAssertNil(RunLoop.main.nextTimerFireDate(forMode: privateMode))
    }

    func testTimerPublisherTicksOnALoopThreadOfItsOwn() async {
        await withLoopThread { loop in
            let publisher = RunLoopTimer.publish(every: 0.002, tolerance: 0.001, on: loop, in: .default)
            let dates = Locked([Date]())
            let sink = publisher.autoconnect().sink { date in
                precondition(RunLoop.current === loop)
                dates.value.append(date)
            }
            XCTAssertTrue(loop.run(timeout: .seconds(60)) { dates.value.count == 5 })
            sink.cancel()
            XCTAssertNil(loop.nextTimerFireDate(forMode: .default))
            XCTAssertEqual(dates.value, dates.value.sorted())
        }
    }

    // MARK: A loop whose thread has exited

    /// A loop whose thread has exited (its PermanentThread stopped and joined).
    private func deadLoop() -> RunLoop {
        let thread = PermanentThread(name: "combine-dead")
        let loop = thread.loop
        thread.stop()
        return loop
    }

    /// `receive(on:)` and `delay` on a dead loop deliver and complete (at once, with a warning),
    /// instead of hanging with one log line.
    func testReceiveOnAndDelayOnADeadLoopComplete() {
        let loop = deadLoop()
        let values = Locked([Int]())
        let finished = Locked(0)
        let received = Just(1).receive(on: loop).sink(
            receiveCompletion: { _ in finished.value += 1 }, receiveValue: { values.value.append($0) })
        let delayed = Just(2).delay(for: .seconds(3600), scheduler: loop).sink(
            receiveCompletion: { _ in finished.value += 1 }, receiveValue: { values.value.append($0) })
        XCTAssertEqual(values.value, [1, 2])
        XCTAssertEqual(finished.value, 2)
        received.cancel()
        delayed.cancel()
    }

    /// A timer publisher connected on a dead loop finishes its subscribers; so does one whose
    /// loop's thread exits while it is connected.
    func testTimerPublisherOnADeadLoopFinishes() {
        let finished = Locked(0)
        let early = RunLoopTimer.publish(every: 0.01, on: deadLoop(), in: .default).autoconnect()
            .sink(receiveCompletion: { _ in finished.value += 1 }, receiveValue: { _ in })
        XCTAssertEqual(finished.value, 1)

        let thread = PermanentThread(name: "combine-dying")
        let ticks = Locked(0)
        let late = RunLoopTimer.publish(every: 0.002, on: thread.loop, in: .default).autoconnect()
            .sink(receiveCompletion: { _ in finished.value += 1 }, receiveValue: { _ in ticks.value += 1 })
        let deadline = ContinuousClock.now + .seconds(60)
        while ticks.value < 3 && ContinuousClock.now < deadline { usleep(1_000) }
        XCTAssertGreaterThanOrEqual(ticks.value, 3)
        thread.stop()  // joins: the loop's teardown let go of the timer
        XCTAssertEqual(finished.value, 2)
        early.cancel()
        late.cancel()
    }

    /// Cancelling a connection does not finish the subscribers (Combine's rule), dead loop or not.
    func testCancellingAConnectionDoesNotFinish() {
        let finished = Locked(0)
        let publisher = RunLoopTimer.publish(every: 0.01, on: RunLoop.main, in: privateMode)
        let sink = publisher.sink(receiveCompletion: { _ in finished.value += 1 }, receiveValue: { _ in })
        let connection = publisher.connect()
        connection.cancel()
        XCTAssertEqual(finished.value, 0)
        sink.cancel()
    }
}

/// A subject handed to the sending thread.
///
/// `@unchecked Sendable`: OpenCombine's `PassthroughSubject` serializes `send` with its own lock.
private struct SubjectBox: @unchecked Sendable {
    let subject: PassthroughSubject<Int, Never>
    init(_ subject: PassthroughSubject<Int, Never>) { self.subject = subject }
}
#endif
