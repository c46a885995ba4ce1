import Foundation
import RunLoopKit
import RunLoopMonitor
import RunLoopTesting
import SharedTestSupport
import Synchronization
import Testing

import class RunLoopKit.RunLoop

/// The trace recorder: what a recorded run holds, its JSON export, and bad input.
@Suite("TraceRecorder")
struct TraceRecorderTests {
    /// The observer-log experiment (tour 1, there a 100 ms timer and a 350 ms run): an
    /// all-activities observer and a 20 ms repeating timer, run for 70 ms. Returns the trace and
    /// the activities the observer saw, in order.
    ///
    /// On virtual time (`RunLoopTesting`) the run is exact whatever the machine's load: the
    /// timer fires at 20, 40 and 60 ms and the deadline ends the run at 70. On the real clock a
    /// loaded machine may wake the loop late, past a tick or the deadline.
    static func recordObserverLog(
        interval: Duration = .milliseconds(20), runFor: Duration = .milliseconds(70), onVirtualTime: Bool = false
    ) -> (Trace, [RunLoop.Activity], RunLoop.RunResult) {
        let recorder = try! TraceRecorder(capacityPerLoop: 4096)
        let log = EventLog<RunLoop.Activity>()
        let result = Mutex<RunLoop.RunResult?>(nil)
        let run: @Sendable () -> Void = {
            let loop = RunLoop.current
            recorder.record(loop)
            let observer = RunLoopObserver(activities: .allActivities) { _, activity in log.append(activity) }
            observer.label = "log observer"
            let timer = RunLoopTimer(after: interval, repeating: interval) { _ in }
            timer.label = "repeating timer"
            loop.add(observer, forMode: .default)
            loop.add(timer, forMode: .default)
            let outcome = loop.run(mode: .default, for: runFor)
            result.locked { $0 = outcome }
            timer.invalidate()
            observer.invalidate()
        }
        let thread = NamedThread(name: "observer-log") {
            if onVirtualTime {
                withVirtualTime { _ in run() }
            } else {
                run()
            }
        }
        thread.join()
        return (recorder.snapshot(), log.all, result.locked { $0! })
    }

    @Test("a recorded observer-log run has the passes, sleeps and wake reasons of the text trace")
    func observerLogMatchesTheTextTrace() throws {
        let (trace, activities, result) = Self.recordObserverLog(onVirtualTime: true)
        #expect(result == .timedOut)
        let lane = try #require(trace.lanes.first)
        #expect(lane.threadName == "observer-log")
        let spans = lane.spans
        // One run, in .default, ending as the run did.
        let runs = spans.filter { $0.kind == .run }
        #expect(runs.map(\.name) == [RunLoop.Mode.default.rawValue])
        #expect(runs.first?.detail == "timedOut")
        // Every observer call is a callout naming the observer, with its activity, in order.
        let observerCalls = spans.filter { $0.kind == .callout && $0.name == "log observer" }
        #expect(observerCalls.map(\.detail) == activities.map { $0.description })
        // Passes: one per beforeTimers; sleeps: one per beforeWaiting, each woken as the text trace
        // says: the timer, then the run's deadline.
        let passes = Set(spans.filter { $0.kind != .counter }.flatMap { Array($0.firstPass...$0.lastPass) })
        #expect(passes.count == activities.filter { $0 == .beforeTimers }.count)
        let sleeps = spans.filter { $0.kind == .sleep }
        #expect(sleeps.count == activities.filter { $0 == .beforeWaiting }.count)
        let timerFires = spans.filter { $0.kind == .callout && $0.name == "repeating timer" }.count
        #expect(sleeps.map(\.detail) == Array(repeating: "timer", count: timerFires) + ["timeout"])
        #expect(timerFires == 3)
        // The sleeps take the time: on virtual time, all 70 ms of the run (a pass takes none).
        let slept = sleeps.reduce(Duration.zero) { $0 + $1.duration }
        #expect(slept == .milliseconds(70))
    }

    @Test("the JSON export parses and every complete event nests within its thread")
    func jsonNests() throws {
        let (trace, _, _) = Self.recordObserverLog()
        let json = trace.chromeTraceJSON()
        let count = try TimelinePage.validate(json)
        #expect(count > 20)
        try Self.checkNesting(json)
    }

