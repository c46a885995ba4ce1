import CRunLoopMonitor
import Foundation
import Glibc
import RunLoopKit
import SharedTestSupport
import Synchronization
import class RunLoopKit.RunLoop
@testable import RunLoopMonitor
import Testing

/// A stall monitor in a real program: it must not change what it watches, and must blame the
/// right callout and function. The scenarios run in MonitorProbe (Tests/MonitorProbe/Trust.swift),
/// a process of their own, here built in debug; CI runs the same probe built in release.
@Suite(.serialized, .exclusive(.monitor)) struct MonitorTrustTests {
@Test(arguments: ["reads", "usleep", "sleep", "tasks", "exit", "backoff"])
func aRealProgramIsWatchedWithoutChangingIt(scenario: String) throws {
    let probe = try runMonitorProbe(["trust", scenario])
    #expect(probe.status == 0, "\(probe.stdout)\n\(probe.stderr)")
    #expect(!probe.stdout.contains("FAIL"), "\(probe.stdout)")
    #expect(probe.stdout.contains("ok: "), "\(probe.stdout)")
}

/// fork() while another thread is mid-capture or mid-symbolication: every child can capture
/// and run a monitor (before, a child died on the capture lock its parent's thread held:
/// "Unknown error occurred while attempting to acquire a Mutex").
///
/// Not under ThreadSanitizer: its runtime is not fork-safe in a multi-threaded parent (a child
/// can block in the runtime's own state, whatever the monitor does: 1 of 20 children hung
/// there once, in its first capture). The monitor's locks are checked without a sanitizer and
/// under AddressSanitizer.
@Test(.disabled(if: underThreadSanitizer, "ThreadSanitizer's runtime is not fork-safe in a multi-threaded parent"))
func twentyChildrenForkedMidCaptureAllCaptureAndMonitor() throws {
    let probe = try runMonitorProbe(["fork-captures"], timeout: .seconds(120))
    #expect(probe.status == 0, "\(probe.stdout)\n\(probe.stderr)")
    #expect(probe.stdout.contains("children ok 20/20"), "\(probe.stdout)")
}

/// The capture signal reset to its default action, or taken by another handler, after
/// ThreadStack installed its own: a clear error, no signal sent, and the process lives
/// (before, the next capture killed it with "Real-time signal 7").
@Test func aReplacedHandlerIsAClearErrorNotAKill() throws {
    let probe = try runMonitorProbe(["handler-replaced"])
    #expect(probe.status == 0, "\(probe.stderr)")
    #expect(probe.stdout.contains("installed: stack"))
    #expect(probe.stdout.contains("default: the handler of signal"), "\(probe.stdout)")
    #expect(probe.stdout.contains("foreign: the handler of signal"), "\(probe.stdout)")
    #expect(probe.stdout.contains("alive"))
}

static func frame(_ symbol: String, image: String = "/app/bin", file: String? = "/src/App/Work.swift") -> StackFrame {
    StackFrame(address: UInt64(abs(symbol.hashValue) % 100_000), image: image, imageOffset: 0, symbol: symbol, file: file, line: 1)
}

/// A callout where `slowB` is sampled 6 times, split over two innermost leaves
/// (`clock_gettime` and `swift_get_time`), and `slowA` 3 times identically: the most frequent
/// identical stack is `slowA`'s, but the call tree blames `slowB`.
@Test func theCallTreeBlamesTheHeaviestPathNotTheMostFrequentStack() {
    let base = [Self.frame("callout()"), Self.frame("RunLoop.doBlocks(_:)", file: "/x/Sources/RunLoopKit/Core/RunLoop+Run.swift"),
                Self.frame("start_thread", image: "/lib/x86_64-linux-gnu/libc.so.6", file: nil)]
    let clock = Self.frame("clock_gettime", image: "/lib/x86_64-linux-gnu/libc.so.6", file: nil)
    let swiftTime = Self.frame("swift_get_time", image: "/usr/lib/swift/linux/libswiftCore.so", file: nil)
    let samples = [
        StackSample(count: 3, frames: [clock, Self.frame("slowA()")] + base),
        StackSample(count: 3, frames: [clock, Self.frame("slowB()")] + base),
        StackSample(count: 3, frames: [swiftTime, Self.frame("slowB()")] + base),
    ]
    #expect(StackSample.culprit(in: samples) == "slowA()")  // the old rule
    let tree = CallTree(samples)
    #expect(tree.sampleCount == 9)
    #expect(tree.blamed == "slowB()")
    #expect(tree.heaviestPath.map(\.name) == ["start_thread", "RunLoop.doBlocks(_:)", "callout()", "slowB()"])
    #expect(tree.folded.split(separator: "\n").sorted() == [
        "start_thread;RunLoop.doBlocks(_:);callout();slowA();clock_gettime 3",
        "start_thread;RunLoop.doBlocks(_:);callout();slowB();clock_gettime 3",
        "start_thread;RunLoop.doBlocks(_:);callout();slowB();swift_get_time 3",
    ])
    var report = StallReport(
        id: "x", processID: 1, threadName: "t", threadID: 2, mode: "m", phase: "blocks", startedAt: Date(),
        duration: .seconds(1), threadCPUTime: .seconds(1), cpuMeasuredOver: .seconds(1), stacks: [], sampleCount: 9)
    report.attribute(samples)
    #expect(report.stuckIn == "slowB()")
    #expect(report.foldedStacks == tree.folded)
}

