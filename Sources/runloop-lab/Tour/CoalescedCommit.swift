import Foundation
import RunLoopKit
import RunLoopScheduling
import Synchronization

import class RunLoopKit.RunLoop

/// Experiment 12 (seed 002): ASDK's transaction group: 1,000 layout requests in one iteration
/// become one commit at `beforeWaiting`.
struct CoalescedCommit: Experiment {
    let title = "ASDK-style commit: 1,000 layout requests, one commit"
    let seed = Seed.cite(2)
    let seedSays = """
        Seed 002: ASDK (Texture) moves layout and drawing to background threads and, like Core \
        Animation, registers an observer at beforeWaiting and exit that commits the pending changes \
        in one go. The 1,000 requests, the 100 nodes and the parent's follow-up layout are ours.
        """
    let summary = """
        Texture (ASDK) lays nodes out off the main thread and applies the results in one \
        transaction, from a beforeWaiting | exit observer, so that a burst of changes costs one \
        commit. Here a timer callback makes 1,000 layout requests for 100 nodes (each node 10 \
        times, with a new frame each time) through a CommitCoalescer: at beforeWaiting each node is \
        laid out once, with its latest frame. One node's commit asks for its parent's layout: as in \
        ASDK (which swaps its set before committing for this reason), that runs in the next \
        iteration, which the coalescer wakes the loop for.
        """

    static let nodes = 100
    static let requests = 1_000

    func run() {
        let trace = LoopThread.run(name: "commit") { loop in
            let trace = TourLog()
            let coalescer = CommitCoalescer(loop: loop, order: CommitCoalescer.defaultOrder)
            let applied = Mutex<[Int: Int]>([:])
            let layouts = SharedCounter()
            let observer = RunLoopObserver(activities: [.beforeWaiting, .afterWaiting, .exit], order: Int.min) {
                _, activity in
                trace.log(ObserverLog.label(activity))
            }
            loop.add(observer, forMode: .default)
            let event = RunLoopTimer(after: .milliseconds(10)) { _ in
                let started = ContinuousClock.now
                for request in 0..<Self.requests {
                    let node = request % Self.nodes
                    let frame = request
                    coalescer.setNeedsCommit(key: node) {
                        layouts.increment()
                        applied.locked { $0[node] = frame }
                        if node == 42 {
                            coalescer.setNeedsCommit(key: "parent-of-42") {
                                trace.log("    commit #\(coalescer.commitCount): the parent of node 42 laid out")
                            }
                        }
                    }
                }
                let took = ContinuousClock.now - started
                trace.log(
                    "    -> timer fired: \(Self.requests) setNeedsCommit(key:) calls in \(TourLog.ms(took)) "
                        + "(\(Self.perCall(took)) each); \(coalescer.pendingCount) keys pending, \(coalescer.commitCount) commits so far")
            }
            loop.add(event, forMode: .default)
            let commitLog = RunLoopObserver(activities: [.beforeWaiting, .exit], order: CommitCoalescer.defaultOrder + 1) {
                _, _ in
                let count = layouts.count
                guard count > 0 else { return }
                let latest = applied.locked { frames in frames.allSatisfy { $0.value >= Self.requests - Self.nodes } }
                trace.log(
                    "    commit #\(coalescer.commitCount): \(count) nodes laid out, each once"
                        + (latest ? ", each with its latest frame" : ""))
                layouts.reset()
            }
            loop.add(commitLog, forMode: .default)
            // Keeps the mode alive after the event's one-shot timer, as the main loop's sources do.
            let keepAlive = RunLoopTimer(after: .seconds(3600), repeating: .seconds(3600)) { _ in }
            loop.add(keepAlive, forMode: .default)
            let result = loop.run(mode: .default, for: .milliseconds(30))
            trace.log("run(mode: .default, for: .milliseconds(30)) returned .\(result); \(coalescer.commitCount) commits in all")
            observer.invalidate()
            commitLog.invalidate()
            keepAlive.invalidate()
            coalescer.invalidate()
            return trace
        }
        Out.subheading("trace (thread 'commit')")
        trace.printEvents()
    }

    static func perCall(_ took: Duration) -> String {
        let ns = Double(took.components.attoseconds) / 1e9 + Double(took.components.seconds) * 1e9
        return String(format: "%.0f ns", ns / Double(requests))
    }
}
