import CRunLoopKit
import Glibc
import SharedTestSupport
import Synchronization
import Testing

import class RunLoopKit.RunLoop

@testable import RunLoopKit

// MessagePort (issue 4): typed messages from any thread to a loop — all delivered, in order per
// sender, none lost (under contention, backpressure and invalidation races), only in the port's
// modes, and refusals that hand the message back.
//
// Waits are on events (monitors the handlers update), each bounded; real-time bounds are lower
// bounds or generous upper bounds, explained where used.

/// A message that says who sent it and its place in that sender's sequence.
struct Stamp: Sendable, Equatable, CustomStringConvertible {
    let sender: Int
    let sequence: Int
    var description: String { "\(sender).\(sequence)" }
}

/// A loop on its own thread that runs `.default` (kept non-empty by a never-signalled source)
/// until ``shutdown()``.
final class PortLoop: Sendable {
    let host: TestThread
    private let done: PortLoopFlag

    var loop: RunLoop { host.loop }

    private init(host: TestThread, done: PortLoopFlag) {
        self.host = host
        self.done = done
    }

    /// Starts the loop thread; `setup` runs on it before it runs. Nil (with an issue) on failure.
    static func start(
        name: String, sourceLocation: SourceLocation = #_sourceLocation,
        setup: @escaping @Sendable (RunLoop) -> Void = { _ in }
    ) -> PortLoop? {
        let done = PortLoopFlag()
        guard
            let host = TestThread.hostingLoop(
                name: name, sourceLocation: sourceLocation,
                setup: { loop in
                    loop.add(RunLoopSource {}, forMode: .default)
                    setup(loop)
                },
                run: { loop in
                    while !done.value.load(ordering: .acquiring) { loop.run(mode: .default, for: .seconds(30)) }
                })
        else { return nil }
        return PortLoop(host: host, done: done)
    }

    /// Runs `body` on the loop thread, inside the running loop, and waits (bounded) for it.
    @discardableResult
    func sync(timeout: Duration = .seconds(30), _ body: @escaping @Sendable () -> Void = {}) -> Bool {
        let ran = TestEvent()
        loop.perform {
            body()
            ran.fire()
        }
        return ran.wait(timeout: timeout)
    }

    /// Stops the loop from inside (so the stop cannot be dropped) and joins its thread.
    func shutdown() async -> Bool {
        let done = self.done
        loop.perform {
            done.value.store(true, ordering: .releasing)
            RunLoop.current.stop()
        }
        return await host.joinAsync(timeout: .seconds(30))
    }
}

final class PortLoopFlag: Sendable {
    let value = Atomic<Bool>(false)
}

@Suite(.serialized) struct MessagePortTests {
    /// Messages per sender in the contention test: the full count under ThreadSanitizer too
    /// (it takes about 8 s there, against 1 to 20 s unsanitized depending on the load).
    static let perSender = 250_000

    // MARK: Contention

