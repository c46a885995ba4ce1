import SharedTestSupport
import Testing

@testable import RunLoopKit

// The wake protocol (Sources/RunLoopKit/Core/Loop/WakeProtocol.swift) against other threads, in
// every interleaving up to a preemption bound (InterleavingExplorer.swift).
//
// The model: actor 0 is the loop. It calls the protocol's steps in the order the run algorithm
// does (RunLoop+Run.swift and RunLoop+Wait.swift: beginRun, beginPass, doBlocks, a callout that may run the loop nested,
// wait, stopAccepting, doBlocks, takeStop, endRun). Its sleep is the protocol's own `sleep`, the
// function KernelWait and FutexWait call, with a sleeper whose block is a modeled eventfd that
// blocks the actor. The other actors are wakers: a thread performing blocks (under the inbox's
// lock: push, and for the block that finds the inbox empty `request`; then write the eventfd if
// told to), `wakeUp()`, `stop()`. Each step either actor can see is a choice point; the loop's
// take of the inbox waits while a waker holds the inbox's lock, as BlockQueue's exchange does.
//
// The properties, checked when the loop blocks with no one left to wake it (the run's natural end
// once every waker is done) and at the end:
// - no request is pending (a request nobody will act on is a lost wakeup);
// - no block for the running mode is left in the inbox or the loop's own queue;
// - no stop of the running run is left;
// - a `wakeUp()` the loop accepted ended a wait (or a poll) after it began, as CFRunLoopWakeUp does;
// - a run never makes more than a few passes (no busy loop).

