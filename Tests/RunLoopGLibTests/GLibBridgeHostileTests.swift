#if GLib
import CGLib
import Glibc
import RunLoopGLib
import RunLoopKit
import SharedTestSupport
import Synchronization
import Testing

/// What careless or hostile GLib code does to the bridge: a callback that invalidates it or
/// removes its own source, a timeout of weeks, more descriptors than the bridge's first array,
/// a descriptor closed and its number reopened between passes.
@Suite struct GLibBridgeHostileTests {
    /// A GLib callback invalidates the bridge: the dispatch finishes, then the context is
    /// released; GLib's own iteration runs the context after.
    @Test func callbackInvalidatesTheBridge() async {
        _ = GLibLog.installed
        let warningsBefore = GLibLog.warnings.count
        let result = await TestThreads.run(name: "glib-invalidate") { () -> [String] in
            var failures: [String] = []
            let context = g_main_context_new()!
            defer { g_main_context_unref(context) }
            let loop = RunLoop.current
            guard let bridge = try? GLibBridge.attach(to: loop, context: context) else { return ["attach failed"] }
            let shared = SendablePointer(pointer: context)
            let ownerInCallback = Atomic<Bool>(false)
            let later = Atomic<Int>(0)
            addTimeout(10, to: context) {
                bridge.invalidate()
                // Released only when the dispatch returns: still this thread's.
                ownerInCallback.store(g_main_context_is_owner(shared.pointer) != 0, ordering: .relaxed)
                return true
            }
            addTimeout(5, to: context, priority: G_PRIORITY_LOW) {
                later.add(1, ordering: .relaxed)
                return true
            }
            let keepAlive = RunLoopTimer(after: .seconds(100)) { _ in }
            loop.add(keepAlive, forMode: .default)
            loop.run(mode: .default, for: .milliseconds(150))
            keepAlive.invalidate()
            if !ownerInCallback.load(ordering: .relaxed) { failures.append("released inside the dispatch") }
            if bridge.isAttached { failures.append("still attached") }
            if g_main_context_is_owner(context) != 0 { failures.append("still the owner") }
            let driven = later.load(ordering: .relaxed)
            _ = g_main_context_iteration(context, 0)
            _ = g_main_context_iteration(context, 0)
            if driven > 2 { failures.append("GLib still driven after invalidate: \(driven) fires") }
            return failures
        }
        #expect(result == [])
        #expect(Array(GLibLog.warnings.dropFirst(warningsBefore)).isEmpty)
    }

    /// `invalidate()` from another thread while the loop runs: the bridge stops driving GLib at
    /// once, and the context is released on the loop's thread at its next pass.
    @Test func invalidateFromAnotherThread() async {
        let result = await TestThreads.run(name: "glib-remote") { () -> [String] in
            var failures: [String] = []
            let context = g_main_context_new()!
            defer { g_main_context_unref(context) }
            let loop = RunLoop.current
            guard let bridge = try? GLibBridge.attach(to: loop, context: context) else { return ["attach failed"] }
            let fires = Atomic<Int>(0)
            addTimeout(10, to: context) {
                fires.add(1, ordering: .relaxed)
                return true
            }
            let keepAlive = RunLoopTimer(after: .seconds(100)) { _ in }
            loop.add(keepAlive, forMode: .default)
            let remote = TestThread(name: "glib-invalidator") {
                usleep(50_000)
                bridge.invalidate()
            }
            loop.run(mode: .default, for: .milliseconds(200))
            _ = remote.join(timeout: .seconds(5))
            keepAlive.invalidate()
            if bridge.isAttached { failures.append("still attached") }
            if g_main_context_is_owner(context) != 0 { failures.append("the context was not released") }
            let count = fires.load(ordering: .relaxed)
            if count < 2 || count > 8 { failures.append("fires before the invalidate: \(count)") }
            return failures
        }
        #expect(result == [])
    }

    /// GLib's own iteration on the loop's thread while the loop is not running (the bridge holds
    /// the context; GLib's acquire is recursive): it dispatches, and the reverse source stays out
    /// (there is no run for it to serve).
    @Test func glibIterationWhileTheLoopIsNotRunning() async {
        let warningsBefore = GLibLog.warnings.count
        let result = await withBridgedLoop { loop, context, _ in
            let ran = Atomic<Int>(0)
            addIdle(context, priority: G_PRIORITY_DEFAULT) {
                ran.add(1, ordering: .relaxed)
                return false
            }
            let dispatched = g_main_context_iteration(context, 0) != 0
            // And the loop drives it again afterwards.
            let fired = Atomic<Bool>(false)
            addTimeout(10, to: context) {
                fired.store(true, ordering: .relaxed)
                RunLoop.current.stop()
                return false
            }
            loop.run(mode: .default, for: .seconds(5))
            return (dispatched, ran.load(ordering: .relaxed), fired.load(ordering: .relaxed))
        }
        guard let (dispatched, ran, fired) = result else { return }
        #expect(dispatched && ran == 1)
        #expect(fired)
        #expect(Array(GLibLog.warnings.dropFirst(warningsBefore)).isEmpty)
    }

