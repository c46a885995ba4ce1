@testable import RunLoopMonitor
import Testing

/// The stall detector's transitions, from scripted snapshots at scripted times: no thread, no
/// clock, no stack. Threshold 100 ms, samples every 20 ms (hang after 2 s).
struct StallDetectorTests {
    static let settings = StallDetector.Settings(threshold: .milliseconds(100), sampleInterval: .milliseconds(20))
    /// A fixed origin: the detector only compares and adds instants.
    static let origin = ContinuousClock.Instant.now

    static func at(_ milliseconds: Int) -> ContinuousClock.Instant { origin + .milliseconds(milliseconds) }

    static func busy(_ work: UInt64, step: UInt32 = 1, since: Int? = nil, exact: Bool = false) -> StallSnapshot {
        StallSnapshot(
            activity: .busy, threadID: 42, work: work, step: step, busySince: since.map(at), busySinceIsExact: exact,
            phase: "sources", item: "handler")
    }

    static func idle(since: Int? = nil) -> StallSnapshot {
        StallSnapshot(activity: .idle, threadID: 42, work: 9, idleSince: since.map(at), phase: "waiting", item: "")
    }

    static let exited = StallSnapshot(activity: .busy, threadID: 42, work: 1, step: 1, phase: "sources", item: "handler", threadExited: true)

    /// Looks every 20 ms at work 1 from `from` until a look says `begin`; returns its time.
    static func lookUntilBegin(_ detector: inout StallDetector, from: Int, work: UInt64 = 1) -> Int? {
        var time = from
        while time <= from + 1000 {
            if case .begin = detector.look(busy(work), at: at(time)).next { return time }
            time += 20
        }
        return nil
    }

    /// Begins the stall a look said to begin (its first sample taken, reported) at `began`, then
    /// returns the look that sees `next` at `seenAt`.
    static func beginThenMove(_ detector: inout StallDetector, at began: Int, to next: StallSnapshot, seenAt: Int)
        -> StallDetector.Look
    {
        _ = detector.began(true, reported: true, at: at(began))
        return detector.look(next, at: at(seenAt))
    }

    @Test func busyPastTheThresholdBegins() throws {
        var detector = StallDetector(Self.settings)
        #expect(detector.look(Self.idle(), at: Self.at(0)).next == .idle)
        // Seen busy at 20 ms: timed from the last look that saw it elsewhere (0 ms).
        let first = detector.look(Self.busy(1), at: Self.at(20))
        #expect(first.newWork)
        #expect(first.next == .wait(until: Self.at(100)))
        #expect(detector.look(Self.busy(1), at: Self.at(60)).next == .wait(until: Self.at(100)))
        #expect(detector.look(Self.busy(1), at: Self.at(100)) == StallDetector.Look(next: .begin(busySince: Self.at(0))))
        #expect(detector.began(true, reported: true, at: Self.at(100)) == Self.at(120))
        #expect(detector.stall?.reported == true)
    }

    @Test func samplesFollowTheInterval() {
        var detector = StallDetector(Self.settings)
        _ = detector.look(Self.idle(), at: Self.at(0))
        let begin = Self.lookUntilBegin(&detector, from: 20)
        #expect(begin == 100)
        _ = detector.began(true, reported: true, at: Self.at(100))
        #expect(detector.look(Self.busy(1), at: Self.at(110)).next == .wait(until: Self.at(120)))
        #expect(detector.look(Self.busy(1), at: Self.at(120)).next == .sample)
        let sampled = detector.sampled(true, at: Self.at(120))
        #expect(sampled.ended == nil && !sampled.reportHang && sampled.next == Self.at(140))
        // A late look: the next sample is one interval on from now, not a burst to catch up.
        #expect(detector.look(Self.busy(1), at: Self.at(300)).next == .sample)
        #expect(detector.sampled(true, at: Self.at(300)).next == Self.at(300))
    }

    @Test func movingOnEndsTheStallWhenTheLoopStampedIt() {
        var detector = StallDetector(Self.settings)
        _ = detector.look(Self.idle(), at: Self.at(0))
        _ = Self.lookUntilBegin(&detector, from: 20)
        _ = detector.began(true, reported: true, at: Self.at(100))
        // Idle since 230 ms, seen at 240: ended at 230, as stamped.
        let look = detector.look(Self.idle(since: 230), at: Self.at(240))
        #expect(look.ended?.reason == .movedOn && look.ended?.at == Self.at(230))
        #expect(look.next == .idle && detector.stall == nil && detector.candidate == nil)
    }

