import CRunLoopKit
import Glibc
import SharedTestSupport
import Synchronization
import Testing

@testable import RunLoopKit

// The robustness tests: stress, thread exit, bad input, lost wakeups (and the keep-alive, echo
// server and dead-loop suites). Their suites are marked `.exclusive(.robustness)`
// (SharedTestSupport): several load both cores for seconds or count the process's threads and
// descriptors exactly, and their bounds assume no other suite of the group runs alongside.
// Iteration counts scale with `RUNLOOPKIT_STRESS_SCALE` (default 1; 0.1 under a sanitizer) and
// time-boxed phases with `RUNLOOPKIT_STRESS_SECONDS`.

// `stressSeed()`, `secondsSince(_:)` and `writeToStandardError(_:)`: SharedTestSupport's Stress.swift.