/// Ties: the child seen first wins; a path stops where no child holds half the samples; a
/// library frame (RunLoopKit's, the C library's) is never blamed.
@Test func theBlameRuleOnTiesAndSplits() {
    let main = Self.frame("main")
    let a = StackSample(count: 2, frames: [Self.frame("a()"), main])
    let b = StackSample(count: 2, frames: [Self.frame("b()"), main])
    #expect(CallTree([a, b]).blamed == "a()")
    let c = StackSample(count: 1, frames: [Self.frame("c()"), main])
    #expect(CallTree([a, b, c]).blamed == "main")  // neither a nor b holds half of 5
    let library = StackSample(count: 5, frames: [Self.frame("RunLoop.run()", file: "/p/Sources/RunLoopKit/Core/RunLoop.swift"), main])
    #expect(CallTree([library]).blamed == "main")
}

/// Most samples cut short by the unwinder inside the Swift runtime (no frame of the application,
/// a root of their own): the report blames the application's frame the complete samples show,
/// not a runtime function (seen: `_swift_getGenericMetadata` blamed for a JSON encode in -O).
@Test func samplesCutShortInTheRuntimeDoNotTakeTheBlame() {
    let runtime = "/opt/swift/usr/lib/swift/linux/libswiftCore.so"
    let cut = StackSample(count: 6, frames: [
        Self.frame("swift::MetadataCacheKey::operator==(swift::MetadataCacheKey const&) const", image: runtime, file: nil),
        Self.frame("_swift_getGenericMetadata(swift::MetadataRequest)", image: runtime, file: nil),
    ])
    let whole = StackSample(count: 4, frames: [Self.frame("JSONEncoder.encode(_:)", image: "/usr/lib/libFoundationEssentials.so", file: nil), Self.frame("handleHugeJSONEncode()"), Self.frame("main")])
    #expect(CallTree([cut, whole]).blamed == nil)
    var report = StallReport(
        id: "x", processID: 1, threadName: "t", threadID: 1, mode: "m", phase: "tick", startedAt: Date(),
        duration: .milliseconds(300), threadCPUTime: .zero, cpuMeasuredOver: .zero, stacks: [], sampleCount: 10)
    report.attribute([cut, whole])
    #expect(report.stuckIn == "handleHugeJSONEncode()")
}
}

extension MonitorTrustTests {
    /// The flame graph page: one box per node of the folded stacks, widths by samples, the blamed
    /// function outlined, and names escaped (a label or symbol cannot inject markup).
    @Test func theFlameGraphPageDrawsTheFoldedStacksAndEscapesNames() {
        let folded = "main;work();slowB() 6\nmain;work();slowA() 3\nmain;<script>alert(1)</script> 1\nnot a line\n"
        let page = FlameGraphPage.html(folded: folded, title: "a \"title\" <b>", blamed: "slowB()")
        #expect(page.contains("data-samples=\"10\""))
        #expect(page.contains("data-name=\"slowB()\" data-samples=\"6\" data-blamed=\"true\""))
        #expect(page.contains("data-name=\"slowA()\" data-samples=\"3\">"))
        #expect(!page.contains("<script>"))
        #expect(page.contains("&lt;script&gt;alert(1)&lt;/script&gt;"))
        #expect(page.contains("a &quot;title&quot; &lt;b&gt;"))
        // all, main, work(), slowB(), slowA(), the script-named leaf.
        #expect(page.contains("data-boxes=\"6\""))
    }
}

