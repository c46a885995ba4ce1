import Dispatch
import Glibc
import SharedTestSupport

@testable import RunLoopKit

// A deterministic schedule explorer (stateless model checking, in the spirit of CHESS): a few
// actors, each on its own thread, of which exactly one runs at a time. Before every step the
// others can see (the wake protocol's `step` hook, or the model's own), the running actor asks the
// explorer who goes next; the explorer follows a recorded schedule, then its default (the same
// actor while it can run), and records each choice point with its alternatives. After each
// execution it backtracks depth-first to the deepest choice with an untried alternative, so
// every interleaving is run once, up to a bound on preemptions (switching away from an actor
// that could have gone on), CHESS's bound: most concurrency bugs need two or three.
//
// An actor may block (the loop in `epoll_wait`); a blocked actor runs again when another
// unblocks it, or, when no actor can run any more, is resumed with "nothing will ever wake you":
// the model checks then that this is not a lost wakeup.

/// Explores every interleaving of `actors`, up to `preemptionBound` preemptions.
struct InterleavingExplorer {
    let preemptionBound: Int
    /// Stops after this many executions (a guard against a model that grew too big).
    var executionLimit = 200_000

    struct Outcome: Sendable {
        var executions = 0
        /// The first failing execution's steps, and what it broke.
        var failure: (trace: [String], message: String)?
    }

    /// Runs `makeExecution`'s actors in every interleaving. `makeExecution` builds a fresh model
    /// (and its actors) for each execution, given the scheduler its steps must call; the model
    /// reports a broken property with ``ScheduledExecution/fail(_:)``.
    func explore(_ makeExecution: (ScheduledExecution) -> [@Sendable (ScheduledExecution) -> Void]) -> Outcome {
        var outcome = Outcome()
        var prefix: [Int] = []
        while outcome.executions < executionLimit {
            let execution = ScheduledExecution(prefix: prefix)
            let actors = makeExecution(execution)
            execution.run(actors)
            outcome.executions += 1
            if let message = execution.failure {
                outcome.failure = (execution.trace, message)
                return outcome
            }
            guard let next = nextPrefix(after: execution.trail) else { return outcome }
            prefix = next
        }
        outcome.failure = ([], "more than \(executionLimit) executions: raise the limit or shrink the model")
        return outcome
    }

    /// The deepest choice point with an untried alternative within the preemption bound.
    private func nextPrefix(after trail: [ScheduledExecution.Point]) -> [Int]? {
        var preemptionsBefore: [Int] = []
        var count = 0
        for point in trail {
            preemptionsBefore.append(count)
            if point.isPreemption(point.options[point.taken]) { count += 1 }
        }
        var index = trail.count - 1
        while index >= 0 {
            let point = trail[index]
            var alternative = point.taken + 1
            while alternative < point.options.count {
                let actor = point.options[alternative]
                if preemptionsBefore[index] + (point.isPreemption(actor) ? 1 : 0) <= preemptionBound {
                    return trail[..<index].map { $0.options[$0.taken] } + [actor]
                }
                alternative += 1
            }
            index -= 1
        }
        return nil
    }
}

/// One execution: the actors' threads and the baton that lets exactly one of them run.
///
/// `@unchecked Sendable` is safe because every property is read and written only by the thread
/// holding the baton (the running actor, or the driver before the first actor starts and after the
/// last ends), and the baton passes through semaphores, which order each holder's accesses after
/// the previous holder's.
final class ScheduledExecution: WakeStepScheduler, @unchecked Sendable {
    struct Point {
        /// The runnable actors, the default first.
        let options: [Int]
        var taken: Int
        let current: Int
        let currentCouldRun: Bool

        func isPreemption(_ actor: Int) -> Bool { currentCouldRun && actor != current }
    }

    enum Status { case runnable, blocked, done }

    private let prefix: [Int]
    private(set) var trail: [Point] = []
    private(set) var trace: [String] = []
    private(set) var failure: String?
    private var status: [Status] = []
    private var resumedForever: [Bool] = []
    private var semaphores: [DispatchSemaphore] = []
    private var current = -1
    private let finished = DispatchSemaphore(value: 0)

    init(prefix: [Int]) { self.prefix = prefix }

    /// The running actor's index.
    var running: Int { current }

    /// Runs the actors to the end (every one of them done).
    func run(_ actors: [@Sendable (ScheduledExecution) -> Void]) {
        status = Array(repeating: .runnable, count: actors.count)
        resumedForever = Array(repeating: false, count: actors.count)
        semaphores = actors.map { _ in DispatchSemaphore(value: 0) }
        var threads: [TestThread] = []
        for (index, actor) in actors.enumerated() {
            let semaphore = semaphores[index]
            threads.append(
                TestThread(name: "explore-\(index)") {
                    semaphore.wait()
                    actor(self)
                    self.finishRunning()
                })
        }
        current = choose()
        semaphores[current].signal()
        if finished.wait(timeout: .now() + .seconds(30)) == .timedOut {
            fatalError("an explored execution did not end in 30 s (an actor waits outside the explorer?)\n" + trace.joined(separator: "\n"))
        }
        for thread in threads where !thread.join(timeout: .seconds(30)) {
            fatalError("an explored actor's thread did not end in 30 s")
        }
    }

    // MARK: Called by the running actor

    func willTake(_ step: StaticString) {
        trace.append("\(current): \(step)")
        schedule()
    }

    /// A step of the model's own (not the protocol's).
    func step(_ name: String) {
        trace.append("\(current): \(name)")
        schedule()
    }

    /// Blocks the running actor until another calls ``unblock(_:)``; returns false when nothing
    /// can ever unblock it (every other actor is done or blocked).
    func block() -> Bool {
        let me = current
        status[me] = .blocked
        guard status.contains(.runnable) else {
            status[me] = .runnable
            trace.append("\(me): blocked with no one left to wake it")
            return false
        }
        pass(to: choose(), from: me)
        if resumedForever[me] {
            resumedForever[me] = false
            trace.append("\(me): blocked with no one left to wake it")
            return false
        }
        return true
    }

    func unblock(_ actor: Int) {
        if status[actor] == .blocked { status[actor] = .runnable }
    }

    /// Records a broken property; the execution goes on to its end.
    func fail(_ message: String) {
        if failure == nil { failure = message }
    }

    // MARK: The baton

    private func schedule() {
        let me = current
        let next = choose()
        if next != me { pass(to: next, from: me) }
    }

    private func pass(to next: Int, from me: Int) {
        current = next
        semaphores[next].signal()
        semaphores[me].wait()
    }

    private func finishRunning() {
        status[current] = .done
        if status.contains(.runnable) {
            current = choose()
            semaphores[current].signal()
        } else if let blocked = status.firstIndex(of: .blocked) {
            status[blocked] = .runnable
            resumedForever[blocked] = true
            current = blocked
            semaphores[blocked].signal()
        } else {
            finished.signal()
        }
    }

    private func choose() -> Int {
        let runnable = status.indices.filter { status[$0] == .runnable }
        let couldGoOn = current >= 0 && status[current] == .runnable
        let preferred = couldGoOn ? current : runnable[0]
        let options = [preferred] + runnable.filter { $0 != preferred }
        if options.count == 1 { return preferred }
        var taken = 0
        if trail.count < prefix.count {
            guard let index = options.firstIndex(of: prefix[trail.count]) else {
                fatalError("the explored model is not deterministic: replaying a schedule offered other choices")
            }
            taken = index
        }
        trail.append(Point(options: options, taken: taken, current: current, currentCouldRun: couldGoOn))
        return options[taken]
    }
}
