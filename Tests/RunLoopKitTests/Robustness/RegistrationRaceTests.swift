import CRunLoopKit
import Dispatch
import Glibc
import SharedTestSupport
import Synchronization
import Testing

@testable import RunLoopKit

// Targeted races between two threads changing the same item on the same loop: one removes it
// while the other adds it back. Whatever the interleaving, the loop's tables and the item's own
// record of where it is must agree, so that `invalidate()` finds and removes it everywhere.
// Serialized: each test's two racers want a core each; five pairs at once on 2 cores mostly wait.

@Suite(.serialized, .exclusive(.robustness)) struct RegistrationRace {
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
/// racers meet at a barrier each round and then skew their start by a varying number of spins so
/// that the overlap sweeps across the operations.
///
/// On a loaded machine (the CI machine runs other work on its 2 cores) the racers are often not
/// both running, so the barrier spins only briefly and then sleeps until the other arrives; and
/// the rounds stop after `budget` (the outcome says how many ran). A round that ran is a full
/// round; fewer rounds are less likely to hit a bad interleaving, never a false failure.
func raceRounds(
    _ rounds: Int, budget: Duration = .seconds(30), _ makeRound: @escaping @Sendable (RunLoop, Int) -> RaceRound
) async -> RaceOutcome {
    // @unchecked: `round` and `outcome` are written by racer A only, and `round` read by racer B
    // only between the two barriers of a round; each barrier's atomics order those accesses.
    final class Shared: @unchecked Sendable {
        let arrivals = RaceBarrier()
        let departures = RaceBarrier()
        var round: RaceRound?
        var outcome = RaceOutcome()
    }
    let shared = Shared()
    let release = TestEvent()
    guard
        let host = TestThread.hostingLoop(name: "rlk-race-loop", run: { _ in _ = release.wait(timeout: .seconds(300)) })
    else { return RaceOutcome(rounds: 0, failures: 1, first: "no loop") }
    let loop = host.loop

    @Sendable func skew(_ count: Int) {
        var sink = 0
        for index in 0..<count { sink &+= index }
        withExtendedLifetime(sink) {}
    }
    let other = TestThread(name: "rlk-racer-b") {
        for round in 1...rounds {
            shared.arrivals.arrive(round)
            guard let current = shared.round else { break }  // A's budget ran out
            skew(round % 384)
            current.adder()
            shared.departures.arrive(round)
        }
    }
    let mine = TestThread(name: "rlk-racer-a") {
        let end = ContinuousClock.now + budget
        for round in 1...rounds {
            let stopping = round % 256 == 0 && ContinuousClock.now > end
            shared.round = stopping ? nil : makeRound(loop, round)
            shared.arrivals.arrive(round)
            if stopping { break }
            skew((round / 384) % 4 == 0 ? 16 : 0)
            shared.round!.remover()
            shared.departures.arrive(round)
            if let failure = shared.round!.check() {
                shared.outcome.failures += 1
                if shared.outcome.first == nil { shared.outcome.first = failure }
            }
            shared.outcome.rounds += 1
        }
    }
    let finished = await mine.joinAsync(timeout: budget + .seconds(120))
    let otherFinished = await other.joinAsync(timeout: .seconds(120))
    release.fire()
    _ = await host.joinAsync(timeout: .seconds(10))
    guard finished && otherFinished else {
        return RaceOutcome(rounds: 0, failures: 1, first: "the racers did not finish")
    }
    if shared.outcome.rounds < rounds {
        print("raceRounds: \(shared.outcome.rounds) of \(rounds) rounds ran within the \(budget) budget")
    }
    return shared.outcome
}

/// A barrier for the two racers, met once per round (`phase` 1, 2, 3, …).
///
/// The first to arrive spins for up to 50 µs (so that both leave it within a few hundred
/// nanoseconds when both are running; the other racer's work between two barriers takes tens of
/// microseconds in a debug build), then sleeps on a semaphore until the second arrives. Spinning
/// with `sched_yield` without end, two racers and two busy processes on 2 cores took minutes for
/// the rounds an idle machine runs in a second: each yield could hand the core to a busy process
/// for a whole time slice while the other racer waited for a core. Dekker-style: the sleeper publishes `sleeping` and then re-reads the count;
/// the second arriver adds to the count and then takes `sleeping`; with sequentially consistent
/// atomics at least one of them sees the other's write, so a sleeper is always woken.
final class RaceBarrier: Sendable {
    private let count = Atomic<Int>(0)
    private let sleeping = Atomic<Bool>(false)
    private let wake = DispatchSemaphore(value: 0)

    func arrive(_ phase: Int) {
        let arrived = count.add(1, ordering: .sequentiallyConsistent).newValue
        if arrived == 2 * phase {
            if sleeping.exchange(false, ordering: .sequentiallyConsistent) { wake.signal() }
            return
        }
        let spinUntil = ContinuousClock.now + .microseconds(50)
        var spins = 0
        while count.load(ordering: .acquiring) < 2 * phase {
            spins &+= 1
            if spins % 64 == 0 && ContinuousClock.now > spinUntil { break }
        }
        guard count.load(ordering: .acquiring) < 2 * phase else { return }
        sleeping.store(true, ordering: .sequentiallyConsistent)
        if count.load(ordering: .sequentiallyConsistent) >= 2 * phase {
            // The other arrived meanwhile: take the flag back, or, if it took it first, take the
            // signal it gives.
            if sleeping.exchange(false, ordering: .sequentiallyConsistent) { return }
        }
        wake.wait()
    }
}
