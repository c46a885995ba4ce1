import Foundation
import SharedTestSupport
import Testing

/// The lab's seed experiments 14-18 and `list`, run as a user runs them (`runloop-lab tour --only
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
        #expect(entries.count == 18)
        #expect(entries.allSatisfy { $0.contains("(seed") })
    }

    @Test func gcdTimerFiresWhileTrackingAndTheDefaultLoopTimerDoesNot() throws {
        let out = try tour(14)
        let summary = try #require(
            out.firstMatch(of: #/GCD timer (\d+) / (\d+) / (\d+) fires, RunLoopTimer \(.default\) (\d+) / (\d+) / (\d+)/#))
        #expect(Int(summary.output.2)! >= 1)  // GCD, during tracking
        #expect(Int(summary.output.5)! == 0)  // the .default loop timer, during tracking
        #expect(Int(summary.output.6)! >= 1)  // ...and after it
    }

    @Test func performAfterNeedsTheLoopToRun() throws {
        let out = try tour(15)
        #expect(out.contains("summary: without a run the block never ran; with a run it ran"))
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
}
