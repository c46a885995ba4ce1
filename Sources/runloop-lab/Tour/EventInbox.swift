import Foundation
import RunLoopKit
import Synchronization

/// Events posted from a monitor's thread and taken, in order, by the thread that waits for them:
/// a lock held only to append or remove (never while a callback runs) and a counting semaphore.
final class EventInbox<Event: Sendable>: Sendable {
    private let queue = Mutex<[Event]>([])
    private let available = DispatchSemaphore(value: 0)

    /// Appends `event` and wakes one waiter. Any thread.
    func post(_ event: Event) {
        queue.locked { $0.append(event) }
        available.signal()
    }

    /// The oldest event not taken yet, waiting up to `timeout` for one; nil if none came.
    func next(timeout: Duration) -> Event? {
        let ms = Int(timeout / .milliseconds(1))
        guard available.wait(timeout: .now() + .milliseconds(ms)) == .success else { return nil }
        return queue.locked { $0.removeFirst() }
    }

    /// The oldest event that `matches`, waiting up to `timeout` in all; events that do not match
    /// are dropped (and returned in `skipped`, for a caller that wants to mention them).
    func next(
        timeout: Duration, skipped: inout [Event], where matches: (Event) -> Bool
    ) -> Event? {
        let deadline = ContinuousClock.now + timeout
        while true {
            let left = deadline - .now
            guard left > .zero, let event = next(timeout: left) else { return nil }
            if matches(event) { return event }
            skipped.append(event)
        }
    }
}

/// A moment a thread records, with its own scheduler statistics, for another thread to read: the
/// ground truth a stall's CPU figures are compared with.
final class ThreadMark: Sendable {
    /// When the mark was made, and the thread's totals then.
    struct Reading: Sendable {
        let at: ContinuousClock.Instant
        /// Time on a CPU (`/proc/thread-self/schedstat`, first field).
        let onCPU: Duration
        /// Time runnable but waiting for a CPU (second field).
        let waitingForCPU: Duration
    }

    private let value = Mutex<Reading?>(nil)

    /// Records now and the calling thread's scheduler statistics.
    func mark() {
        let fields = ((try? String(contentsOfFile: "/proc/thread-self/schedstat", encoding: .utf8)) ?? "")
            .split(separator: " ").prefix(2).map { Int64($0) ?? 0 }
        let reading = Reading(
            at: .now, onCPU: .nanoseconds(fields.first ?? 0), waitingForCPU: .nanoseconds(fields.dropFirst().first ?? 0)
        )
        value.locked { $0 = reading }
    }

    /// The recorded reading, if any.
    var reading: Reading? { value.locked { $0 } }

    /// What the thread did between `start` and `end`: on a CPU, waiting for one, and the rest
    /// (blocked: asleep, or waiting for I/O or a lock).
    static func split(
        _ start: Reading, _ end: Reading
    ) -> (wall: Duration, onCPU: Duration, waiting: Duration, blocked: Duration) {
        let wall = end.at - start.at
        let onCPU = end.onCPU - start.onCPU
        let waiting = end.waitingForCPU - start.waitingForCPU
        return (wall, onCPU, waiting, max(.zero, wall - onCPU - waiting))
    }
}
