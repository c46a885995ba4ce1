#if GLib
import Glibc
import SharedTestSupport
import Testing

/// RunLoop.main drives GLib's default context on a real main thread (Tests/GLibProbe): wakeups
/// from other threads, the main queue and the main actor, a stall's report, fork(), and no
/// descriptor left behind.
///
/// Exclusive of the monitor suites: the stall scenario times a monitor.
@Suite(.serialized, .exclusive(.monitor)) struct GLibProbeTests {
    /// Runs a scenario; its `key=value` lines.
    private func probe(_ scenario: String, sourceLocation: SourceLocation = #_sourceLocation) -> [String: String]? {
        guard let output = try? runProbe("GLibProbe", [scenario], timeout: .seconds(60), sourceLocation: sourceLocation) else {
            return nil
        }
        var values: [String: String] = [:]
        for line in output.stdout.split(separator: "\n") {
            let parts = line.split(separator: "=", maxSplits: 1)
            if parts.count == 2 { values[String(parts[0])] = String(parts[1]) }
        }
        #expect(output.status == 0 && values["done"] == "true", "GLibProbe \(scenario): status \(output.status)\n\(output.stdout)\n\(output.stderr)", sourceLocation: sourceLocation)
        return values
    }

    private var fewMilliseconds: Int { Sanitizers.any ? 100_000 : 10_000 }

    /// With nothing else pending, a worker's `g_idle_add` and `g_main_context_invoke` end
    /// RunLoop.main's 5 s run within 10 ms; the invoked function runs on the main thread.
    @Test func workersWakeTheMainLoop() {
        guard let values = probe("wakeup") else { return }
        #expect(values["idle_run"] == "stopped")
        #expect(values["invoke_run"] == "stopped")
        #expect(Int(values["idle_us"] ?? "") ?? .max < fewMilliseconds, "g_idle_add: \(values["idle_us"] ?? "?") µs")
        #expect(Int(values["invoke_us"] ?? "") ?? .max < fewMilliseconds, "invoke: \(values["invoke_us"] ?? "?") µs")
        #expect(values["invoke_on_main"] == "true")
    }

    /// `DispatchQueue.main.async` and `Task { @MainActor }` from a worker run within a few
    /// milliseconds while the bridge drives GLib; a 100-step self-re-enqueuing main-queue chain
    /// completes within one run; a HIGH GLib idle that never finishes starves GLib's
    /// DEFAULT_IDLE idle but not the main queue or a loop timer.
    @Test func mainQueueAndMainActorRunBesideGLib() {
        guard let values = probe("mainqueue") else { return }
        #expect(values["run"] == "stopped", "the chain did not complete within the run")
        #expect(Int(values["async_us"] ?? "") ?? .max < fewMilliseconds, "DispatchQueue.main.async: \(values["async_us"] ?? "?") µs")
        #expect(Int(values["actor_us"] ?? "") ?? .max < fewMilliseconds, "Task { @MainActor }: \(values["actor_us"] ?? "?") µs")
        #expect(values["chain_steps"] == "100")
        #expect(Int(values["glib_ticks"] ?? "") ?? 0 >= 5, "GLib's 16 ms timeout: \(values["glib_ticks"] ?? "?")")
        #expect(Int(values["starve_high"] ?? "") ?? 0 > 100)
        #expect(values["starve_low"] == "0")
        #expect(Int(values["starve_timer"] ?? "") ?? 0 >= 8, "loop timer beside the HIGH idle: \(values["starve_timer"] ?? "?")")
        #expect(Int(values["starve_queue"] ?? "") ?? 0 > 100, "main-queue blocks beside the HIGH idle: \(values["starve_queue"] ?? "?")")
    }

    /// A GLib callback that blocks 300 ms is a stall report naming the function and, as the
    /// item, the GLib source's name.
    @Test func stallNamesTheGLibSource() {
        guard let values = probe("stall") else { return }
        #expect(values["item"] == "rlk-probe blocking timeout", "item: \(values["item"] ?? "none")")
        #expect(values["stuck_in"]?.contains("glibProbeBlockingCallback") == true, "stuck in: \(values["stuck_in"] ?? "none")")
        #expect(Int(values["duration_ms"] ?? "") ?? 0 >= 290)
    }

    /// Attach in a child of fork() is refused (`.forkedChild`); invalidating the parent's bridge
    /// there does nothing; the parent's bridge goes on.
    @Test func attachInAForkedChildIsRefused() {
        guard let values = probe("fork") else { return }
        #expect(values["child_attach"] == "forkedChild")
        #expect(values["child_invalidate"] == "ok")
        #expect(values["child_status"] == "0")
        #expect(values["parent_fired"] == "true")
        #expect(values["parent_attached"] == "true")
    }

    /// Fifty attach–drive–invalidate cycles on RunLoop.main leave no descriptor behind and the
    /// default context unowned.
    @Test func attachAndInvalidateLeaveNothingBehind() {
        guard let values = probe("lifecycle") else { return }
        #expect(values["fds_before"] != nil && values["fds_before"] == values["fds_after"], "\(values)")
        #expect(values["owner_after"] == "false")
    }
}
#endif
