import Foundation
import SharedTestSupport
import Testing

/// The lab's seed experiments 14-21 and `list`, run as a user runs them (`runloop-lab tour --only
/// N`): each must show what its seed says. Real clocks: the checks are on what happened, with
/// room (a GCD timer's 300 ms of tracking is asserted to give at least one fire, not six).
@Suite("Lab experiments")
struct LabExperimentTests {
    private func tour(_ number: Int) throws -> String {
        let run = try runProbe("runloop-lab", ["tour", "--only", "\(number)"], timeout: .seconds(60))
        #expect(run.status == 0, "tour --only \(number): \(run.stderr)")
        return run.stdout
    }

    @Test func listNamesTheSeedOfEveryExperiment() throws {
        let list = try runProbe("runloop-lab", ["list"])
        let entries = list.stdout.split(separator: "\n").filter { $0.first?.isNumber == true }
        #expect(entries.count == 24)
        // Each names its seed article(s) by file name, e.g. `(seed 004_a8b090316d53f601.txt)`.
        #expect(entries.allSatisfy { $0.contains("(seed") && $0.contains(".txt") })
        #expect(list.stdout.components(separatedBy: "   The seed: ").count - 1 == 24)
    }

    /// Experiment 24 needs GTK 4 (traits GLib and GTK): without them it says how to run it.
    @Test func theGTKExperimentSaysHowToRunItWithoutItsTraits() throws {
        let out = try tour(24)
        #if GTK
        #expect(out.contains("vadjustment") || out.contains("Xvfb"))
        #else
        #expect(out.contains("swift run --traits GLib,GTK runloop-lab tour --only 24"))
        #expect(out.contains("apt-get install libglib2.0-dev libgtk-4-dev"))
        #endif
    }