    /// Parses Chrome trace JSON and checks that, per thread, complete events form a tree.
    static func checkNesting(_ json: [UInt8]) throws {
        let object = try JSONSerialization.jsonObject(with: Data(json)) as! [String: Any]
        let events = object["traceEvents"] as! [[String: Any]]
        var byThread: [Int: [(ts: Double, end: Double, name: String)]] = [:]
        for event in events where event["ph"] as? String == "X" {
            let ts = (event["ts"] as! NSNumber).doubleValue
            let dur = (event["dur"] as! NSNumber).doubleValue
            byThread[(event["tid"] as! NSNumber).intValue, default: []].append((ts, ts + dur, event["name"] as! String))
        }
        #expect(!byThread.isEmpty)
        for (tid, spans) in byThread {
            let sorted = spans.sorted { $0.ts != $1.ts ? $0.ts < $1.ts : $0.end > $1.end }
            var stack: [(ts: Double, end: Double, name: String)] = []
            for span in sorted {
                // Microseconds with three decimals, summed in doubles: a nanosecond of slack.
                while let top = stack.last, top.end <= span.ts + 0.0015 { stack.removeLast() }
                if let parent = stack.last {
                    #expect(span.end <= parent.end + 0.0015, "thread \(tid): \(span) overlaps \(parent) without nesting")
                }
                stack.append(span)
            }
        }
    }

    @Test("a ring size of zero, negative or too large is a clear error", arguments: [0, -1, Int.min, (1 << 24) + 1])
    func badRingSize(size: Int) {
        #expect(throws: TraceRecorder.ConfigurationError.self) { try TraceRecorder(capacityPerLoop: size) }
        do {
            _ = try TraceRecorder(capacityPerLoop: size)
        } catch {
            #expect(error.description.contains("capacityPerLoop"))
            #expect(error.description.contains("\(size)"))
        }
    }

    @Test("a hot loop's repeated callouts fold into records of up to 64 calls")
    func repeatsFold() throws {
        let recorder = try TraceRecorder(capacityPerLoop: 1024)
        let thread = NamedThread(name: "hot") {
            let loop = RunLoop.current
            recorder.record(loop)
            let count = Counter()
            let box = SourceBox()
            let source = RunLoopSource {
                if count.increment() < 640 { box.source?.signal() }
            }
            box.source = source
            source.label = "hot source"
            loop.add(source, forMode: .default)
            source.signal()
            while count.value < 640 { loop.run(mode: .default, for: .seconds(1)) }
            source.invalidate()
        }
        thread.join()
        let lane = try #require(recorder.snapshot().lanes.first)
        let calls = lane.spans.filter { $0.kind == .callout && $0.name == "hot source" }
        #expect(calls.reduce(0) { $0 + $1.calls } == 640)
        #expect(calls.count <= 640 / 64 + 2)
        #expect(calls.allSatisfy { $0.calls <= 64 })
    }
}

extension TraceRecorderTests {
    @Test("a run nested in a folded repeat nests in it: the repeat becomes its own span")
    func nestedRunInAFoldedRepeat() throws {
        let recorder = try TraceRecorder(capacityPerLoop: 1024)
        let thread = NamedThread(name: "nesting") {
            let loop = RunLoop.current
            recorder.record(loop)
            let count = Counter()
            let box = SourceBox()
            loop.add(RunLoopSource {}, forMode: "Inner")
            let source = RunLoopSource {
                let call = count.increment()
                // The third call (folded into the record of the first two) runs the loop nested.
                if call == 3 { RunLoop.current.run(mode: "Inner", for: .milliseconds(5)) }
                if call < 6 { box.source?.signal() } else { RunLoop.current.stop() }
            }
            box.source = source
            source.label = "nesting source"
            loop.add(source, forMode: .default)
            source.signal()
            while count.value < 6 { loop.run(mode: .default, for: .seconds(1)) }
            source.invalidate()
        }
        thread.join()
        let lane = try #require(recorder.snapshot().lanes.first)
        let calls = lane.spans.filter { $0.kind == .callout && $0.name == "nesting source" }
        #expect(calls.reduce(0) { $0 + $1.calls } == 6)
        let nested = try #require(lane.spans.first { $0.kind == .run && $0.name == "Inner" })
        // One record of the source holds the nested run, one level up: it starts with the third
        // call (the first two are a record of their own, ended before it), and the later repeats
        // fold into it again.
        let holders = calls.filter { $0.start <= nested.start && nested.end <= $0.end }
        #expect(holders.count == 1)
        #expect(holders.first.map { $0.depth + 1 } == nested.depth)
        #expect(calls.filter { $0.end <= nested.start }.reduce(0) { $0 + $1.calls } == 2)
    }
}

