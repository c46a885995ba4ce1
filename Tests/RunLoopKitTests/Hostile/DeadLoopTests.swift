import Glibc
import SharedTestSupport
import Synchronization
import Testing

@testable import RunLoopKit

/// Finding 13: items added to a loop whose thread has exited. The add cannot work (the loop
/// will never run again), so it is not silent: it logs a warning that says the thread exited.
/// A message port on such a loop refuses messages (`SendError.invalidated`) instead of
/// accepting messages it will never deliver — whether it was added after the exit or was on
/// the loop when its thread exited.
///
/// In the serialized ``Robustness`` suite, with the other thread-exit tests. A warning counts
/// when it says "exited" and names the loop or the item by address (as the library's other
/// messages do).
@Suite(.serialized, .exclusive(.robustness)) struct HostileDeadLoopTests {
    /// A loop whose thread has exited (and torn it down).
    static func deadLoop() async -> RunLoop? {
        let loop = await TestThreads.run(name: "hl-dead") { () -> RunLoop in
            let loop = RunLoop.current
            loop.run(mode: .default, for: .milliseconds(1))
            return loop
        }
        if loop == nil { Issue.record("the loop thread did not exit") }
        return loop
    }

    /// The warnings logged so far that say "exited" and name `loop` or `item`.
    static func exitWarnings(_ loop: RunLoop, _ item: AnyObject) -> Int {
        let names = [hexAddress(loop), hexAddress(item)]
        return TestLog.messages(containing: "exited").filter { entry in
            entry.level >= .warning && names.contains { entry.message.contains($0) }
        }.count
    }

    enum Item: String, CaseIterable, Sendable {
        case timer, source, descriptorSource, port, observer
    }

    @Test(arguments: Item.allCases)
    func addingAnItemToALoopWhoseThreadExitedLogsAWarning(_ kind: Item) async {
        _ = TestLog.recorder
        guard let loop = await Self.deadLoop() else { return }
        var fds: [Int32] = [-1, -1]
        precondition(pipe(&fds) == 0, "pipe failed: errno \(errno)")
        defer {
            close(fds[0])
            close(fds[1])
        }
        let item: AnyObject
        switch kind {
        case .timer: item = RunLoopTimer(after: .seconds(1)) { _ in }
        case .source: item = RunLoopSource {}
        case .descriptorSource:
            guard let source = try? FileDescriptorSource(descriptor: fds[0], handler: { _, _ in }) else {
                Issue.record("FileDescriptorSource on a pipe failed")
                return
            }
            item = source
        case .port: item = MessagePort<Int> { _ in }
        case .observer: item = RunLoopObserver(activities: .entry) { _, _ in }
        }
        let before = Self.exitWarnings(loop, item)
        switch item {
        case let timer as RunLoopTimer: loop.add(timer, forMode: .default)
        case let source as RunLoopSource: loop.add(source, forMode: .default)
        case let source as FileDescriptorSource: loop.add(source, forMode: .default)
        case let port as MessagePort<Int>: loop.add(port, forMode: .default)
        case let observer as RunLoopObserver: loop.add(observer, forMode: .default)
        default: Issue.record("unexpected item \(item)")
        }
        let after = Self.exitWarnings(loop, item)
        #expect(after > before, "adding a \(kind) to a loop whose thread exited logged no warning")
        if let source = item as? FileDescriptorSource { source.invalidate() }
    }

    /// Added to a loop whose thread has exited, a port refuses messages.
    @Test func aPortAddedToALoopWhoseThreadExitedRefusesMessages() async {
        guard let loop = await Self.deadLoop() else { return }
        let delivered = Atomic<Int>(0)
        let port = MessagePort<Int> { _ in delivered.add(1, ordering: .relaxed) }
        loop.add(port, forMode: .default)
        Self.expectRefused(port)
        #expect(delivered.load(ordering: .relaxed) == 0)
    }

    /// A port on a loop whose thread then exits refuses later messages.
    @Test func aPortWhoseLoopsThreadExitedRefusesLaterMessages() async {
        let port = MessagePort<Int> { _ in }
        let ran = await TestThreads.run(name: "hl-port-exit") { () -> Bool in
            let loop = RunLoop.current
            loop.add(port, forMode: .default)
            try? port.send(1)
            loop.run(mode: .default, for: .milliseconds(20), returnAfterSourceHandled: true)
            return loop.contains(port, inMode: .default)
        }
        #expect(ran == true, "the port was on the loop while its thread ran")
        Self.expectRefused(port)
    }

    static func expectRefused(_ port: MessagePort<Int>, sourceLocation: SourceLocation = #_sourceLocation) {
        do {
            try port.send(42)
            Issue.record(
                "send accepted a message that no loop will ever deliver (\(port.queuedCount) queued)",
                sourceLocation: sourceLocation)
        } catch {
            guard case .invalidated(let message) = error else {
                Issue.record("send threw \(error), not .invalidated", sourceLocation: sourceLocation)
                return
            }
            #expect(message == 42, sourceLocation: sourceLocation)
        }
    }
}