    /// 4 threads × 250,000 messages to one port on a loop thread: every message is delivered,
    /// exactly once, on the loop's thread, in each sender's order; no send is refused.
    @Test func fourSendersDeliverEveryMessageInPerSenderOrder() async {
        let senders = 4
        let perSender = Self.perSender
        let total = senders * perSender

        // Touched only by the handler, on the loop thread; read after the loop thread is joined
        // (the join orders those reads after every write).
        final class Tally: @unchecked Sendable {
            var next: [Int]
            var outOfOrder = 0
            var offThread = 0
            var delivered = 0
            var firstDisorder: String?
            init(_ senders: Int) { next = Array(repeating: 0, count: senders) }
        }
        let tally = Tally(senders)
        let allDelivered = TestEvent()
        let threadID = Atomic<UInt>(0)
        let port = MessagePort<Stamp> { stamp in
            if UInt(pthread_self()) != threadID.load(ordering: .relaxed) { tally.offThread += 1 }
            if tally.next[stamp.sender] == stamp.sequence {
                tally.next[stamp.sender] += 1
            } else {
                tally.outOfOrder += 1
                if tally.firstDisorder == nil {
                    tally.firstDisorder = "got \(stamp), expected \(stamp.sender).\(tally.next[stamp.sender])"
                }
            }
            tally.delivered += 1
            if tally.delivered == total { allDelivered.fire() }
        }
        guard
            let host = PortLoop.start(
                name: "rlk-port-loop",
                setup: { loop in
                    threadID.store(UInt(pthread_self()), ordering: .relaxed)
                    loop.add(port, forMode: .default)
                })
        else { return }

        let refused = Atomic<Int>(0)
        let go = TestEvent()
        let start = ContinuousClock.now
        let threads = (0..<senders).map { sender in
            TestThread(name: "rlk-sender-\(sender)") {
                guard go.wait(timeout: .seconds(30)) else { return }
                for sequence in 0..<perSender {
                    do { try port.send(Stamp(sender: sender, sequence: sequence)) } catch {
                        refused.add(1, ordering: .relaxed)
                    }
                }
            }
        }
        go.fire()
        var joined = true
        for thread in threads { joined = await thread.joinAsync(timeout: .seconds(300)) && joined }
        // 1,000,000 messages take well under 10 s here; 300 s is room for a loaded or sanitized run.
        let delivered = await allDelivered.waitAsync(timeout: .seconds(300)) { $0 }
        let elapsed = secondsSince(start)
        let exited = await host.shutdown()

        #expect(joined, "the senders finished")
        #expect(delivered, "all \(total) messages were delivered (\(exited ? "\(tally.delivered)" : "?") were)")
        #expect(exited, "the loop thread finished")
        guard exited else { return }
        #expect(refused.load(ordering: .relaxed) == 0, "an unbounded port refuses nothing")
        #expect(tally.delivered == total, "each message delivered exactly once")
        #expect(tally.next == Array(repeating: perSender, count: senders), "every sender's last message arrived")
        #expect(tally.outOfOrder == 0, "per-sender order: \(tally.firstDisorder ?? "")")
        #expect(tally.offThread == 0, "the handler runs on the loop's thread")
        #expect(port.queuedCount == 0)
        port.invalidate()
        print(
            "MessagePort: \(total) messages from \(senders) threads in \(elapsed) s (\(Int(Double(total) / elapsed)) /s)"
        )
    }

    /// No lost wakeup: one sender sends rounds of 200,000 messages as fast as it can to a loop
    /// that runs with an hour-long timeout (so a timeout cannot rescue it); after each round it
    /// waits (bounded, 10 s) until the loop has delivered the round's last message. A loop asleep
    /// with messages queued fails the test (and is then woken so that it can end).
    ///
    /// Disabled: fails with the current implementation. `MessagePort.send` → `source1NeedsAttention`
    /// stores `wake.source1Attention` with `.releasing`, then `requestWakeUp` returns early when its
    /// load of `wakeRequested` reads `true`. That store may become visible after that load
    /// (store→load reordering, the x86 store buffer; allowed by the memory model, as only
    /// sequentially consistent operations order a store before a later load): the loop consumes
    /// the stale request (`discardStaleWakeUp`), reads `wake.source1Attention == false` in `wait`, and
    /// sleeps, while the sender did not signal. Every later send then sees `hasQueued == true` and
    /// does not wake it either: the messages wait for an unrelated wakeup (for ever, here).
    ///
    /// It shows in optimized builds only (a debug build's retains and releases, locked
    /// instructions, drain the store buffer right after the store):
    /// `swift test -c release -Xswiftc -enable-testing --filter aSenderIsNeverLeftWithTheLoopAsleep`
    /// (before the fix) failed 2 of 3 runs ("round 9: 1903914 of 2000000 delivered after
    /// 10 s, loop waiting true, … queued 96086"); with that store `.sequentiallyConsistent` it
    /// passed 5 of 5. A release executable sending 1,000,000 messages stalled in 6 of 60 runs, and
    /// in 0 of 60 with the change.
    @Test func aSenderIsNeverLeftWithTheLoopAsleep() async {
        let rounds = 20
        let perRound = 200_000
        let delivered = TestMonitor<Int>(0)
        let port = MessagePort<Int> { _ in delivered.update { $0 += 1 } }
        let done = PortLoopFlag()
        guard
            let host = TestThread.hostingLoop(
                name: "rlk-port-lost",
                setup: { loop in
                    loop.add(RunLoopSource {}, forMode: .default)
                    loop.add(port, forMode: .default)
                },
                run: { loop in
                    while !done.value.load(ordering: .acquiring) { loop.run(mode: .default, for: .seconds(3600)) }
                })
        else { return }
        let loop = host.loop
        let stalls = await TestThreads.run(name: "rlk-lost-sender", timeout: .seconds(600)) { () -> [String] in
            var stalls: [String] = []
            var sent = 0
            for round in 0..<rounds {
                for _ in 0..<perRound {
                    try? port.send(sent)
                    sent += 1
                }
                let target = sent
                if !delivered.wait(timeout: .seconds(10), until: { $0 >= target }) {
                    stalls.append(
                        "round \(round): \(delivered.read { $0 }) of \(target) delivered after 10 s, loop waiting \(loop.isWaiting), \(port)"
                    )
                    loop.wakeUp()  // rescue, so that the test can end
                    _ = delivered.wait(timeout: .seconds(30), until: { $0 >= target })
                }
            }
            return stalls
        }
        loop.perform {
            done.value.store(true, ordering: .releasing)
            RunLoop.current.stop()
        }
        let exited = await host.joinAsync(timeout: .seconds(30))
        #expect(stalls == [], "lost wakeups")
        #expect(exited)
        port.invalidate()
    }

