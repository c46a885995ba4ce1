import RunLoopMonitor
import Testing

/// The system calls an idle epoll loop waits in come from the C library's headers: on x86_64
/// the numbers the kernel's table gives (epoll_wait 232, epoll_pwait 281, epoll_pwait2 441).
struct LoopWaitCallsTests {
    @Test func theEpollWaitCallsOfThisArchitecture() {
        #if arch(x86_64)
        #expect(LoopWait.epollWaitCalls == [232, 281, 441])
        #elseif arch(arm64)
        #expect(LoopWait.epollWaitCalls == [22, 441])
        #endif
    }
}
