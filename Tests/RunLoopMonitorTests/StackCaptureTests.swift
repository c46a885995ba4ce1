import Testing
@testable import RunLoopMonitor

@Suite struct StackCaptureTests {
    @Test func capturesOwnThread() throws {
        let frames = try ThreadStack.capture(threadID: currentThreadID())
        #expect(!frames.isEmpty)
    }
}