    @Test func gcdTimerFiresWhileTrackingAndTheDefaultLoopTimerDoesNot() throws {
        let out = try tour(14)
        let summary = try #require(
            out.firstMatch(of: #/GCD timer (\d+) / (\d+) / (\d+) fires, RunLoopTimer \(.default\) (\d+) / (\d+) / (\d+)/#))
        #expect(Int(summary.output.2)! >= 1)  // GCD, during tracking
        #expect(Int(summary.output.5)! == 0)  // the .default loop timer, during tracking
        #expect(Int(summary.output.6)! >= 1)  // ...and after it
    }

    /// Experiment 22: frames during a 300 ms nested tracking run, per main-actor executor. Bound:
    /// a 20 ms animation makes about 15 frames in 300 ms; 3 leaves room for a loaded machine.
    @Test func aMainActorAnimationMovesDuringTrackingEnteredFromTheLoop() throws {
        let out = try tour(22)
        let frames = out.matches(of: #/frames: (\d+) before tracking, (\d+) during/#).map { Int($0.output.2)! }
        #expect(frames.count == 4, "\(out)")
        guard frames.count == 4 else { return }
        #expect(frames[0] == 0)  // Foundation: .tracking is not common
        #expect(frames[1] >= 3)  // the main queue on RunLoop.main, tracking entered from a timer
        #expect(frames[2] >= 3)  // RunLoop.main as the main actor's executor, the same
        #expect(frames[3] == 0)  // tracking entered from a main-actor job: the executor never re-enters
    }

    /// Experiment 23: with the trait SwiftNIO, the monitor names the blocking handler beside the
    /// heartbeat's lateness; without it, the lab says how to get it.
    @Test func aBlockedNIOEventLoopIsNamedByTheMonitorOnly() throws {
        let out = try tour(23)
        #if SwiftNIO
        #expect(out.contains("GET /block/sleep"), "\(out)")
        #expect(out.contains("stuck in handleSleep()"), "\(out)")
        #expect(out.contains("phase tick"))
        #expect(out.contains("heartbeat") && out.contains("ms late"), "\(out)")
        #else
        #expect(out.contains("This experiment needs SwiftNIO"), "\(out)")
        #endif
    }

    @Test func performAfterNeedsTheLoopToRun() throws {
        let out = try tour(15)
        #expect(out.contains("summary: without a run the block never ran; with a run it ran"))
        // Seed 004 says performSelector:onThread: makes a timer; it does not.
        #expect(out.contains("perform on a thread added no timer and ran"))
    }

    @Test func eachTouchGoesFromThePortsSource1ToTheSource0() throws {
        let out = try tour(16)
        #expect(out.contains("summary: 6 pipeline callouts for 3 touches"))
        let callouts = out.split(separator: "\n").filter { $0.contains("sources1 ") || $0.contains("sources0 ") }
        #expect(callouts.count == 6)
        for (index, line) in callouts.enumerated() {
            #expect(line.contains(index % 2 == 0 ? "sources1  __IOHIDEventSystemClientQueueCallback" : "sources0  __handleEventQueue"))
        }
    }

    @Test func theMainLoopsDescriptionNamesItsItemsInEveryCommonMode() throws {
        let out = try tour(17)
        #expect(out.contains("common modes = { kCFRunLoopDefaultMode, UITrackingRunLoopMode }"))
        #expect(out.components(separatedBy: "\"_beforeCACommitHandler\", order 1999000").count - 1 == 2)
        #expect(out.components(separatedBy: "\"performSelector:afterDelay: 3 s\"").count - 1 == 1)
    }

    @Test func theCrashGuardFlushesThePendingLineAndTheChildStillDies() throws {
        let out = try tour(18)
        let parts = out.components(separatedBy: "with the guard")
        try #require(parts.count == 2)
        #expect(!parts[0].contains("flush: payment request sent"))
        #expect(parts[0].contains("killed by signal 11 (SIGSEGV)"))
        #expect(parts[1].contains("flush: payment request sent"))
        #expect(parts[1].contains("grace period over; default action restored, signal re-raised"))
        #expect(parts[1].contains("killed by signal 11 (SIGSEGV)"))
    }

    @Test func wakeUpFromAnotherThreadEndsASleepWithReasonWakeUp() throws {
        let out = try tour(19)
        let summary = try #require(out.firstMatch(of: #/summary: (\d+) sleeps ended by \.wakeUp, (\d+) by \.timer; the run returned \.(\w+)/#))
        #expect(Int(summary.output.1)! == 3)  // two bare wakeUp() calls, and the one after signal()
        #expect(Int(summary.output.2)! == 1)
        #expect(summary.output.3 == "handledSource")
    }

    @Test func aBackgroundTimerTicksWhileTheMainLoopTracksAndItsUIUpdatesWaitInAPrivateMode() throws {
        let out = try tour(20)
        let summary = try #require(
            out.firstMatch(
                of: #/ticks (\d+) / (\d+) / (\d+) / (\d+), UI updates (\d+) / (\d+) / (\d+) / (\d+), GCD calls (\d+) / (\d+) / (\d+) / (\d+)/#))
        let o = summary.output
        #expect(Int(o.2)! >= 1 && Int(o.3)! >= 1)  // the background timer ticks while tracking and in the private mode
        #expect(Int(o.6)! >= 1)  // UI updates are applied while tracking (.tracking is common)
        #expect(Int(o.7)! == 0)  // ...not in the private mode
        #expect(Int(o.8)! >= Int(o.3)!)  // ...whose held updates the next .default run applies
        #expect(Int(o.10)! >= 1)  // the main-queue GCD timer fires while tracking
        #expect(Int(o.11)! == 0)  // ...and waits in the private mode
        #expect(Int(o.12)! >= 1)
    }

    @Test func theSocketThreadHandsEachEventToTheLoadersSource0() throws {
        let out = try tour(21)
        let summary = try #require(
            out.firstMatch(of: #/summary: (\d+) socket reads on CFSocket.private, (\d+) Source0 performs and (\d+) delegate calls, all on URLConnLoader/#))
        #expect(Int(summary.output.3)! == 4)  // response, two data parts, finish
        #expect(Int(summary.output.2)! >= 1)
        #expect(!out.contains("the finish never arrived"))
    }
}
