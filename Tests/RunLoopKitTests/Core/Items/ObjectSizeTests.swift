import CAllocationCounter
import SharedTestSupport
import Testing

@testable import RunLoopKit

/// The size of the objects the loop allocates per item: a fired one-shot timer is freed on the
/// loop's thread, and glibc frees chunks of up to 128 bytes (120 usable) through its fast bins;
/// larger ones go through a coalescing free that measured about a sixth of a timer's firing cost.
@Suite struct ObjectSizeTests {
    @Test func timerFitsInAFastBinChunk() {
        let timer = RunLoopTimer(fireAt: .now) { _ in }
        let usable = alloc_counter_usable_size(Unmanaged.passUnretained(timer).toOpaque())
        #expect(usable <= 120, "RunLoopTimer's allocation grew to \(usable) usable bytes")
    }
}
