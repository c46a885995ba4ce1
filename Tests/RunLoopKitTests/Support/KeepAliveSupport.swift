import CRunLoopKit
import Glibc
import SharedTestSupport
import Synchronization
import Testing

@testable import RunLoopKit

/// A list shared by a task thread and a test.
final class Recorded<Element: Sendable>: Sendable {
    private let items = Mutex<[Element]>([])
    func append(_ item: Element) { items.locked { $0.append(item) } }
    var all: [Element] { items.locked { $0 } }
    var count: Int { items.locked { $0.count } }
}

/// A task's error, for delivery tests.
struct TaskFailure: Error, Equatable {
    let code: Int
}

extension RunLoop {
    /// Whether the loop's thread has exited and torn the loop down (its teardown closes the loop's
    /// kernel descriptors).
    var isTornDown: Bool { blocksClosed.load(ordering: .acquiring) }
}

extension RunLoop {
    /// Whether a perform source of this loop is in `mode` (a perform was queued there).
    func contains(anyPerformSourceIn mode: Mode) -> Bool {
        guard let queue = attachments.existing(ThreadPerformQueue.self), let source = queue.sourceForTesting(mode)
        else { return false }
        return contains(source, inMode: mode)
    }
}