    // MARK: Capacity and backpressure

    /// A full port refuses with `.full(message)`, handing that message back, and queues nothing;
    /// once the loop has drained it, sends are accepted again. Everything accepted is delivered,
    /// in order; nothing refused is.
    @Test func aFullPortRefusesWithTheMessageAndAcceptsAgainOnceDrained() async {
        struct Outcome: Sendable {
            var accepted: [Int] = []
            var refusals: [String] = []
            var queuedWhenFull = -1
            var drainResults: [RunLoop.RunResult] = []
            var delivered: [Int] = []
            var queuedAtEnd = -1
        }
        let outcome = await TestThreads.run(name: "rlk-port-full") { () -> Outcome in
            let loop = RunLoop.current
            let delivered = Mutex<[Int]>([])
            let port = MessagePort<Int>(capacity: 4) { message in delivered.locked { $0.append(message) } }
            loop.add(port, forMode: .default)
            var outcome = Outcome()
            func send(_ message: Int) {
                do throws(MessagePort<Int>.SendError) {
                    try port.send(message)
                    outcome.accepted.append(message)
                } catch {
                    switch error {
                    case .full(let returned): outcome.refusals.append("full(\(returned))")
                    case .invalidated(let returned): outcome.refusals.append("invalidated(\(returned))")
                    }
                }
            }
            for message in 0..<4 { send(message) }
            send(100)
            send(101)
            outcome.queuedWhenFull = port.queuedCount
            // Drain: each run with returnAfterSourceHandled returns after one handled source.
            // 10 runs at most (4 are needed); each is bounded by 5 s but returns at once.
            while delivered.locked({ $0.count }) < 4 && outcome.drainResults.count < 10 {
                outcome.drainResults.append(loop.run(mode: .default, for: .seconds(5), returnAfterSourceHandled: true))
            }
            send(4)
            send(5)
            while delivered.locked({ $0.count }) < 6 && outcome.drainResults.count < 20 {
                outcome.drainResults.append(loop.run(mode: .default, for: .seconds(5), returnAfterSourceHandled: true))
            }
            outcome.delivered = delivered.locked { $0 }
            outcome.queuedAtEnd = port.queuedCount
            port.invalidate()
            return outcome
        }
        guard let outcome else { return }
        #expect(outcome.accepted == [0, 1, 2, 3, 4, 5])
        #expect(outcome.refusals == ["full(100)", "full(101)"], "refused with the message handed back")
        #expect(outcome.queuedWhenFull == 4, "a refused message is not queued")
        #expect(outcome.drainResults.allSatisfy { $0 == .handledSource }, "\(outcome.drainResults)")
        #expect(outcome.delivered == [0, 1, 2, 3, 4, 5], "accepted messages delivered in order, refused ones never")
        #expect(outcome.queuedAtEnd == 0)
    }

