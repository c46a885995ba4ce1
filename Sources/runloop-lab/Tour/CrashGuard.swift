import ArgumentParser
import CRunLoopLab
import Foundation
import RunLoopKit
import Synchronization

import class RunLoopKit.RunLoop

/// Experiment 18 (seed 002): the seed's crash guard — after a fatal signal, keep the crashed
/// thread's loop running in all its modes — opt-in and bounded, shown in child processes.
struct CrashGuardExperiment: Experiment {
    let title = "Crash guard: the loop keeps running for a grace period after a fatal signal"
    let seed = Seed.cite(2)
    let seedSays = """
        Seed 002 (Crash 防护): after a crash is caught, run the current loop forever — while (1) \
        { for each mode but kCFRunLoopCommonModes: CFRunLoopRunInMode(mode, 0.1, false) } — and \
        names the costs: the crashed call never returns (a leak) and "会增加业务异常风险" (it adds \
        business risk). Running it from a signal handler, with a deadline, is ours. The guard \
        stays bounded and lab-only: seed 002's unbounded version is deliberately not offered, \
        neither here nor in the libraries.
        """
    let summary = """
        The seed's "Crash 防护": when a signal handler catches a crash, it runs the loop \
        (CFRunLoopRunInMode in every mode, 0.1 s at a time) instead of letting the app die. Here \
        it is opt-in and bounded: a child process logs to a buffer flushed by a 100 ms timer and \
        crashes (a write through a null pointer, SIGSEGV) in a timer callback at 150 ms. Without \
        the guard, the line logged at 120 ms is lost. With it, the handler runs the loop in all \
        its modes for 300 ms (the flush timer writes the line), then restores the default action \
        and re-raises the signal: the child still dies of SIGSEGV.
        """

    func run() {
        for guarded in [false, true] {
            Out.subheading(guarded ? "with the guard (grace period 300 ms)" : "without the guard")
            let started = ContinuousClock.now
            let process = Process()
            process.executableURL = URL(filePath: "/proc/self/exe")
            process.arguments = ["crash-child"] + (guarded ? ["--guard"] : [])
            var environment = ProcessInfo.processInfo.environment
            environment["SWIFT_BACKTRACE"] = "enable=no"  // no crash report from the Swift runtime
            // Under the sanitizers (the test suite runs the lab so): the crash is the default
            // action's, not a sanitizer report, and the guard is signal-unsafe on purpose.
            for (key, extra) in [("ASAN_OPTIONS", "handle_segv=0"), ("TSAN_OPTIONS", "handle_segv=0:report_signal_unsafe=0")] {
                environment[key] = (environment[key].map { $0 + ":" } ?? "") + extra
            }
            process.environment = environment
            let output = Pipe()
            process.standardOutput = output
            process.standardError = output
            do { try process.run() } catch {
                Out.line("cannot start the child: \(error)")
                return
            }
            let data = output.fileHandleForReading.readDataToEndOfFile()
            process.waitUntilExit()
            let took = ContinuousClock.now - started
            for line in String(decoding: data, as: UTF8.self).split(separator: "\n") {
                Out.line("child | \(line)")
            }
            let how =
                process.terminationReason == .uncaughtSignal
                ? "killed by signal \(process.terminationStatus)\(process.terminationStatus == SIGSEGV ? " (SIGSEGV)" : "")"
                : "exited with status \(process.terminationStatus)"
            Out.line("the child was \(how) after \(TourLog.ms(took)) (process start included)")
        }
        Out.conclusion(
            "the guard bought the pending work one more flush, and the crash still ended the process. Its "
                + "risks, as the seed states them: the crashed call never returns, so its stack and whatever "
                + "it held stay (a leak), and the app runs on in a state nobody planned for. On Linux, add: "
                + "the loop runs inside a signal handler, which is not async-signal-safe; if the crash came "
                + "while a lock was held (malloc's, the loop's own), the loop deadlocks, so an alarm ends "
                + "the process a second after the grace period whatever happens.")
    }
}

