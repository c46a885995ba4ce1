import RunLoopKit
import Synchronization
import Testing

/// Suites that must not run at the same time as the other suites of their group, wherever they
/// are declared: `@Suite(.serialized, .exclusive(.robustness))`. Swift Testing serializes only a
/// suite's own tests (`.serialized`); this trait holds a process-wide lock of the group while the
/// suite runs, so suites that load both cores for seconds, or count the process's threads and
/// descriptors exactly, never overlap — without nesting them in one parent suite for it.
///
/// The lock is taken by suspending, not by blocking a thread of the concurrency pool. A suite of
/// a group must not contain another suite of the same group (the lock is not reentrant).
public struct Exclusive: SuiteTrait, TestScoping {
    /// A set of suites that run one at a time.
    public struct Group: Sendable {
        let lock = AsyncLock()

        /// A new group (keep it in a `static let`: suites name the same instance).
        public init() {}

        /// RunLoopKit's stress, thread-exit, keep-alive, lost-wakeup and echo-server suites.
        public static let robustness = Group()
        /// RunLoopMonitor's suites that capture stacks or time a monitor: captures are serialized
        /// process-wide (a stress test's 10,000 captures would starve a monitor's sampling), and
        /// the timing bounds assume the monitor's thread gets a core.
        public static let monitor = Group()
    }

    let group: Group

    public var isRecursive: Bool { false }

    public func scopeProvider(for test: Test, testCase: Test.Case?) -> Exclusive? {
        test.isSuite ? self : nil
    }

    public func provideScope(
        for test: Test, testCase: Test.Case?, performing function: @Sendable () async throws -> Void
    ) async throws {
        await group.lock.acquire()
        do {
            try await function()
        } catch {
            group.lock.release()
            throw error
        }
        group.lock.release()
    }
}

extension Trait where Self == Exclusive {
    /// Runs the suite while no other suite of `group` runs (see ``Exclusive``).
    public static func exclusive(_ group: Exclusive.Group) -> Self { Exclusive(group: group) }
}

/// A first-come, first-served lock that waiters await.
final class AsyncLock: Sendable {
    private let state = Mutex<(held: Bool, waiters: [CheckedContinuation<Void, Never>])>((false, []))

    func acquire() async {
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            let acquired = state.locked { state -> Bool in
                if !state.held {
                    state.held = true
                    return true
                }
                state.waiters.append(continuation)
                return false
            }
            if acquired { continuation.resume() }
        }
    }

    func release() {
        let next = state.locked { state -> CheckedContinuation<Void, Never>? in
            if state.waiters.isEmpty {
                state.held = false
                return nil
            }
            return state.waiters.removeFirst()
        }
        next?.resume()
    }
}
