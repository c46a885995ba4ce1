import CRunLoopKit
import Glibc
import SharedTestSupport
import Synchronization
import Testing

import class RunLoopKit.RunLoop

@testable import RunLoopKit

// LoopBound<Value>: loop-confined state that @Sendable callbacks can capture.

@Suite struct LoopBoundTests {
    /// On the loop's thread, the value is read and written from any of the loop's callbacks.
    @Test func theLoopsCallbacksShareTheValue() async {
        let outcome = await TestThreads.run(name: "rlk-bound") { () -> ([Int], Bool) in
            let loop = RunLoop.current
            let ticks = LoopBound([Int](), on: loop)
            loop.schedule(after: .milliseconds(1), repeating: .milliseconds(1)) { timer in
                ticks.value.append(ticks.value.count)
                if ticks.value.count == 5 { timer.invalidate() }
            }
            loop.perform { ticks.withValue { $0.append(-1) } }
            loop.run(mode: .default, for: .seconds(10))
            return (ticks.value, ticks.isAccessible)
        }
        #expect(outcome?.0 == [-1, 1, 2, 3, 4])
        #expect(outcome?.1 == true)
    }

    /// A box made on one thread for another thread's loop is usable there (only access is
    /// confined), and reports itself inaccessible elsewhere.
    @Test func aBoxMadeElsewhereIsUsableOnItsLoop() async {
        let outcome = await TestThreads.run(name: "rlk-bound-own") { () -> (Bool, Int?) in
            let result = Mutex<Int?>(nil)
            let release = TestEvent()
            guard
                let owner = TestThread.hostingLoop(
                    name: "rlk-bound-loop", setup: { $0.add(RunLoopSource {}, forMode: .default) },
                    run: { loop in
                        while !release.read({ $0 }) { loop.run(mode: .default, for: .milliseconds(5)) }
                    })
            else { return (true, nil) }
            let loop = owner.loop
            let box = LoopBound(41, on: loop)
            let accessibleHere = box.isAccessible
            loop.perform {
                box.value += 1
                result.locked { $0 = box.value }
                release.fire()
            }
            _ = release.wait(timeout: .seconds(10))
            _ = owner.join(timeout: .seconds(10))
            return (accessibleHere, result.locked { $0 })
        }
        #expect(outcome?.0 == false)
        #expect(outcome?.1 == 42)
    }

    /// Reading the value on another thread stops the process with a message that names the box's
    /// type and member, the loop, and both threads by name and tid.
    @Test func accessOffTheLoopThreadStopsTheProcessNamingTheLoopAndBothThreads() async {
        let result = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
            loopBoundForeignAccessChild()
        }
        guard let result else { return }
        let stderr = String(decoding: result.standardErrorContent, as: UTF8.self)
        guard let line = stderr.split(separator: "\n").first(where: { $0.hasPrefix("RLK-BOUND owner=") }) else {
            Issue.record("the child wrote no thread ids; stderr:\n\(stderr)")
            return
        }
        var ids: [String: String] = [:]
        for field in line.split(separator: " ").dropFirst() {
            let parts = field.split(separator: "=")
            if parts.count == 2 { ids[String(parts[0])] = String(parts[1]) }
        }
        let comment = Comment(rawValue: "stderr:\n\(stderr)")
        #expect(!stderr.contains("RLK-BOUND read"), comment)
        #expect(stderr.contains("LoopBound<Int>.value accessed on thread 'rlk-intruder'"), comment)
        #expect(stderr.contains("thread 'rlk-intruder' (tid \(ids["intruder"] ?? "?"))"), comment)
        #expect(stderr.contains("belongs to <RunLoop 0x"), comment)
        #expect(stderr.contains("thread 'rlk-owner' (tid \(ids["owner"] ?? "?"))"), comment)
    }
}

/// The exit test's child: a box owned by thread 'rlk-owner''s loop, read on 'rlk-intruder'.
func loopBoundForeignAccessChild() {
    let published = TestMonitor<LoopBound<Int>?>(nil)
    let release = TestEvent()
    let owner = TestThread(name: "rlk-owner") {
        published.update { $0 = LoopBound(7, on: RunLoop.current) }
        _ = release.wait(timeout: .seconds(60))
    }
    let ownerTID = owner.tid() ?? -1
    guard published.wait(timeout: .seconds(10), until: { $0 != nil }), let box = published.read({ $0 }) else {
        writeToStandardError("the owner thread did not start\n")
        exit(0)  // the expected failure exit does not happen: the test fails
    }
    let intruder = TestThread(name: "rlk-intruder") {
        writeToStandardError("RLK-BOUND owner=\(ownerTID) intruder=\(crlk_gettid())\n")
        let value = box.value
        writeToStandardError("RLK-BOUND read \(value)\n")
    }
    _ = intruder.join(timeout: .seconds(30))
    release.fire()
    exit(0)
}
