#if GLib
import CGLib
import Glibc
import RunLoopGLib
import RunLoopKit
import SharedTestSupport
import Synchronization
import Testing

/// Attaching, detaching and misuse: ownership is held for the bridge's life and released by
/// `invalidate()`, after which GLib's own iteration works again; a second attach, an attach off
/// the loop's thread and an attach to a context another thread owns are clear errors.
@Suite struct GLibBridgeLifecycleTests {
    /// Invalidate releases the context; GLib's own iteration then dispatches; a new bridge
    /// attaches and drives again. (That no descriptor is left behind is GLibProbeTests'
    /// `lifecycle`: counted in a process of its own.)
    @Test func detachReleasesAndReattachWorks() async {
        _ = GLibLog.installed
        let result = await TestThreads.run(name: "glib-detach") { () -> [String] in
            var failures: [String] = []
            let context = g_main_context_new()!
            defer { g_main_context_unref(context) }
            let loop = RunLoop.current
            guard let bridge = try? GLibBridge.attach(to: loop, context: context) else { return ["attach failed"] }
            if g_main_context_is_owner(context) == 0 { failures.append("not the owner while attached") }
            if !bridge.isAttached { failures.append("isAttached false while attached") }
            do throws(GLibBridgeError) {
                _ = try GLibBridge.attach(to: loop, context: context)
                failures.append("a second attach succeeded")
            } catch {
                if error != .alreadyAttached { failures.append("second attach: \(error)") }
            }
            bridge.invalidate()
            bridge.invalidate()  // idempotent
            if bridge.isAttached { failures.append("isAttached true after invalidate") }
            if g_main_context_is_owner(context) != 0 { failures.append("still the owner after invalidate") }
            // GLib's own iteration works again (it acquires the context itself).
            let ran = Atomic<Bool>(false)
            addIdle(context, priority: G_PRIORITY_DEFAULT) {
                ran.store(true, ordering: .relaxed)
                return false
            }
            if g_main_context_iteration(context, 0) == 0 || !ran.load(ordering: .relaxed) {
                failures.append("g_main_context_iteration dispatched nothing after invalidate")
            }
            // A new bridge drives the context again.
            guard let again = try? GLibBridge.attach(to: loop, context: context) else { return failures + ["re-attach failed"] }
            let fired = Atomic<Bool>(false)
            addTimeout(10, to: context) {
                fired.store(true, ordering: .relaxed)
                RunLoop.current.stop()
                return false
            }
            loop.run(mode: .default, for: .seconds(5))
            if !fired.load(ordering: .relaxed) { failures.append("the re-attached bridge did not drive GLib") }
            again.invalidate()
            if g_main_context_is_owner(context) != 0 { failures.append("still the owner after the second invalidate") }
            return failures
        }
        #expect(result == [])
    }

    /// A loop thread that exits with its bridge attached (never invalidated) releases the context
    /// on its way out: another thread can then acquire it, and the bridge says it is detached.
    @Test func threadExitReleasesTheContext() async {
        let context = SendablePointer(pointer: g_main_context_new()!)
        defer { g_main_context_unref(context.pointer) }
        let bridge = await TestThreads.run(name: "glib-exiting") { () -> GLibBridge? in
            guard let bridge = try? GLibBridge.attach(context: context.pointer) else { return nil }
            addTimeout(5, to: context.pointer) {
                RunLoop.current.stop()
                return false
            }
            RunLoop.current.run(mode: .default, for: .seconds(5))
            return bridge
        }
        guard let bridge = bridge ?? nil else {
            Issue.record("attach failed")
            return
        }
        #expect(!bridge.isAttached)
        let acquired = await TestThreads.run(name: "glib-next") { () -> Bool in
            guard g_main_context_acquire(context.pointer) != 0 else { return false }
            g_main_context_release(context.pointer)
            return true
        }
        #expect(acquired == true)
        bridge.invalidate()  // after the thread's exit: nothing to do, no crash
    }

    /// Attaching from another thread than the loop's is refused, and so is a context another
    /// thread owns.
    @Test func attachRefusesOtherThreadsAndOwnedContexts() async {
        let host = TestThread.hostingLoop(
            name: "glib-host", setup: { loop in loop.add(RunLoopTimer(after: .seconds(100)) { _ in }, forMode: .default) },
            run: { loop in loop.run(mode: .default, for: .seconds(10)) })
        guard let host else {
            Issue.record("no loop thread")
            return
        }
        defer {
            host.loop.stop()
            _ = host.join(timeout: .seconds(10))
        }
        let offThread = await TestThreads.run(name: "glib-intruder") { () -> GLibBridgeError? in
            let context = g_main_context_new()!
            defer { g_main_context_unref(context) }
            do throws(GLibBridgeError) {
                let bridge = try GLibBridge.attach(to: host.loop, context: context)
                bridge.invalidate()
                return nil
            } catch {
                return error
            }
        }
        guard case .notLoopThread? = offThread ?? nil else {
            Issue.record("attach off the loop's thread: \(String(describing: offThread))")
            return
        }
        // A context another thread acquired.
        let context = SendablePointer(pointer: g_main_context_new()!)
        defer { g_main_context_unref(context.pointer) }
        let owner = TestMonitor(0)
        let holder = TestThread(name: "glib-owner") {
            _ = g_main_context_acquire(context.pointer)
            owner.update { $0 = 1 }
            _ = owner.wait(timeout: .seconds(10)) { $0 == 2 }
            g_main_context_release(context.pointer)
        }
        _ = owner.wait(timeout: .seconds(10)) { $0 == 1 }
        let owned = await TestThreads.run(name: "glib-second") { () -> GLibBridgeError? in
            do throws(GLibBridgeError) {
                let bridge = try GLibBridge.attach(context: context.pointer)
                bridge.invalidate()
                return nil
            } catch {
                return error
            }
        }
        owner.update { $0 = 2 }
        _ = holder.join(timeout: .seconds(10))
        #expect(owned == .contextOwnedElsewhere)
        #expect(GLibBridgeError.contextOwnedElsewhere.description.contains("another thread owns"))
    }
}
#endif
