import Glibc
import RunLoopKit
import SharedTestSupport
import Synchronization
import Testing

/// Runs `body` on a new thread (with a loop of its own, `RunLoop.current` there) and waits for
/// the thread to exit: the test's loop is never a shared test-runner thread's, and a thread exit
/// (the loop's teardown) is part of what some tests check. Records an issue if the thread has
/// not ended after two minutes.
func onNewThread(_ body: @escaping @Sendable (RunLoop) -> Void) {
    let thread = TestThread(name: "rls-test") { body(RunLoop.current) }
    if !thread.join(timeout: .seconds(120)) { Issue.record("the test's thread did not end") }
}

/// Runs `loop` in `mode` (on its own thread) until `condition` holds or `timeout` passes;
/// returns whether it holds.
@discardableResult
func run(_ loop: RunLoop, mode: RunLoop.Mode = .default, until condition: () -> Bool, timeout: Duration = .seconds(10)) -> Bool {
    let deadline = ContinuousClock.now + timeout
    while !condition() && ContinuousClock.now < deadline {
        loop.run(mode: mode, for: .milliseconds(50))
    }
    return condition()
}

/// A never-signalled source: keeps a mode from being empty (a run of an empty mode returns at
/// once), as an application's sources do.
func keepAlive(_ loop: RunLoop, _ mode: RunLoop.Mode = .default) -> RunLoopSource {
    let source = RunLoopSource {}
    loop.add(source, forMode: mode)
    return source
}

/// Strings appended from any thread.
final class Log: Sendable {
    private let entries = Mutex<[String]>([])
    func append(_ entry: String) { entries.locked { $0.append(entry) } }
    var all: [String] { entries.locked { $0 } }
    func count(_ entry: String) -> Int { all.filter { $0 == entry }.count }
}

/// A counter any thread adds to (a class, so that `#expect` can read it).
final class Count: Sendable {
    private let atomic = Atomic<Int>(0)
    func add(_ n: Int = 1) { atomic.add(n, ordering: .acquiringAndReleasing) }
    var value: Int { atomic.load(ordering: .acquiring) }
}

/// A flag any thread sets.
final class Flag: Sendable {
    private let atomic = Atomic<Bool>(false)
    func set() { atomic.store(true, ordering: .releasing) }
    var isSet: Bool { atomic.load(ordering: .acquiring) }
}

/// Counts the loop's wakeups (afterWaiting) and passes that reach beforeWaiting.
final class ActivityCounter: Sendable {
    let wakeups = Count()
    let beforeWaiting = Count()
    let observer: RunLoopObserver
    init(_ loop: RunLoop, mode: RunLoop.Mode = .default) {
        let wakeups = self.wakeups, beforeWaiting = self.beforeWaiting
        observer = RunLoopObserver(activities: [.afterWaiting, .beforeWaiting]) { _, activity in
            if activity == .afterWaiting { wakeups.add() } else { beforeWaiting.add() }
        }
        loop.add(observer, forMode: mode)
    }
}

/// An object whose release a test watches through a weak reference.
final class Tracked: Sendable {}

/// A weak reference a test can read from any thread.
final class WeakRef: Sendable {
    private let cell = Mutex<Weak>(Weak())
    private struct Weak { weak var object: Tracked? }
    init(_ object: Tracked) { cell.locked { $0.object = object } }
    var isReleased: Bool { cell.locked { $0.object == nil } }
}

func spin(for duration: Duration) {
    let end = ContinuousClock.now + duration
    while ContinuousClock.now < end {}
}
