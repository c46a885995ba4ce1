import Foundation
import RunLoopMonitor
import SharedTestSupport
import Testing

/// The CPU monitor over many windows, and its shortest window.
@Suite(.serialized, .exclusive(.monitor)) struct CPUMonitorWindowTests {
/// 100,000 windows of a debug-built CPU monitor with a handler set (each window reads the
/// monitor's state as the monitor's thread does), then a hot thread reported through the
/// handler, then stop(): no stack overflow. Run in a probe so that a crash fails this test only.
@Test func aCPUMonitorRunsAHundredThousandWindowsAndStops() throws {
    let probe = try runMonitorProbe(["cpu-windows", "100000"], timeout: .seconds(300))
    #expect(probe.status == 0, "status \(probe.status), stderr: \(probe.stderr)")
    #expect(probe.stdout.contains("windows done"))
    #expect(probe.stdout.contains("hot reported"), "\(probe.stdout)")
    #expect(probe.stdout.contains("stopped"))
}

@Test func aCPUWindowBelowTenMillisecondsIsRaisedToTenMilliseconds() {
    #expect(CPUMonitor(window: .microseconds(1), logger: nil).window == .milliseconds(10))
    #expect(CPUMonitor(window: .milliseconds(10), logger: nil).window == .milliseconds(10))
    #expect(CPUMonitor(window: .milliseconds(250), logger: nil).window == .milliseconds(250))
}
}