extension MonitorTrustTests {
    /// Two threads call stop() at once during a stall: each returns only when the monitor has
    /// stopped, so no handler call comes after either returns (before, the second caller could
    /// return while the threads still ran, and the cut-short report came after it).
    final class Returns: Sendable {
        let times = Mutex<[ContinuousClock.Instant]>([])
    }

    @Test func concurrentStopsBothWaitForTheMonitor() throws {
        for _ in 0..<10 {
            let worker = PermanentThread(name: "stop-race")
            let lastHandlerCall = Mutex<ContinuousClock.Instant?>(nil)
            let began = DispatchSemaphore(value: 0)
            let monitor = StallMonitor(
                loop: worker.loop, threshold: .milliseconds(30), sampleInterval: .milliseconds(5), backoff: .none, logger: nil)
            monitor.start { event in
                if case .began = event { began.signal() }
                usleep(2_000)  // a handler that takes a moment: the window the second stop() fell into
                lastHandlerCall.locked { $0 = .now }
            }
            let release = Atomic<Bool>(false)
            try worker.execute { while !release.load(ordering: .relaxed) { usleep(1_000) } }
            #expect(began.wait(timeout: .now() + 10) == .success)
            // One record per stopper: each is written by its own thread and read after the join.
            let returned = [Returns(), Returns()]
            let stoppers = returned.map { record in
                NamedThread(name: "stopper") {
                    monitor.stop()
                    record.times.locked { $0.append(.now) }
                }
            }
            for stopper in stoppers { stopper.join() }
            release.store(true, ordering: .relaxed)
            worker.stop()
            let firstReturn = try #require(returned.compactMap { $0.times.locked { $0.first } }.min())
            let last = try #require(lastHandlerCall.locked { $0 })
            #expect(last <= firstReturn, "the handler ran after a stop() had returned")
        }
    }
}

extension MonitorTrustTests {
    /// A thread with little stack left (a C library's PTHREAD_STACK_MIN thread) survives captures:
    /// the handler, which runs on that stack, keeps its unwinder's tables off it.
    @Test func aSmallStackThreadSurvivesCaptures() throws {
        let probe = try runMonitorProbe(["small-stack"])
        #expect(probe.status == 0, "\(probe.stdout)\n\(probe.stderr)")
        // Under AddressSanitizer (CI's ASan step) the probe says it did not run: redzones make
        // every frame larger. Anywhere else it must have captured.
        #expect(probe.stdout.contains("captured 50/50") || (underASan && probe.stdout.contains("skipped under AddressSanitizer")), "\(probe.stdout)")
    }
}

extension MonitorTrustTests {
    /// process_vm_readv of this process's own memory succeeds every time: its `flags` is a
    /// full-width zero (an `int` 0 through the variadic syscall() left the upper half undefined,
    /// and the kernel refused it with EINVAL in about half the calls of a debug build).
    @Test func processVMReadvWorksEveryTime() {
        let failures = (0..<1_000).filter { _ in !crlm_safe_reads_available() }.count
        #expect(failures == 0)
    }
}

extension MonitorTrustTests {
    /// The loop publishes each callout's kind and its item's label, seen here from inside the
    /// callouts, and its own work between them.
    @Test func calloutsArePublished() throws {
        let worker = PermanentThread(name: "callouts")
        defer { worker.stop() }
        let loop = worker.loop
        let inBlock = try worker.executeAndWait { loop.calloutSnapshot }
        #expect(inBlock.kind == .block && inBlock.label == nil && inBlock.description == "block")
        let seen = SnapshotBox()
        let source = RunLoopSource { seen.value.locked { $0 = loop.calloutSnapshot } }
        source.label = "labelled source"
        loop.add(source, forMode: .default)
        source.signal()
        loop.wakeUp()
        try waitFor { seen.value.locked { $0 } != nil }
        let inSource = try #require(seen.value.locked { $0 })
        #expect(inSource.kind == .source && inSource.label == "labelled source")
        #expect(inSource.sequence != inBlock.sequence)
        let between = loop.calloutSnapshot
        #expect(between.kind == .none)  // the loop's own work (or asleep) after the callout
        source.invalidate()
    }

    final class SnapshotBox: Sendable {
        let value = Mutex<RunLoop.CalloutSnapshot?>(nil)
    }
}
