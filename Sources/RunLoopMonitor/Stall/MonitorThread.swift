import CRunLoopMonitor
import Glibc
import RunLoopKit
import Synchronization

/// A named thread that runs `body` once, which sleeps between rounds on a condition variable that
/// ``wake()`` interrupts, and which ``join()`` waits for.
final class MonitorThread: Sendable {
    /// The condition variable and its mutex, allocated once (pthread objects must not move).
    private final class Parking: @unchecked Sendable {
        // @unchecked: the pthread objects are used only through pthread calls, which synchronize
        // them; the pointers themselves never change after init.
        let mutex = UnsafeMutablePointer<pthread_mutex_t>.allocate(capacity: 1)
        let condition = UnsafeMutablePointer<pthread_cond_t>.allocate(capacity: 1)
        var woken = false  // guarded by `mutex`
        var finished = false  // guarded by `mutex`: the body has returned

        init() {
            pthread_mutex_init(mutex, nil)
            var attributes = pthread_condattr_t()
            pthread_condattr_init(&attributes)
            pthread_condattr_setclock(&attributes, CLOCK_MONOTONIC)
            pthread_cond_init(condition, &attributes)
            pthread_condattr_destroy(&attributes)
        }

        deinit {
            pthread_cond_destroy(condition)
            pthread_mutex_destroy(mutex)
            condition.deallocate()
            mutex.deallocate()
        }
    }

    private let parking = Parking()
    private let handle = Mutex<pthread_t?>(nil)
    /// The thread's kernel id once it runs (0 before).
    private let id = ThreadIDCell()
    var threadID: Int32 { id.value.load(ordering: .acquiring) }

    /// Starts a thread named `name` (15 characters at most are kept) that runs `body`.
    init(name: String, _ body: @escaping @Sendable () -> Void) {
        let id = self.id
        let parking = self.parking
        let box = Unmanaged.passRetained(
            ThreadBody {
                id.value.store(crlm_gettid(), ordering: .releasing)
                crlm_set_thread_name(name)
                // A monitor thread started from a libdispatch or Swift concurrency thread inherits a
                // mask that blocks every signal; it must answer its own capture signal.
                _ = crlm_unblock_signal()
                body()
                // What a second join() waits for (the first one joins the thread).
                pthread_mutex_lock(parking.mutex)
                parking.finished = true
                pthread_cond_broadcast(parking.condition)
                pthread_mutex_unlock(parking.mutex)
            })
        var thread = pthread_t()
        let result = pthread_create(&thread, nil, { raw in
            let body = Unmanaged<ThreadBody>.fromOpaque(raw!).takeRetainedValue()
            body.run()
            return nil
        }, box.toOpaque())
        fatalPrecondition(result == 0, "RunLoopMonitor: cannot start the monitor thread '\(name)' (pthread_create: \(result))")
        handle.locked { $0 = thread }
    }

    /// Whether the caller is this thread.
    var isCurrent: Bool { threadID == crlm_gettid() }

    /// Sleeps until `deadline` or ``wake()``, whichever is first. Monitor thread.
    func sleep(until deadline: ContinuousClock.Instant) {
        let remaining = ContinuousClock.now.duration(to: deadline)
        pthread_mutex_lock(parking.mutex)
        defer { pthread_mutex_unlock(parking.mutex) }
        guard !parking.woken else {
            parking.woken = false
            return
        }
        if remaining > .zero {
            var now = timespec()
            clock_gettime(CLOCK_MONOTONIC, &now)
            let ns = Int(min(remaining.saturatedNanoseconds, 3_600_000_000_000))
            var end = timespec(tv_sec: now.tv_sec + ns / 1_000_000_000, tv_nsec: now.tv_nsec + ns % 1_000_000_000)
            if end.tv_nsec >= 1_000_000_000 {
                end.tv_sec += 1
                end.tv_nsec -= 1_000_000_000
            }
            while !parking.woken {
                if pthread_cond_timedwait(parking.condition, parking.mutex, &end) == ETIMEDOUT { break }
            }
        }
        parking.woken = false
    }

    /// Ends the thread's current (or next) sleep. Any thread.
    func wake() {
        pthread_mutex_lock(parking.mutex)
        parking.woken = true
        pthread_cond_signal(parking.condition)
        pthread_mutex_unlock(parking.mutex)
    }

    /// Waits for the thread to finish, whoever calls it and however many times (the first caller
    /// joins it; the others wait until its body has returned). Not on the thread itself.
    func join() {
        guard let thread = handle.locked({ handle -> pthread_t? in
            defer { handle = nil }
            return handle
        }) else {
            waitUntilFinished()
            return
        }
        pthread_join(thread, nil)
    }

    private func waitUntilFinished() {
        pthread_mutex_lock(parking.mutex)
        while !parking.finished { pthread_cond_wait(parking.condition, parking.mutex) }
        pthread_mutex_unlock(parking.mutex)
    }

    /// Lets the thread end on its own (after a ``join()`` was refused because the caller is the
    /// thread itself).
    func detach() {
        guard let thread = handle.locked({ handle -> pthread_t? in
            defer { handle = nil }
            return handle
        }) else { return }
        pthread_detach(thread)
    }
}

private final class ThreadIDCell: Sendable {
    let value = Atomic<Int32>(0)
}

private final class ThreadBody: Sendable {
    let run: @Sendable () -> Void
    init(_ run: @escaping @Sendable () -> Void) { self.run = run }
}