/// A count shared with a callback.
final class Counter: Sendable {
    private let storage = Atomic<Int>(0)
    func increment() -> Int { storage.add(1, ordering: .relaxed).newValue }
    var value: Int { storage.load(ordering: .relaxed) }
}

/// A source its own perform re-signals, held weakly (no cycle through the closure).
final class SourceBox: @unchecked Sendable {
    // @unchecked: set once on the loop's thread before the source is signalled, then read only
    // by the source's perform on that same thread.
    weak var source: RunLoopSource?
}

/// `TimelinePage` and `runloop-lab timeline` on files that are not good traces.
@Suite("Timeline input")
struct TimelineInputTests {
    static func bytes(_ text: String) -> [UInt8] { Array(text.utf8) }

    @Test("not ours, truncated, huge or malformed: a clear error, never a crash")
    func badInput() {
        let cases: [(String, String)] = [
            (#"{"name":"package.json","version":"1.0"}"#, "no \"traceEvents\" key"),
            (#"{"traceEvents":[{"ph":"X","ts":1,"dur":2,"name":"a"},{"ph":"X","ts":"#, "not JSON"),
            ("", "not JSON"),
            ("\u{1F}\u{8B}binary", "not JSON"),
            (#"{"traceEvents":{"ph":"X"}}"#, "not an array"),
            (#"{"traceEvents":[{"ph":"X","ts":1,"name":"a"}]}"#, "non-negative \"dur\""),
            (#"{"traceEvents":[{"ph":"i","name":"a"}]}"#, "finite numeric \"ts\""),
            (#"[{"ts":1}]"#, "no \"ph\" string"),
            (#"[1,2,3]"#, "not an object"),
            ("42", "neither an object nor an array"),
        ]
        for (text, expected) in cases {
            #expect(throws: TimelinePage.InputError.self) { try TimelinePage.validate(Self.bytes(text)) }
            do {
                _ = try TimelinePage.validate(Self.bytes(text))
            } catch {
                #expect(error.description.contains(expected), "\(text): \(error)")
            }
        }
        let big = [UInt8](repeating: UInt8(ascii: " "), count: 2048)
        #expect(throws: TimelinePage.InputError.tooLarge(bytes: 2048, limit: 1024)) {
            try TimelinePage.validate(big, limit: 1024)
        }
    }

    @Test("a trace's strings cannot end the page's script element")
    func hostileNamesStayInside() throws {
        let json = Self.bytes(#"{"traceEvents":[{"ph":"X","ts":0,"dur":1,"pid":1,"tid":1,"name":"</script><script>alert(1)</script>"}]}"#)
        let page = try TimelinePage.html(chromeTrace: json, title: "<b>title</b>")
        #expect(page.components(separatedBy: "</script>").count == 3)  // the data's and the code's ends only
        #expect(page.contains("&lt;b&gt;title&lt;/b&gt;"))
    }

    @Test("runloop-lab timeline exits non-zero with the reason on bad input, and writes a page from a good one")
    func timelineCommand() throws {
        let directory = FileManager.default.temporaryDirectory.appending(path: "timeline-\(getpid())-\(UInt32.random(in: 0...UInt32.max))")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        let bad = directory.appending(path: "bad.json")
        try Data(#"{"traceEvents":[{"ph":"X","#.utf8).write(to: bad)
        let page = directory.appending(path: "page.html")
        let failed = try runProbe("runloop-lab", ["timeline", bad.path, "-o", page.path])
        #expect(failed.status == 1)
        #expect(failed.stderr.contains("not JSON"))
        #expect(!FileManager.default.fileExists(atPath: page.path))
        let missing = try runProbe("runloop-lab", ["timeline", directory.appending(path: "none.json").path, "-o", page.path])
        #expect(missing.status == 1)
        #expect(missing.stderr.contains("cannot open"))

        let (trace, _, _) = TraceRecorderTests.recordObserverLog()
        let good = directory.appending(path: "good.json")
        try Data(trace.chromeTraceJSON()).write(to: good)
        let made = try runProbe("runloop-lab", ["timeline", good.path, "-o", page.path])
        #expect(made.status == 0, "\(made.stderr)")
        let html = try String(contentsOf: page, encoding: .utf8)
        #expect(html.contains("observer-log"))
        #expect(html.hasPrefix("<!DOCTYPE html>"))
    }
}
