import CRunLoopKit
import Glibc
import Synchronization
import Testing

@testable import RunLoopKit

// Targeted races between two threads changing the same item on the same loop: one removes it
// while the other adds it back. Whatever the interleaving, the loop's tables and the item's own
// record of where it is must agree, so that `invalidate()` finds and removes it everywhere.

extension Robustness {
    @Suite struct RegistrationRace {
        static let rounds = TestThreads.scaled(20_000, minimum: 2_000)

        /// A source is in `.default`; thread A removes it while thread B adds it again. Then it is
        /// invalidated: it must be gone from the mode, and its schedule and cancel callbacks must
        /// balance.
        @Test func aSourceRemovedAndReAddedConcurrentlyIsStillRemovedByInvalidate() async {
            let outcome = await raceRounds(Self.rounds * 3) { loop, round in
                let scheduled = Atomic<Int>(0)
                let cancelled = Atomic<Int>(0)
                let source = RunLoopSource(
                    onSchedule: { _, _ in scheduled.add(1, ordering: .relaxed) },
                    onCancel: { _, _ in cancelled.add(1, ordering: .relaxed) }, perform: {})
                loop.add(source, forMode: .default)
                return RaceRound(
                    remover: { loop.remove(source, forMode: .default) },
                    adder: { loop.add(source, forMode: .default) },
                    check: {
                        source.invalidate()
                        let stillThere = loop.contains(source, inMode: .default)
                        let balance = scheduled.load(ordering: .relaxed) - cancelled.load(ordering: .relaxed)
                        return stillThere || balance != 0
                            ? "round \(round): after invalidate() the source is in the mode: \(stillThere), schedules - cancels = \(balance)"
                            : nil
                    })
            }
            #expect(
                outcome.failures == 0, "\(outcome.failures) of \(outcome.rounds) rounds; first: \(outcome.first ?? "")")
        }

        /// The same race on `.common`.
        @Test func aCommonSourceRemovedAndReAddedConcurrentlyIsStillRemovedByInvalidate() async {
            let outcome = await raceRounds(Self.rounds * 3) { loop, round in
                let source = RunLoopSource {}
                loop.add(source, forMode: .common)
                return RaceRound(
                    remover: { loop.remove(source, forMode: .common) },
                    adder: { loop.add(source, forMode: .common) },
                    check: {
                        source.invalidate()
                        let stillThere = [RunLoop.Mode.common, .default].filter { loop.contains(source, inMode: $0) }
                        return stillThere.isEmpty
                            ? nil : "round \(round): after invalidate() the source is in \(stillThere)"
                    })
            }
            #expect(
                outcome.failures == 0, "\(outcome.failures) of \(outcome.rounds) rounds; first: \(outcome.first ?? "")")
        }

        /// A source is in `.default`; thread A invalidates it while thread B adds it to `.default`
        /// again. An add that loses to the invalidation must not take away the membership an
        /// earlier add made without its cancel callback: schedules and cancels balance.
        @Test func reAddingASourceWhileItIsInvalidatedKeepsItsCallbacksBalanced() async {
            let outcome = await raceRounds(Self.rounds) { loop, round in
                let scheduled = Atomic<Int>(0)
                let cancelled = Atomic<Int>(0)
                let source = RunLoopSource(
                    onSchedule: { _, _ in scheduled.add(1, ordering: .relaxed) },
                    onCancel: { _, _ in cancelled.add(1, ordering: .relaxed) }, perform: {})
                loop.add(source, forMode: .default)
                return RaceRound(
                    remover: { source.invalidate() },
                    adder: { loop.add(source, forMode: .default) },
                    check: {
                        let stillThere = loop.contains(source, inMode: .default)
                        let (schedules, cancels) = (
                            scheduled.load(ordering: .relaxed), cancelled.load(ordering: .relaxed)
                        )
                        return stillThere || schedules != cancels
                            ? "round \(round): in the mode after invalidate(): \(stillThere); \(schedules) schedules, \(cancels) cancels"
                            : nil
                    })
            }
            #expect(
                outcome.failures == 0, "\(outcome.failures) of \(outcome.rounds) rounds; first: \(outcome.first ?? "")")
        }

        /// The same race for an observer.
        @Test func anObserverRemovedAndReAddedConcurrentlyIsStillRemovedByInvalidate() async {
            let outcome = await raceRounds(Self.rounds) { loop, round in
                let observer = RunLoopObserver(activities: .allActivities) { _, _ in }
                loop.add(observer, forMode: .default)
                return RaceRound(
                    remover: { loop.remove(observer, forMode: .default) },
                    adder: { loop.add(observer, forMode: .default) },
                    check: {
                        observer.invalidate()
                        return loop.contains(observer, inMode: .default)
                            ? "round \(round): after invalidate() the observer is still in the mode" : nil
                    })
            }
            #expect(
                outcome.failures == 0, "\(outcome.failures) of \(outcome.rounds) rounds; first: \(outcome.first ?? "")")
        }

        /// The same race for a timer (its membership is kept under both locks: a control).
        @Test func aTimerRemovedAndReAddedConcurrentlyIsStillRemovedByInvalidate() async {
            let outcome = await raceRounds(Self.rounds) { loop, round in
                let timer = RunLoopTimer(after: .seconds(3600)) { _ in }
                loop.add(timer, forMode: .default)
                return RaceRound(
                    remover: { loop.remove(timer, forMode: .default) },
                    adder: { loop.add(timer, forMode: .default) },
                    check: {
                        timer.invalidate()
                        return loop.contains(timer, inMode: .default)
                            || loop.nextTimerFireDate(forMode: .default) != nil
                            ? "round \(round): after invalidate() the timer is still in the mode" : nil
                    })
            }
            #expect(
                outcome.failures == 0, "\(outcome.failures) of \(outcome.rounds) rounds; first: \(outcome.first ?? "")")
        }
    }
}