/// The model's shared state.
///
/// `@unchecked Sendable` is safe because only the actor holding the explorer's baton touches it
/// (see ScheduledExecution): one thread at a time, each after the previous holder's handoff.
fileprivate final class WakeModel: @unchecked Sendable {
    enum Mode { case outer, inner }

    let wake: WakeProtocol
    let explorer: ScheduledExecution
    var eventfd = 0
    var loopBlocked = false
    var inbox: [Mode] = []
    /// A waker holds the inbox's lock (BlockQueue's spin lock); the loop waits to take the inbox.
    var inboxLocked = false
    var loopWaitsForInbox = false
    var confined: [Mode] = []
    var blocksTakenByNestedRun = false
    var nextRunID: UInt64 = 0
    /// Trace positions where a wait or poll ended because of a request (or did not sleep).
    var waitEnds: [Int] = []
    /// Trace positions where a kept `wakeUp()` began.
    var keptWakeUps: [Int] = []
    var runResults: [String] = []
    static let passLimit = 6

    init(_ explorer: ScheduledExecution, omitting line: WakeProtocol.Line?) {
        self.explorer = explorer
        self.wake = WakeProtocol(explorer: explorer, omitting: line)
    }

    var now: Int { explorer.trace.count }

    // MARK: The loop (actor 0)

    /// One run: `nested`, if given, is a callout of the first pass that runs the loop again.
    @discardableResult
    func run(_ mode: Mode, poll: Bool, nested: ((WakeModel) -> Void)? = nil) -> String {
        nextRunID += 1
        let id = nextRunID
        let entry = wake.beginRun(id)
        var result = "finished"
        var passes = 0
        while true {
            passes += 1
            let ignored = wake.beginPass()
            doBlocks(mode)
            if passes == 1, let nested { nested(self) }
            if poll {
                if wake.takeRequest() { waitEnds.append(now) }
            } else if !sleep(id, mode, ignored) {
                result = "timed out"
                break
            }
            wake.stopAccepting()
            doBlocks(mode)
            if wake.takeStop(id) {
                result = "stopped"
                break
            }
            if poll {
                result = "timed out"
                break
            }
            if passes >= Self.passLimit {
                explorer.fail("a run made \(passes) passes without sleeping for good: a busy loop")
                break
            }
        }
        if entry.outerRun != 0 && !confined.isEmpty { blocksTakenByNestedRun = true }
        wake.endRun(id, entry)
        runResults.append(result)
        return result
    }

    /// The wait of a pass that may sleep; false when it slept with nothing left to wake it. The
    /// sleep itself is the protocol's own `sleep`, the function the loop's waits call, with a
    /// sleeper that blocks on the modeled eventfd.
    private func sleep(_ id: UInt64, _ mode: Mode, _ ignored: Bool) -> Bool {
        var sleeper = Sleeper(model: self, id: id, mode: mode, ignored: ignored)
        var context: Void = ()
        switch wake.sleep(&sleeper, &context) {
        case .skipped:
            waitEnds.append(now)
            return true
        case .didNotBlock:
            explorer.fail("the model's sleeper always blocks")
            return false
        case .woke(let end):
            guard end.wokenByEventfd else {
                checkNothingIsLost(id, mode)
                return false
            }
            _ = wake.takeRequest()
            waitEnds.append(now)
            return true
        }
    }

    /// The model's side of a sleep: no timers (always blocks), the eventfd as the only way out.
    private struct Sleeper: WakeSleeper {
        let model: WakeModel
        let id: UInt64
        let mode: Mode
        let ignored: Bool

        func handedOverWork(_ context: Void) -> Bool { model.handedOver(id, mode, ignored) }
        mutating func plansToBlock(_ context: inout Void) -> Bool { true }
        /// Woken: the eventfd was written; not woken: blocked with no one left to wake it.
        mutating func block(_ context: inout Void) -> SleepEnd {
            SleepEnd(wokenByEventfd: model.kernelWait(), foundOtherWork: false)
        }
    }

    /// `epoll_wait` on the eventfd: returns at once if it was written, else blocks until it is.
    fileprivate func kernelWait() -> Bool {
        explorer.step("loop: epoll_wait")
        if eventfd > 0 {
            eventfd = 0
            return true
        }
        loopBlocked = true
        let woken = explorer.block()
        loopBlocked = false
        eventfd = 0
        return woken
    }

    /// `handedOverWorkPending` (RunLoop+Wait.swift), for the model's work: blocks only.
    fileprivate func handedOver(_ id: UInt64, _ mode: Mode, _ ignored: Bool) -> Bool {
        if blocksTakenByNestedRun {
            blocksTakenByNestedRun = false
            if confined.contains(mode) { return true }
        }
        explorer.step("loop: inbox.hasReady")
        if !inbox.isEmpty { return true }
        // The model's modes always have an item (a port keeps them alive): `ignored && hasNoWork`
        // is never true.
        return wake.stopPending(id)
    }

    /// Takes the inbox; runs the blocks for `mode`, keeps the others, in order.
    private func doBlocks(_ mode: Mode) {
        explorer.step("loop: take the inbox")
        while inboxLocked {
            loopWaitsForInbox = true
            _ = explorer.block()
        }
        confined += inbox
        inbox = []
        confined.removeAll { $0 == mode }
    }

    private func checkNothingIsLost(_ id: UInt64, _ mode: Mode) {
        if wake.hasRequest {
            explorer.fail("lost wakeup: the loop sleeps for good with a request pending")
        }
        if inbox.contains(mode) || confined.contains(mode) {
            explorer.fail("a block performed for the running mode is never run (the loop sleeps for good)")
        }
        if wake.stopRequest.load(ordering: .relaxed) == id {
            explorer.fail("a stop of the running run is never taken (the loop sleeps for good)")
        }
        for start in keptWakeUps where !waitEnds.contains(where: { $0 > start }) {
            explorer.fail("a wakeUp() the loop accepted (step \(start)) ended no wait: the loop sleeps for good")
        }
    }

    // MARK: Wakers

    /// `perform(inModes:)` from another thread (RunLoop.enqueue): under the inbox's lock, push,
    /// and ask for the wakeup if the inbox was empty; then wake the sleeping loop.
    func performBlock(_ mode: Mode) {
        explorer.step("waker: lock the inbox, push a block")
        inboxLocked = true
        let first = inbox.isEmpty
        inbox.append(mode)
        let mustSignal = first && wake.request()
        explorer.step("waker: unlock the inbox")
        inboxLocked = false
        if loopWaitsForInbox {
            loopWaitsForInbox = false
            explorer.unblock(0)
        }
        if mustSignal { writeEventfd() }
    }

    /// `wakeUp()`.
    func wakeUp() {
        let start = now
        let (mustSignal, kept) = wake.requestByUser()
        if kept { keptWakeUps.append(start) }
        if mustSignal { writeEventfd() }
    }

    /// `stop()`.
    func stop() {
        guard wake.requestStop() else { return }
        wakeUp()
    }

    private func writeEventfd() {
        explorer.step("waker: write the eventfd")
        eventfd += 1
        if loopBlocked { explorer.unblock(0) }
    }
}

// Serialized, and each exploration on a thread of its own (TestThreads.run): thousands of thread
// handoffs must not hold the concurrency pool's threads, which other suites' tasks need.
@Suite(.serialized) struct WakeProtocolExplorerTests {
    /// CHESS's observation: most concurrency bugs need two or three preemptions. Two-actor
    /// scenarios are explored with three (about 500-2,000 interleavings each), the three-actor one
    /// with two (about 4,700; with three it would be 64,500, 25 s).

