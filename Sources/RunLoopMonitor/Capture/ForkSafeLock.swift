import CRunLoopMonitor
import Glibc

/// A lock, and the state it guards, that a child made by `fork()` finds usable.
///
/// After `fork()` only the forking thread exists in the child: a lock another thread of the parent
/// held at that moment (a capture in progress on the monitor's thread, a symbolication on the
/// reporting thread) would stay held for ever, and `Synchronization.Mutex` reports "Unknown error
/// occurred while attempting to acquire a Mutex" there. This lock notices that it is in a new
/// child (``crlm_fork_generation()``, bumped by a `pthread_atfork` handler) and starts over with a
/// new mutex and `State` made by `makeState`; the parent's state is left as it was (it may have
/// been half-changed at the fork, so it is neither used nor freed).
///
/// `@unchecked Sendable` is safe: `state` and `mutex` are read and written only between
/// `pthread_mutex_lock` and `pthread_mutex_unlock` of the current `mutex` (or by the only thread
/// of a new child, which replaces them before anyone else can exist).
final class ForkSafeLock<State>: @unchecked Sendable {
    private var mutex: UnsafeMutablePointer<pthread_mutex_t>
    private var state: UnsafeMutablePointer<State>
    private var generation: UInt32
    private let makeState: () -> State

    init(_ makeState: @escaping () -> State) {
        crlm_register_atfork()
        self.makeState = makeState
        mutex = Self.newMutex()
        state = .allocate(capacity: 1)
        state.initialize(to: makeState())
        generation = crlm_fork_generation()
    }

    private static func newMutex() -> UnsafeMutablePointer<pthread_mutex_t> {
        let mutex = UnsafeMutablePointer<pthread_mutex_t>.allocate(capacity: 1)
        mutex.initialize(to: pthread_mutex_t())
        pthread_mutex_init(mutex, nil)
        return mutex
    }

    /// Runs `body` with the state, under the lock.
    func locked<R, E: Error>(_ body: (inout State) throws(E) -> R) throws(E) -> R {
        if _slowPath(crlm_fork_generation() != generation) { startOverInChild() }
        pthread_mutex_lock(mutex)
        defer { pthread_mutex_unlock(mutex) }
        return try body(&state.pointee)
    }

    /// In a new child: this thread is the only one, so nobody else can be using the lock.
    private func startOverInChild() {
        mutex = Self.newMutex()
        state = .allocate(capacity: 1)
        state.initialize(to: makeState())
        generation = crlm_fork_generation()
    }
}