    /// Backpressure across threads: a sender pushes 20,000 messages through a port of capacity 16
    /// and, on each `.full`, waits until the port has room again, then resends the message
    /// the error handed back. The loop's handler holds the first message until the sender has
    /// been refused once, so the port is certainly full at least once. All 20,000 arrive, in
    /// order, once each.
    @Test func aSenderResendsRefusedMessagesAfterTheLoopDrains() async {
        let count = 20_000
        let progress = TestMonitor<Int>(0)  // messages delivered
        let refusedOnce = TestEvent()
        let disorder = Mutex<[String]>([])
        let port = MessagePort<Int>(capacity: 16) { message in
            if message == 0 { _ = refusedOnce.wait(timeout: .seconds(30)) }
            progress.update { delivered in
                if message != delivered, disorder.locked({ $0.count }) < 5 {
                    disorder.locked { $0.append("got \(message), expected \(delivered)") }
                }
                delivered += 1
            }
        }
        guard let host = PortLoop.start(name: "rlk-port-bp", setup: { loop in loop.add(port, forMode: .default) })
        else { return }
        struct SenderReport: Sendable {
            var refusals = 0
            var wrongReturns = 0
            var stalled: String?
        }
        let report = await TestThreads.run(name: "rlk-bp-sender", timeout: .seconds(120)) { () -> SenderReport in
            var report = SenderReport()
            var message = 0
            while message < count {
                do throws(MessagePort<Int>.SendError) {
                    try port.send(message)
                    message += 1
                } catch {
                    guard case .full(let returned) = error else {
                        report.stalled = "refused with \(error)"
                        break
                    }
                    if returned != message { report.wrongReturns += 1 }
                    report.refusals += 1
                    refusedOnce.fire()
                    // Wait until the port has room (the loop takes queued messages out before it
                    // hands them to the handler, whose deliveries update `progress` and so
                    // re-check this), then resend.
                    if !progress.wait(timeout: .seconds(30), until: { _ in port.queuedCount < 16 }) {
                        report.stalled = "no delivery for 30 s with the port full at message \(message)"
                        break
                    }
                }
            }
            return report
        }
        let allDelivered = progress.wait(timeout: .seconds(60)) { $0 == count }
        let exited = await host.shutdown()
        guard let report else { return }
        #expect(report.stalled == nil, "\(report.stalled ?? "")")
        #expect(report.refusals > 0, "the port was full at least once")
        #expect(report.wrongReturns == 0, ".full hands back the message that was refused")
        #expect(allDelivered, "all \(count) delivered (\(progress.read { $0 }))")
        #expect(disorder.locked { $0 } == [], "in order")
        #expect(exited)
        port.invalidate()
    }

    // MARK: Invalidation

    /// Senders race `invalidate()`: every accepted message is either delivered or returned by
    /// `invalidate()`, never both, never neither; per sender, the delivered messages followed
    /// by the returned ones are exactly what it sent, in order. The first refused send is
    /// `.invalidated` with its message. Repeated over several rounds on one loop.
    @Test func invalidateRacingSendersLosesNothing() async {
        let senders = 3
        let rounds = 20
        // A sender sends until refused; the cap only bounds memory if invalidation never came.
        let cap = 2_000_000
        let threshold = 2_000
        guard let host = PortLoop.start(name: "rlk-port-race") else { return }
        var failures: [String] = []
        for round in 0..<rounds {
            let delivered = Mutex<[[Int]]>(Array(repeating: [], count: senders))
            let deliveredCount = Atomic<Int>(0)
            let reachedThreshold = TestEvent()
            let port = MessagePort<Stamp> { stamp in
                delivered.locked { $0[stamp.sender].append(stamp.sequence) }
                if deliveredCount.add(1, ordering: .relaxed).newValue == threshold { reachedThreshold.fire() }
            }
            host.loop.add(port, forMode: .default)
            struct SenderResult: Sendable {
                var accepted = 0
                var refusal: String?
            }
            let results = Mutex<[SenderResult]>(Array(repeating: SenderResult(), count: senders))
            let threads = (0..<senders).map { sender in
                TestThread(name: "rlk-race-\(sender)") {
                    var sequence = 0
                    var refusal: String?
                    while sequence < cap {
                        do throws(MessagePort<Stamp>.SendError) {
                            try port.send(Stamp(sender: sender, sequence: sequence))
                            sequence += 1
                        } catch {
                            switch error {
                            case .invalidated(let returned):
                                refusal =
                                    returned == Stamp(sender: sender, sequence: sequence)
                                    ? "invalidated" : "invalidated(\(returned))"
                            case .full(let returned): refusal = "full(\(returned))"
                            }
                            break
                        }
                    }
                    let accepted = sequence
                    let result = SenderResult(accepted: accepted, refusal: refusal)
                    results.locked { $0[sender] = result }
                }
            }
            let reached = reachedThreshold.wait(timeout: .seconds(60))
            let returned = port.invalidate()
            var joined = true
            for thread in threads { joined = await thread.joinAsync(timeout: .seconds(60)) && joined }
            // A batch the loop took before the invalidation is still delivered: a round trip
            // through the loop (the block runs after the iteration's version-1 sources) ends it.
            let settled = host.sync()
            let sent = results.locked { $0 }
            let got = delivered.locked { $0 }
            if !reached { failures.append("round \(round): \(threshold) deliveries not reached") }
            if !joined || !settled {
                failures.append("round \(round): senders joined \(joined), loop settled \(settled)")
                break
            }
            for sender in 0..<senders {
                let back = returned.filter { $0.sender == sender }.map(\.sequence)
                let expected = Array(0..<sent[sender].accepted)
                if got[sender] + back != expected {
                    failures.append(
                        "round \(round) sender \(sender): accepted \(sent[sender].accepted), delivered \(got[sender].count) (last \(got[sender].last ?? -1)), returned \(back.count) (first \(back.first ?? -1))"
                    )
                }
                if sent[sender].refusal != "invalidated" {
                    failures.append("round \(round) sender \(sender): refusal \(sent[sender].refusal ?? "none")")
                }
            }
            if port.isValid || port.queuedCount != 0 || !port.invalidate().isEmpty {
                failures.append("round \(round): port still valid or holding messages: \(port)")
            }
            if host.loop.contains(port, inMode: .default) {
                failures.append("round \(round): the invalidated port is still in the loop")
            }
        }
        let exited = await host.shutdown()
        #expect(failures == [])
        #expect(exited)
    }