    @Test func anotherCalloutOfTheSamePassIsAnotherPieceOfWork() {
        var detector = StallDetector(Self.settings)
        _ = detector.look(Self.idle(), at: Self.at(0))
        _ = Self.lookUntilBegin(&detector, from: 20)
        _ = detector.began(true, reported: true, at: Self.at(100))
        // The same pass, its next callout, in a busy stretch stamped 150 ms (the pass slept and
        // woke since): the stall ended then, and the new work began after it.
        let look = detector.look(Self.busy(1, step: 2, since: 150), at: Self.at(160))
        #expect(look.ended?.reason == .movedOn && look.ended?.at == Self.at(150))
        #expect(look.newWork && look.next == .wait(until: Self.at(250)))
    }

    /// A later callout of a pass in the stretch the last look saw: timed from that look (the
    /// stretch's stamp is older), and its end is not taken from that stamp either.
    @Test func aLaterCalloutOfTheSameStretchIsTimedFromTheLastLook() {
        var detector = StallDetector(Self.settings)
        _ = detector.look(Self.idle(), at: Self.at(0))
        _ = detector.look(Self.busy(1, step: 1, since: 5), at: Self.at(20))
        let second = detector.look(Self.busy(1, step: 2, since: 5), at: Self.at(40))
        #expect(second.newWork && second.next == .wait(until: Self.at(120)))
        #expect(detector.look(Self.busy(1, step: 2, since: 5), at: Self.at(120)).next == .begin(busySince: Self.at(20)))
        let moved = Self.beginThenMove(&detector, at: 120, to: Self.busy(1, step: 3, since: 5), seenAt: 200)
        #expect(moved.ended?.reason == .movedOn && moved.ended?.at == Self.at(200))
    }

    /// A snapshot read across a sleep of the pass (the same generation before and after) pairs
    /// the new callout's key with the old stretch's stamp: the stall starts early (harmless), and
    /// the new stretch's stamp, later than that start but earlier than the look that first saw
    /// the work, is not taken for its end.
    @Test func aStretchBegunBeforeTheStallWasSeenDoesNotEndIt() {
        var detector = StallDetector(Self.settings)
        _ = detector.look(Self.idle(), at: Self.at(0))
        // The callout began in a stretch stamped 12 ms; the snapshot paired it with the stamp of
        // the stretch before the pass slept (5 ms).
        _ = detector.look(Self.busy(1, step: 2, since: 5), at: Self.at(20))
        #expect(detector.look(Self.busy(1, step: 2, since: 12), at: Self.at(120)).next == .begin(busySince: Self.at(5)))
        let moved = Self.beginThenMove(&detector, at: 120, to: Self.busy(1, step: 3, since: 12), seenAt: 200)
        #expect(moved.ended?.reason == .movedOn && moved.ended?.at == Self.at(200))
    }

    /// A look whose thread was preempted between reading the snapshot and reading the clock:
    /// work the snapshot did not show is timed from before the read, so a stall is never shorter
    /// than its work (a 500 ms block was once reported as 494 ms this way).
    @Test func aLookPreemptedAfterItsReadTimesTheNextWorkFromBeforeTheRead() {
        var detector = StallDetector(Self.settings)
        _ = detector.look(Self.idle(), at: Self.at(8), readFrom: Self.at(0))
        #expect(detector.look(Self.busy(1), at: Self.at(20), readFrom: Self.at(19)).next == .wait(until: Self.at(100)))
        #expect(detector.look(Self.busy(1), at: Self.at(100), readFrom: Self.at(99)).next == .begin(busySince: Self.at(0)))
    }

    @Test func anUnstampedMoveEndsAtTheLook() {
        var detector = StallDetector(Self.settings)
        _ = detector.look(Self.idle(), at: Self.at(0))
        _ = Self.lookUntilBegin(&detector, from: 20)
        _ = detector.began(true, reported: true, at: Self.at(100))
        let look = detector.look(Self.idle(), at: Self.at(180))
        #expect(look.ended?.at == Self.at(180))
    }