/// `runloop-lab crash-child [--guard]`: the crashing child of ``CrashGuardExperiment``.
struct CrashChildCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "crash-child", abstract: "The crash guard experiment's child process (crashes on purpose).",
        shouldDisplay: false)

    @Flag(name: .customLong("guard"), help: "Install the crash guard.")
    var guarded = false

    func run() throws {
        let start = ContinuousClock.now
        // Unbuffered: a crash must not take buffered lines with it.
        @Sendable func say(_ text: String) {
            let line = Array("\(TourLog.ms(.now - start, width: 6))  \(text)\n".utf8)
            _ = line.withUnsafeBytes { write(1, $0.baseAddress, $0.count) }
        }
        let thread = LoopThread(name: "app") { loop in
            let buffer = Mutex<[String]>([])
            @Sendable func log(_ text: String) { buffer.locked { $0.append(text) } }
            let flush = RunLoopTimer(after: .milliseconds(100), repeating: .milliseconds(100)) { _ in
                for line in buffer.locked({ lines in defer { lines = [] }; return lines }) {
                    say("flush: \(line)")
                }
            }
            loop.add(flush, forMode: .common)
            loop.add(RunLoopTimer(after: .milliseconds(20)) { _ in log("user tapped Buy") }, forMode: .default)
            loop.add(RunLoopTimer(after: .milliseconds(120)) { _ in log("payment request sent") }, forMode: .default)
            loop.add(
                RunLoopTimer(after: .milliseconds(150)) { _ in
                    say("crash: a timer callback writes through a null pointer")
                    UnsafeMutablePointer<Int>(bitPattern: 0x10)!.pointee = 42
                }, forMode: .default)
            if guarded {
                CrashGuard.install(on: loop, gracePeriod: .milliseconds(300)) { signal in
                    say("crash guard: signal \(signal) on thread 'app'; running the loop in all its modes for 300 ms")
                } after: {
                    say("crash guard: grace period over; default action restored, signal re-raised")
                }
            }
            loop.run(mode: .default, for: .seconds(2))
        }
        thread.join()
        say("no crash?")
    }
}

/// The seed's crash guard, opt-in and bounded: on a fatal signal (SIGSEGV, SIGBUS, SIGILL,
/// SIGFPE, SIGABRT, SIGTRAP) on the guarded loop's thread, the handler runs the loop in each of
/// its modes, 100 ms at a time, for the grace period; then it restores the signal's default
/// action and raises it again, so the process still dies of it. An alarm set on entry ends the
/// process one second after the grace period (rounded up to whole seconds) if the loop hangs. A fatal signal on any other
/// thread, or a second one, gets the default action at once.
///
/// Running a loop in a signal handler is not async-signal-safe (nothing about a run is): this is
/// a last resort with the risks the experiment states, kept here, in the lab, on purpose.
enum CrashGuard {
    static let signals: [Int32] = [SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT, SIGTRAP]

    /// What the handler needs. Written once, before the handlers are installed, and read only in
    /// the handler: `nonisolated(unsafe)` is safe because sigaction(2) orders the writes before any
    /// delivery, and nothing writes them again.
    nonisolated(unsafe) private static var loop: RunLoop?
    nonisolated(unsafe) private static var thread: Int32 = 0
    nonisolated(unsafe) private static var grace = Duration.zero
    nonisolated(unsafe) private static var onCrash: (@Sendable (Int32) -> Void)?
    nonisolated(unsafe) private static var afterGrace: (@Sendable () -> Void)?
    /// Set by the first crash (the loop's thread only): a second one takes the default action.
    nonisolated(unsafe) private static var entered = false

    /// Guards `loop`, on its own thread, for `gracePeriod`.
    static func install(
        on loop: RunLoop, gracePeriod: Duration, _ onCrash: @escaping @Sendable (Int32) -> Void,
        after afterGrace: @escaping @Sendable () -> Void
    ) {
        fatalPrecondition(loop.isCurrent, "CrashGuard.install runs on the guarded loop's thread")
        Self.loop = loop
        Self.thread = crll_gettid()
        Self.grace = gracePeriod
        Self.onCrash = onCrash
        Self.afterGrace = afterGrace
        for signal in signals {
            var action = sigaction()
            action.__sigaction_handler.sa_handler = CrashGuard.handle
            sigemptyset(&action.sa_mask)
            action.sa_flags = 0
            sigaction(signal, &action, nil)
        }
    }

    private static let handle: @convention(c) (Int32) -> Void = { signal in
        guard crll_gettid() == CrashGuard.thread, !CrashGuard.entered, let loop = CrashGuard.loop else {
            CrashGuard.reraise(signal)
            return
        }
        CrashGuard.entered = true
        let (seconds, fraction) = CrashGuard.grace.components
        alarm(UInt32(clamping: seconds + (fraction > 0 ? 1 : 0) + 1))
        CrashGuard.onCrash?(signal)
        let end = ContinuousClock.now + CrashGuard.grace
        while ContinuousClock.now < end {
            var ran = false
            for mode in loop.allModes where mode != .common {
                let left = ContinuousClock.now.duration(to: end)
                guard left > .zero else { break }
                ran = loop.run(mode: mode, for: min(.milliseconds(100), left)) != .finished || ran
            }
            if !ran { usleep(10_000) }  // every mode is empty: nothing to run, nothing to spin on
        }
        CrashGuard.afterGrace?()
        CrashGuard.reraise(signal)
    }

    /// Restores the default action and raises `signal` again: blocked while this handler runs, it
    /// is delivered when the handler returns, and ends the process.
    private static func reraise(_ signal: Int32) {
        Glibc.signal(signal, SIG_DFL)
        raise(signal)
    }
}