    /// `invalidate()` from inside the handler returns the rest of the batch being delivered and
    /// everything queued; nothing is delivered after it, nothing is lost.
    @Test func invalidateFromTheHandlerReturnsTheRest() async {
        struct Outcome: Sendable {
            var delivered: [Int] = []
            var returned: [Int] = []
            var results: [RunLoop.RunResult] = []
        }
        let outcome = await TestThreads.run(name: "rlk-port-self") { () -> Outcome in
            let loop = RunLoop.current
            let delivered = Mutex<[Int]>([])
            let returned = Mutex<[Int]>([])
            let portBox = Mutex<MessagePort<Int>?>(nil)
            let port = MessagePort<Int> { message in
                delivered.locked { $0.append(message) }
                if message == 3, let port = portBox.locked({ $0 }) {
                    let rest = port.invalidate()
                    returned.locked { $0 = rest }
                }
            }
            portBox.locked { $0 = port }
            loop.add(port, forMode: .default)
            loop.add(RunLoopSource {}, forMode: .default)  // keeps .default non-empty afterwards
            for message in 0..<10 { try? port.send(message) }
            var outcome = Outcome()
            // The whole batch in one pass; then the run sleeps to its 50 ms timeout.
            outcome.results.append(loop.run(mode: .default, for: .milliseconds(50)))
            for message in 10..<12 { try? port.send(message) }  // refused: invalidated
            outcome.results.append(loop.run(mode: .default, for: .milliseconds(20)))
            outcome.delivered = delivered.locked { $0 }
            outcome.returned = returned.locked { $0 }
            portBox.locked { $0 = nil }
            return outcome
        }
        guard let outcome else { return }
        #expect(outcome.delivered == [0, 1, 2, 3])
        #expect(outcome.returned == Array(4..<10))
        #expect(outcome.results == [.timedOut, .timedOut])
    }

    /// Sending to an invalidated port is refused visibly: `.invalidated(message)` with the
    /// message, a description that says so, and nothing queued.
    @Test func sendingToAnInvalidatedPortThrowsInvalidated() {
        let port = MessagePort<String> { _ in }
        try? port.send("kept")
        #expect(port.invalidate() == ["kept"])
        #expect(!port.isValid)
        var caught: MessagePort<String>.SendError?
        do throws(MessagePort<String>.SendError) {
            try port.send("late")
        } catch {
            caught = error
        }
        guard let caught else {
            Issue.record("send to an invalidated port did not throw")
            return
        }
        guard case .invalidated(let returned) = caught else {
            Issue.record("expected .invalidated, got \(caught)")
            return
        }
        #expect(returned == "late")
        #expect(String(describing: caught).contains("invalidated"), "\(caught)")
        #expect(port.queuedCount == 0)
        #expect(port.invalidate() == [], "a second invalidate returns nothing")
    }

    // MARK: Scheduling