    @Test func aThreadThatExitsEndsItsStallAndItsSource() {
        var detector = StallDetector(Self.settings)
        _ = detector.look(Self.idle(), at: Self.at(0))
        _ = Self.lookUntilBegin(&detector, from: 20)
        _ = detector.began(true, reported: true, at: Self.at(100))
        let look = detector.look(Self.exited, at: Self.at(130))
        #expect(look.threadExited && look.ended?.reason == .threadExited && look.ended?.at == Self.at(130))
        #expect(detector.stall == nil)
        // A failed sample is the thread gone too.
        var second = StallDetector(Self.settings)
        _ = second.look(Self.idle(), at: Self.at(0))
        _ = Self.lookUntilBegin(&second, from: 20)
        _ = second.began(true, reported: true, at: Self.at(100))
        #expect(second.look(Self.busy(1), at: Self.at(120)).next == .sample)
        let sampled = second.sampled(false, at: Self.at(120))
        #expect(sampled.ended == .threadExited && sampled.next == nil && second.stall == nil)
    }

    @Test func aFirstSampleThatFailsBeginsNoStall() {
        var detector = StallDetector(Self.settings)
        _ = detector.look(Self.idle(), at: Self.at(0))
        _ = Self.lookUntilBegin(&detector, from: 20)
        #expect(detector.began(false, reported: false, at: Self.at(100)) == nil)
        #expect(detector.stall == nil)
    }

    /// The back-off held it back (`suppressed` in the end): a hang is reported after all, once,
    /// at 2 s.
    @Test func aHeldBackStallIsReportedWhenItBecomesAHang() {
        var detector = StallDetector(Self.settings)
        var backoff = StallBackoff(.fibonacci())
        let signature: [UInt64] = [1, 2, 3]
        // The fourth stall of one signature is held back (reported: 1st, 2nd, 3rd, 5th…).
        for n in 0..<3 { _ = backoff.decide(signature, at: Self.at(n)) }
        let decision = backoff.decide(signature, at: Self.at(3))
        #expect(!decision.report)
        _ = detector.look(Self.idle(), at: Self.at(0))
        _ = Self.lookUntilBegin(&detector, from: 20)
        _ = detector.began(true, reported: decision.report, at: Self.at(100))
        var hangs: [Int] = []
        var time = 120
        while time <= 2500 {
            let look = detector.look(Self.busy(1), at: Self.at(time))
            if look.reportHang { hangs.append(time) }
            if look.next == .sample, detector.sampled(true, at: Self.at(time)).reportHang { hangs.append(time) }
            time += 20
        }
        // Busy since 0 ms: a hang at 2000 ms, reported once.
        #expect(hangs == [2000])
        #expect(detector.stall?.reported == true)
    }

    /// Seen busy for the first time already past due (the monitor's round was late): no stall
    /// yet; one begins at the next round that still sees it, timed from the last look.
    @Test func workFirstSeenPastDueWaitsForTheNextRound() {
        var detector = StallDetector(Self.settings)
        _ = detector.look(Self.idle(), at: Self.at(0))
        #expect(detector.look(Self.busy(1), at: Self.at(150)).next == .waitForRound)
        #expect(detector.look(Self.busy(1), at: Self.at(170)).next == .begin(busySince: Self.at(0)))
    }

    /// A source that knows when its work began (a heartbeat's send time) is timed from it, and a
    /// stall may begin at the first look that sees it.
    @Test func anExactStampTimesTheWork() {
        var detector = StallDetector(Self.settings)
        _ = detector.look(Self.idle(), at: Self.at(0))
        #expect(detector.look(Self.busy(1, since: 30, exact: true), at: Self.at(150)).next == .begin(busySince: Self.at(30)))
    }

    /// A later stamp than the last look (a new pass that began after it) times new work.
    @Test func aNewPassIsTimedFromItsStamp() {
        var detector = StallDetector(Self.settings)
        _ = detector.look(Self.idle(), at: Self.at(0))
        #expect(detector.look(Self.busy(1, since: 15), at: Self.at(20)).next == .wait(until: Self.at(115)))
    }

    @Test func aLoopThatIsNotRunningIsNeverStalled() {
        var detector = StallDetector(Self.settings)
        let notRunning = StallSnapshot(activity: .notRunning, threadID: 42, work: 1, phase: "", item: "")
        for time in stride(from: 0, through: 1000, by: 20) {
            #expect(detector.look(notRunning, at: Self.at(time)).next == .idle)
        }
    }
}