    /// A callback that removes its own source (and one that destroys the source it runs in,
    /// returning "continue") runs once; GLib logs nothing.
    @Test func callbackRemovesItsOwnSource() async {
        let warningsBefore = GLibLog.warnings.count
        let result = await withBridgedLoop { loop, context, _ in
            let removed = Atomic<Int>(0)
            let destroyed = Atomic<Int>(0)
            addTimeout(10, to: context) {
                removed.add(1, ordering: .relaxed)
                // By id, as g_source_remove does for the default context.
                let current = g_main_current_source()
                g_source_destroy(g_main_context_find_source_by_id(g_source_get_context(current), g_source_get_id(current)))
                return true
            }
            addTimeout(10, to: context) {
                destroyed.add(1, ordering: .relaxed)
                g_source_destroy(g_main_current_source())
                return true
            }
            loop.run(mode: .default, for: .milliseconds(100))
            return (removed.load(ordering: .relaxed), destroyed.load(ordering: .relaxed))
        }
        guard let (removed, destroyed) = result else { return }
        #expect(removed == 1)
        #expect(destroyed == 1)
        #expect(Array(GLibLog.warnings.dropFirst(warningsBefore)).isEmpty)
    }

    /// A GLib timeout of weeks: the loop sleeps (no busy loop), the run times out as asked, and a
    /// short timeout beside it still fires.
    @Test func hugeTimeout() async {
        let result = await withBridgedLoop { loop, context, _ in
            addTimeout(UInt32.max, to: context) { true }
            attach(g_timeout_source_new_seconds(UInt32.max), to: context) { true }
            let passes = Atomic<Int>(0)
            let observer = RunLoopObserver(activities: .beforeTimers) { _, _ in passes.add(1, ordering: .relaxed) }
            loop.add(observer, forMode: .default)
            let start = ContinuousClock.now
            let outcome = loop.run(mode: .default, for: .milliseconds(300))
            let elapsed = ContinuousClock.now - start
            let fired = Atomic<Bool>(false)
            addTimeout(20, to: context) {
                fired.store(true, ordering: .relaxed)
                return false
            }
            loop.run(mode: .default, for: .milliseconds(100))
            observer.invalidate()
            return (outcome, elapsed, passes.load(ordering: .relaxed), fired.load(ordering: .relaxed))
        }
        guard let (outcome, elapsed, passes, fired) = result else { return }
        #expect(outcome == .timedOut)
        #expect(elapsed >= .milliseconds(300))
        #expect(passes < 15, "passes: \(passes)")
        #expect(fired)
    }

    /// A hundred watched pipes (more descriptors than the bridge's first query array holds): a
    /// write to the last one is dispatched.
    @Test func manyDescriptors() async {
        let result = await withBridgedLoop { loop, context, _ in
            var pipes: [(read: Int32, write: Int32)] = []
            for _ in 0..<100 { pipes.append(makePipe()) }
            defer {
                for pipe in pipes {
                    close(pipe.read)
                    close(pipe.write)
                }
            }
            let fired = Mutex<[Int]>([])
            for (index, pipe) in pipes.enumerated() {
                let readEnd = pipe.read
                addWatch(readEnd, to: context) {
                    drain(readEnd)
                    fired.locked { $0.append(index) }
                    RunLoop.current.stop()
                    return true
                }
            }
            loop.run(mode: .default, for: .milliseconds(50))
            let last = pipes[99].write
            let writer = TestThread(name: "glib-writer") {
                usleep(30_000)
                var byte: UInt8 = 1
                _ = write(last, &byte, 1)
            }
            let outcome = loop.run(mode: .default, for: .seconds(5))
            _ = writer.join(timeout: .seconds(5))
            return (outcome, fired.locked { $0 })
        }
        guard let (outcome, fired) = result else { return }
        #expect(outcome == .stopped)
        #expect(fired == [99])
    }

    /// Between two passes a GLib callback removes its descriptor watch, closes the descriptor and
    /// watches a new one under the same number: a write to the new one is dispatched (the bridge's
    /// epoll registration of the old file went with it).
    @Test func descriptorClosedAndReopenedBetweenPasses() async {
        let result = await withBridgedLoop { loop, context, _ in
            let first = makePipe()
            let second = makePipe()
            let number = first.read
            let fired = Mutex<[String]>([])
            let writeEnd = Atomic<Int32>(first.write)
            let shared = SendablePointer(pointer: context)
            let oldWatch = addWatch(number, to: context) {
                drain(number)
                fired.locked { $0.append("old") }
                return true
            }
            addTimeout(20, to: context) {
                // The same number, a new file.
                g_source_destroy(g_main_context_find_source_by_id(shared.pointer, oldWatch))
                close(number)
                close(first.write)
                precondition(dup2(second.read, number) == number)
                close(second.read)
                writeEnd.store(second.write, ordering: .relaxed)
                addWatch(number, to: shared.pointer) {
                    drain(number)
                    fired.locked { $0.append("new") }
                    RunLoop.current.stop()
                    return true
                }
                return false
            }
            // Let the swap happen and the loop settle in a sleep with the new watch.
            loop.run(mode: .default, for: .milliseconds(80))
            let target = writeEnd.load(ordering: .relaxed)
            let writer = TestThread(name: "glib-writer") {
                usleep(30_000)
                var byte: UInt8 = 1
                _ = write(target, &byte, 1)
            }
            let outcome = loop.run(mode: .default, for: .seconds(5))
            _ = writer.join(timeout: .seconds(5))
            close(number)
            close(second.write)
            return (outcome, fired.locked { $0 })
        }
        guard let (outcome, fired) = result else { return }
        #expect(outcome == .stopped)
        #expect(fired == ["new"])
    }
}
#endif