    /// Messages sent before the port is added to any loop wait, and are delivered in order once
    /// it is added.
    @Test func messagesSentBeforeTheAddAreDeliveredOnceAdded() async {
        let delivered = Mutex<[Int]>([])
        let port = MessagePort<Int> { message in delivered.locked { $0.append(message) } }
        for message in 1...3 { try? port.send(message) }
        let queuedBeforeAdd = port.queuedCount
        let results = await TestThreads.run(name: "rlk-port-late") { () -> [RunLoop.RunResult] in
            let loop = RunLoop.current
            loop.add(port, forMode: .default)
            var results: [RunLoop.RunResult] = []
            while delivered.locked({ $0.count }) < 3 && results.count < 10 {
                results.append(loop.run(mode: .default, for: .seconds(5), returnAfterSourceHandled: true))
            }
            return results
        }
        #expect(queuedBeforeAdd == 3)
        #expect(results == [.handledSource, .handledSource, .handledSource])
        #expect(delivered.locked { $0 } == [1, 2, 3])
        #expect(port.queuedCount == 0)
        port.invalidate()
    }

    /// A port with waiting messages added (from another thread) to a loop that is asleep wakes
    /// it: the run returns handledSource long before its 10 s timeout (bound: 8 s, room for a
    /// loaded machine; the wakeup itself takes microseconds).
    @Test func addingAPortWithWaitingMessagesWakesASleepingLoop() async {
        let delivered = Mutex<[Int]>([])
        let port = MessagePort<Int> { message in delivered.locked { $0.append(message) } }
        for message in 1...3 { try? port.send(message) }
        struct Outcome: Sendable {
            var first: RunLoop.RunResult = .finished
            var seconds = 0.0
            var rest: [RunLoop.RunResult] = []
        }
        let outcome = Mutex<Outcome?>(nil)
        let keepAlive = RunLoopSource {}
        let thread = TestThread.hostingLoop(
            name: "rlk-port-wake", setup: { $0.add(keepAlive, forMode: .default) }
        ) { loop in
            var result = Outcome()
            let start = ContinuousClock.now
            result.first = loop.run(mode: .default, for: .seconds(10), returnAfterSourceHandled: true)
            result.seconds = secondsSince(start)
            while delivered.locked({ $0.count }) < 3 && result.rest.count < 10 {
                result.rest.append(loop.run(mode: .default, for: .seconds(5), returnAfterSourceHandled: true))
            }
            keepAlive.invalidate()
            outcome.locked { $0 = result }
        }
        guard let thread else { return }
        let loop = thread.loop
        let sawWaiting = waitUntil(timeout: .seconds(10)) { loop.isWaiting }
        loop.add(port, forMode: .default)
        let exited = await thread.joinAsync(timeout: .seconds(30))
        #expect(sawWaiting, "the loop was asleep when the port was added")
        #expect(exited)
        guard let outcome = outcome.locked({ $0 }) else { return }
        #expect(outcome.first == .handledSource)
        #expect(outcome.seconds < 8, "woken by the add, not by the timeout (\(outcome.seconds) s)")
        #expect(delivered.locked { $0 } == [1, 2, 3])
        port.invalidate()
    }