/// One round of a race: `remover` and `adder` run at the same moment on two threads, then `check`
/// (on one of them) returns a failure description or nil.
struct RaceRound: Sendable {
    let remover: @Sendable () -> Void
    let adder: @Sendable () -> Void
    let check: @Sendable () -> String?
}

struct RaceOutcome: Sendable {
    var rounds = 0
    var failures = 0
    var first: String?
}

/// Runs `rounds` rounds on a loop whose thread stays alive (but does not run) meanwhile. The two
/// racers meet at a spinning barrier each round and then skew their start by a varying number
/// of spins so that the overlap sweeps across the operations.
func raceRounds(
    _ rounds: Int, _ makeRound: @escaping @Sendable (RunLoop, Int) -> RaceRound
) async -> RaceOutcome {
    final class Shared: @unchecked Sendable {
        let arrivals = Atomic<Int>(0)
        let departures = Atomic<Int>(0)
        var round: RaceRound?
        var outcome = RaceOutcome()
    }
    let shared = Shared()
    let release = TestEvent()
    guard
        let host = TestThread.hostingLoop(name: "rlk-race-loop", run: { _ in _ = release.wait(timeout: .seconds(300)) })
    else { return RaceOutcome(rounds: 0, failures: 1, first: "no loop") }
    let loop = host.loop

    /// Both racers call this with increasing `phase`; returns when both have arrived.
    @Sendable func barrier(_ counter: borrowing Atomic<Int>, _ phase: Int) {
        counter.add(1, ordering: .acquiringAndReleasing)
        var spins = 0
        while counter.load(ordering: .acquiring) < 2 * phase {
            spins += 1
            if spins > 1000 { sched_yield() }
        }
    }
    @Sendable func skew(_ count: Int) {
        var sink = 0
        for index in 0..<count { sink &+= index }
        withExtendedLifetime(sink) {}
    }
    let other = TestThread(name: "rlk-racer-b") {
        for round in 1...rounds {
            barrier(shared.arrivals, round)
            let current = shared.round!
            skew(round % 384)
            current.adder()
            barrier(shared.departures, round)
        }
    }
    let mine = TestThread(name: "rlk-racer-a") {
        for round in 1...rounds {
            shared.round = makeRound(loop, round)
            barrier(shared.arrivals, round)
            skew((round / 384) % 4 == 0 ? 16 : 0)
            shared.round!.remover()
            barrier(shared.departures, round)
            if let failure = shared.round!.check() {
                shared.outcome.failures += 1
                if shared.outcome.first == nil { shared.outcome.first = failure }
            }
            shared.outcome.rounds += 1
        }
    }
    let finished = await mine.joinAsync(timeout: .seconds(120))
    let otherFinished = await other.joinAsync(timeout: .seconds(120))
    release.fire()
    _ = await host.joinAsync(timeout: .seconds(10))
    guard finished && otherFinished else {
        return RaceOutcome(rounds: 0, failures: 1, first: "the racers did not finish")
    }
    return shared.outcome
}