    /// A scenario: the loop's part and the other threads' parts.
    fileprivate struct Scenario: CustomStringConvertible, Sendable {
        let description: String
        let bound: Int
        let loop: @Sendable (WakeModel) -> Void
        let others: [@Sendable (WakeModel) -> Void]

        init(description: String, loop: @escaping @Sendable (WakeModel) -> Void, others: [@Sendable (WakeModel) -> Void], bound: Int = 3) {
            self.description = description
            self.loop = loop
            self.others = others
            self.bound = bound
        }
    }

    fileprivate static let scenarios: [Scenario] = [
        Scenario(
            description: "two blocks from another thread",
            loop: { $0.run(.outer, poll: false) },
            others: [{ $0.performBlock(.outer); $0.performBlock(.outer) }]),
        Scenario(
            description: "a wakeUp() from another thread",
            loop: { $0.run(.outer, poll: false) },
            others: [{ $0.wakeUp() }]),
        Scenario(
            description: "a block while a callout runs the loop nested in another mode",
            loop: { $0.run(.outer, poll: false, nested: { $0.run(.inner, poll: true) }) },
            others: [{ $0.performBlock(.outer) }]),
        Scenario(
            description: "a stop() from another thread",
            loop: { $0.run(.outer, poll: false) },
            others: [{ $0.stop() }]),
        Scenario(
            description: "a block, a wakeUp() and a nested run",
            loop: { $0.run(.outer, poll: false, nested: { $0.run(.inner, poll: true) }) },
            others: [{ $0.performBlock(.outer) }, { $0.wakeUp() }], bound: 2),
        // The second block finds the first waiting and asks for nothing: the nested run may drop
        // the first one's request, and the enclosing run must still find both.
        Scenario(
            description: "two blocks while a callout runs the loop nested in another mode",
            loop: { $0.run(.outer, poll: false, nested: { $0.run(.inner, poll: true) }) },
            others: [{ $0.performBlock(.outer); $0.performBlock(.outer) }]),
    ]

    fileprivate static func explore(_ scenario: Scenario, omitting line: WakeProtocol.Line? = nil) async
        -> InterleavingExplorer.Outcome?
    {
        await TestThreads.run(name: "rlk-explorer", timeout: .seconds(600)) { exploreHere(scenario, omitting: line) }
    }

    fileprivate static func exploreHere(_ scenario: Scenario, omitting line: WakeProtocol.Line?)
        -> InterleavingExplorer.Outcome
    {
        InterleavingExplorer(preemptionBound: scenario.bound).explore { execution in
            let model = WakeModel(execution, omitting: line)
            let loop: @Sendable (ScheduledExecution) -> Void = { _ in scenario.loop(model) }
            return [loop] + scenario.others.map { part -> @Sendable (ScheduledExecution) -> Void in { _ in part(model) } }
        }
    }

    /// Every interleaving of every scenario, up to the bound, keeps every property.
    @Test(arguments: scenarios)
    fileprivate func noInterleavingLosesAWakeup(_ scenario: Scenario) async {
        guard let outcome = await Self.explore(scenario) else { return }
        print("wake protocol, \(scenario): \(outcome.executions) interleavings explored (preemption bound \(scenario.bound))")
        #expect(outcome.executions > 1)
        if let failure = outcome.failure {
            Issue.record(Comment(rawValue: failure.message + "\n" + failure.trace.joined(separator: "\n")))
        }
    }

    /// Each of the protocol's key lines, left out, lets the explorer find a broken property: the
    /// tests above would catch its removal.
    @Test(arguments: [
        (WakeProtocol.Line.takeRequestAfterAnnouncing, 1),
        (.staleOnlyWithoutRequest, 0),
        (.keepUserRequest, 1),
        (.lookForHandedOverWork, 2),
    ])
    func removingALineIsCaught(_ line: WakeProtocol.Line, scenarioIndex: Int) async {
        let scenario = Self.scenarios[scenarioIndex]
        guard let outcome = await Self.explore(scenario, omitting: line) else { return }
        let failure = outcome.failure
        #expect(failure != nil, "without \(line), \(scenario) kept every property in \(outcome.executions) interleavings")
        if let failure {
            print("wake protocol without \(line), \(scenario): interleaving \(outcome.executions) breaks it: \(failure.message)")
            print("  " + failure.trace.suffix(14).joined(separator: "\n  "))
        }
    }
}