    /// A port is handled only while the loop runs one of its modes: not in .default, not in
    /// another private mode (a send while the loop sleeps there does not wake it: the run sleeps
    /// to its 150 ms timeout, bound ≥ 120 ms), and in its own mode, in order.
    @Test func deliveryOnlyInThePortsModes() async {
        let portMode: RunLoop.Mode = "PortTestsPortMode"
        let otherMode: RunLoop.Mode = "PortTestsOtherMode"
        struct Outcome: Sendable {
            var runs: [String] = []
            var deliveredAfter: [[Int]] = []
            var otherRunSeconds = 0.0
        }
        let delivered = Mutex<[Int]>([])
        let port = MessagePort<Int> { message in delivered.locked { $0.append(message) } }
        let senderGo = TestEvent()
        let outcome = Mutex<Outcome?>(nil)
        let keepDefault = RunLoopSource {}
        let keepOther = RunLoopSource {}
        let thread = TestThread.hostingLoop(
            name: "rlk-port-modes",
            setup: { loop in
                loop.add(keepDefault, forMode: .default)
                loop.add(keepOther, forMode: otherMode)
                loop.add(port, forMode: portMode)
            }
        ) { loop in
            var result = Outcome()
            try? port.send(1)
            result.runs.append(
                "default \(loop.run(mode: .default, for: .milliseconds(50), returnAfterSourceHandled: true))")
            result.deliveredAfter.append(delivered.locked { $0 })
            senderGo.fire()  // the helper sends 2 once it sees this run asleep
            let start = ContinuousClock.now
            result.runs.append(
                "other \(loop.run(mode: otherMode, for: .milliseconds(150), returnAfterSourceHandled: true))")
            result.otherRunSeconds = secondsSince(start)
            result.deliveredAfter.append(delivered.locked { $0 })
            while delivered.locked({ $0.count }) < 2 && result.runs.count < 10 {
                result.runs.append(
                    "port \(loop.run(mode: portMode, for: .seconds(5), returnAfterSourceHandled: true))")
            }
            result.deliveredAfter.append(delivered.locked { $0 })
            keepDefault.invalidate()
            keepOther.invalidate()
            outcome.locked { $0 = result }
        }
        guard let thread else { return }
        let loop = thread.loop
        let helper = TestThread(name: "rlk-port-modes-h") {
            guard senderGo.wait(timeout: .seconds(10)) else { return }
            _ = waitUntil(timeout: .seconds(5)) { loop.isWaiting && loop.currentMode == otherMode }
            try? port.send(2)
        }
        let exited = await thread.joinAsync(timeout: .seconds(30))
        _ = await helper.joinAsync(timeout: .seconds(30))
        #expect(exited)
        guard let outcome = outcome.locked({ $0 }) else { return }
        #expect(
            outcome.runs == ["default timedOut", "other timedOut", "port handledSource", "port handledSource"],
            "\(outcome.runs)")
        #expect(outcome.deliveredAfter == [[], [], [1, 2]])
        #expect(outcome.otherRunSeconds >= 0.12, "the send did not wake the loop in another mode")
        port.invalidate()
    }

    /// Added for `.common`, a port is handled in every common mode, also one made common later.
    @Test func aPortInCommonModesIsHandledInEach() async {
        let laterCommon: RunLoop.Mode = "PortTestsLaterCommon"
        let outcome = await TestThreads.run(name: "rlk-port-common") { () -> [String] in
            let loop = RunLoop.current
            let delivered = Mutex<[Int]>([])
            let port = MessagePort<Int> { message in delivered.locked { $0.append(message) } }
            loop.add(port, forMode: .common)
            var trace: [String] = []
            try? port.send(1)
            trace.append("default \(loop.run(mode: .default, for: .seconds(5), returnAfterSourceHandled: true))")
            loop.addCommonMode(laterCommon)
            trace.append("contains \(loop.contains(port, inMode: laterCommon))")
            try? port.send(2)
            trace.append("later \(loop.run(mode: laterCommon, for: .seconds(5), returnAfterSourceHandled: true))")
            trace.append("delivered \(delivered.locked { $0 })")
            port.invalidate()
            return trace
        }
        #expect(
            outcome == ["default handledSource", "contains true", "later handledSource", "delivered [1, 2]"])
    }

    /// A handler that sends to its own port and runs the loop nested (a connection flushing in a
    /// callback): the nested run delivers the rest of the batch in flight, then the new message,
    /// in order, and the outer delivery ends there. Before, the nested delivery replaced the batch
    /// in flight and its rest was neither delivered nor returned by invalidate().
    @Test func aNestedRunInAHandlerDeliversTheRestOfTheBatchThenTheNewMessage() async {
        let delivered = await TestThreads.run(name: "rlk-port-nested") { () -> [Int] in
            let loop = RunLoop.current
            let log = LoopBound<[Int]>([], on: loop)
            let portSlot = LoopBound<MessagePort<Int>?>(nil, on: loop)
            let port = MessagePort<Int> { message in
                log.value.append(message)
                guard message == 1, let port = portSlot.value else { return }
                try? port.send(99)
                loop.run(mode: .default, for: .zero)
            }
            portSlot.value = port
            loop.add(port, forMode: .default)
            for message in 1...3 { try? port.send(message) }
            loop.run(mode: .default, for: .zero)
            loop.run(mode: .default, for: .zero)
            let left = port.invalidate()
            portSlot.value = nil  // the handler holds the slot, which held the port: a cycle
            return log.value + left.map { -$0 }
        }
        #expect(delivered == [1, 2, 3, 99])
    }
}
