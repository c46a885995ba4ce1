// swift-tools-version: 6.2
import PackageDescription

let package = Package(
    name: "RunLoopKit",
    products: [
        .library(name: "RunLoopKit", targets: ["RunLoopKit"]),
        .library(name: "RunLoopMonitor", targets: ["RunLoopMonitor"]),
        .library(name: "RunLoopScheduling", targets: ["RunLoopScheduling"]),
        .library(name: "RunLoopTesting", targets: ["RunLoopTesting"]),
        // RunLoop.main as the main actor's executor: Swift 6.3's experimental executor SPI, in a
        // product of its own so that a toolchain's change to the SPI breaks only this one.
        .library(name: "RunLoopConcurrency", targets: ["RunLoopConcurrency"]),
        // An async `main` on RunLoop.main: linking it sets the runtime's drain hook before main.
        .library(name: "RunLoopAsyncMain", targets: ["RunLoopAsyncMain"]),
        // RunLoop as an OpenCombine scheduler and a timer publisher; built only with the
        // `OpenCombine` trait, so OpenCombine never enters RunLoopKit's build.
        .library(name: "RunLoopCombine", targets: ["RunLoopCombine"]),
        // The stall monitor for SwiftNIO event loops; built only with the `SwiftNIO` trait.
        .library(name: "RunLoopMonitorNIO", targets: ["RunLoopMonitorNIO"]),
        // The stall monitor as a swift-service-lifecycle `Service`; built only with the
        // `ServiceLifecycle` trait.
        .library(name: "RunLoopMonitorService", targets: ["RunLoopMonitorService"]),
        // A loop (RunLoop.main above all) drives a GLib GMainContext; built only with the `GLib`
        // trait, so GLib's headers and library are never needed without it.
        .library(name: "RunLoopGLib", targets: ["RunLoopGLib"]),
        .executable(name: "runloop-lab", targets: ["runloop-lab"]),
        .executable(name: "stall-server", targets: ["stall-server"]),
    ],
    // Integrations with foreign dependencies are traits, off by default: `swift build` and
    // `swift test` build RunLoopKit and its own modules only; a user who wants one names the
    // trait on the package dependency (`traits: ["OpenCombine"]`), and CI builds them with
    // `--traits`. Their targets compile to nothing without the trait.
    traits: [
        .trait(name: "OpenCombine", description: "RunLoopCombine: RunLoop as an OpenCombine scheduler, a timer publisher."),
        .trait(name: "SwiftNIO", description: "RunLoopMonitorNIO: the stall monitor on SwiftNIO event loops."),
        .trait(
            name: "ServiceLifecycle",
            description: "RunLoopMonitorService: the stall monitor as a swift-service-lifecycle Service."),
        .trait(
            name: "GLib",
            description: "RunLoopGLib: a loop drives a GLib GMainContext (needs glib-2.0 through pkg-config; Debian: libglib2.0-dev)."),
        // GTK 4 for the lab's experiment 24 and the GTK tests only: no library product links GTK.
        .trait(
            name: "GTK",
            description: "The lab's GTK 4 experiment (24) and the GTK tests on RunLoopGLib (needs gtk4 through pkg-config; Debian: libgtk-4-dev; the tests and the experiment also Xvfb, xdotool and ImageMagick).",
            enabledTraits: ["GLib"]),
        .default(enabledTraits: []),
    ],
    dependencies: [
        .package(url: "https://github.com/apple/swift-collections", from: "1.6.0"),
        .package(url: "https://github.com/apple/swift-system", from: "1.8.1"),
        .package(url: "https://github.com/apple/swift-log", from: "1.16.2"),
        .package(url: "https://github.com/apple/swift-argument-parser", from: "1.8.2"),
        .package(url: "https://github.com/apple/swift-metrics", from: "2.13.0"),
        // `swift package generate-documentation --target RunLoopKit`; no code of it is linked.
        .package(url: "https://github.com/swiftlang/swift-docc-plugin", from: "1.5.0"),
        // Tests only: swift-clocks' TestClock beside RunLoopTesting's virtual time.
        .package(url: "https://github.com/pointfreeco/swift-clocks", from: "1.1.1"),
        // Trait `OpenCombine` only.
        .package(url: "https://github.com/OpenCombine/OpenCombine", from: "0.14.0"),
        // Trait `SwiftNIO` only.
        .package(url: "https://github.com/apple/swift-nio", from: "2.101.2"),
        .package(url: "https://github.com/swift-server/swift-prometheus", from: "2.4.1"),
        // Trait `ServiceLifecycle` only.
        .package(url: "https://github.com/swift-server/swift-service-lifecycle", from: "2.13.0"),
    ],
    targets: [
        // Linux system calls and headers Swift's Glibc module does not import
        // (epoll, eventfd, timerfd, gettid, thread names).
        .target(name: "CRunLoopKit"),
        .target(
            name: "RunLoopKit",
            dependencies: [
                "CRunLoopKit",
                .product(name: "DequeModule", package: "swift-collections"),
                .product(name: "SystemPackage", package: "swift-system"),
                .product(name: "Logging", package: "swift-log"),
            ]
        ),
        // The stall monitor's signal handler and what Swift cannot import (tgkill, backtrace(),
        // per-thread CPU clocks); async-signal-safe code only in the handler.
        .target(name: "CRunLoopMonitor"),
        // Stall (lag) monitor, stack capture of any thread, CPU monitor, stall reports.
        .target(
            name: "RunLoopMonitor",
            dependencies: [
                "RunLoopKit",
                "CRunLoopMonitor",
                .product(name: "Logging", package: "swift-log"),
                .product(name: "Metrics", package: "swift-metrics"),
            ]
        ),
        // Idle-time tasks, coalesced commits, the per-iteration release pool, the display link
        // and its frame-rate monitor: work placed in the loop's iteration.
        .target(
            name: "RunLoopScheduling",
            dependencies: [
                "RunLoopKit",
                .product(name: "DequeModule", package: "swift-collections"),
                .product(name: "HeapModule", package: "swift-collections"),
                .product(name: "SystemPackage", package: "swift-system"),
                .product(name: "Metrics", package: "swift-metrics"),
            ]
        ),
        // RunLoop.main as the main actor's executor, loops as scheduling executors (the
        // experimental executor SPI of Swift 6.3: @_spi(ExperimentalCustomExecutors),
        // @_spi(ExperimentalScheduling)).
        .target(name: "RunLoopConcurrency", dependencies: ["RunLoopKit"]),
        // Test-only: programs with a synchronous main that install RunLoop.main as the main
        // actor's executor (Tests/ConcurrencyProbe); RunLoopConcurrencyTests launch them.
        // The drain hook's constructor (C: it must run before main) and its Swift side.
        .target(name: "CRunLoopAsyncMain"),
        .target(name: "RunLoopAsyncMain", dependencies: ["CRunLoopAsyncMain", "RunLoopKit", "RunLoopConcurrency"]),
        // An async main linked with RunLoopAsyncMain; RunLoopConcurrencyTests launch it (no test
        // target links the product: it would take over the test runner's own main).
        .executableTarget(
            name: "AsyncMainProbe",
            dependencies: ["RunLoopAsyncMain", "RunLoopConcurrency", "RunLoopKit"],
            path: "Tests/AsyncMainProbe"
        ),
        .executableTarget(
            name: "ConcurrencyProbe",
            dependencies: ["RunLoopKit", "RunLoopConcurrency", "RunLoopTesting"],
            path: "Tests/ConcurrencyProbe"
        ),
        .testTarget(
            name: "RunLoopConcurrencyTests",
            dependencies: ["RunLoopKit", "RunLoopConcurrency", "RunLoopTesting", "SharedTestSupport"]
        ),
        // RunLoop as an OpenCombine scheduler (trait `OpenCombine`).
        .target(
            name: "RunLoopCombine",
            dependencies: [
                "RunLoopKit",
                .product(name: "OpenCombine", package: "OpenCombine", condition: .when(traits: ["OpenCombine"])),
            ]
        ),
        // OpenCombine 0.14.0's RunLoopSchedulerTests and TimerPublisherTests, ported (XCTest, as
        // there); empty without the trait.
        .testTarget(
            name: "RunLoopCombineTests",
            dependencies: [
                "RunLoopKit",
                "RunLoopCombine",
                "RunLoopTesting",
                .product(name: "OpenCombine", package: "OpenCombine", condition: .when(traits: ["OpenCombine"])),
            ]
        ),
        // The stall monitor on SwiftNIO event loops (trait `SwiftNIO`): NIO's tick reports, or
        // heartbeats, as stall sources.
        .target(
            name: "RunLoopMonitorNIO",
            dependencies: [
                "RunLoopKit",
                "RunLoopMonitor",
                // The one warning when more loops than its capacity report ticks.
                .product(name: "Logging", package: "swift-log"),
                .product(name: "NIOCore", package: "swift-nio", condition: .when(traits: ["SwiftNIO"])),
                .product(name: "NIOPosix", package: "swift-nio", condition: .when(traits: ["SwiftNIO"])),
            ]
        ),
        // The stall monitor as a swift-service-lifecycle Service (trait `ServiceLifecycle`).
        .target(
            name: "RunLoopMonitorService",
            dependencies: [
                "RunLoopMonitor",
                .product(
                    name: "ServiceLifecycle", package: "swift-service-lifecycle",
                    condition: .when(traits: ["ServiceLifecycle"])),
            ]
        ),
        .testTarget(
            name: "RunLoopMonitorServiceTests",
            dependencies: [
                "RunLoopKit",
                "RunLoopMonitor",
                "RunLoopMonitorService",
                "SharedTestSupport",
                .product(name: "Logging", package: "swift-log"),
                .product(
                    name: "ServiceLifecycle", package: "swift-service-lifecycle",
                    condition: .when(traits: ["ServiceLifecycle"])),
            ]
        ),
        // An HTTP server on SwiftNIO watched by the monitor, with /metrics for Prometheus
        // (.ci/stall-server-check drives it with wrk and a real Prometheus server).
        .target(
            name: "NIOStallServer",
            dependencies: [
                "RunLoopMonitor",
                .product(name: "NIOCore", package: "swift-nio", condition: .when(traits: ["SwiftNIO"])),
                .product(name: "NIOPosix", package: "swift-nio", condition: .when(traits: ["SwiftNIO"])),
                .product(name: "NIOHTTP1", package: "swift-nio", condition: .when(traits: ["SwiftNIO"])),
                .product(name: "Prometheus", package: "swift-prometheus", condition: .when(traits: ["SwiftNIO"])),
            ],
            path: "Examples/NIOStallServer"
        ),
        .executableTarget(
            name: "stall-server",
            dependencies: [
                "NIOStallServer",
                "RunLoopMonitor",
                "RunLoopMonitorNIO",
                .product(name: "Metrics", package: "swift-metrics"),
                .product(name: "NIOPosix", package: "swift-nio", condition: .when(traits: ["SwiftNIO"])),
                .product(name: "Prometheus", package: "swift-prometheus", condition: .when(traits: ["SwiftNIO"])),
            ],
            path: "Examples/StallServer"
        ),
        .testTarget(
            name: "RunLoopMonitorNIOTests",
            dependencies: [
                "RunLoopKit",
                "RunLoopMonitor",
                "RunLoopMonitorNIO",
                "SharedTestSupport",
                .product(name: "NIOCore", package: "swift-nio", condition: .when(traits: ["SwiftNIO"])),
                .product(name: "NIOPosix", package: "swift-nio", condition: .when(traits: ["SwiftNIO"])),
            ]
        ),
        // GLib's headers and library, found with pkg-config (trait `GLib` only: no target
        // depends on it without the trait, so a build without it never looks for GLib).
        .systemLibrary(
            name: "CGLib",
            pkgConfig: "glib-2.0",
            providers: [.apt(["libglib2.0-dev"])]
        ),
        // A loop drives a GMainContext (trait `GLib`): GLib's descriptors in one epoll
        // descriptor, its timeout a loop timer, prepare/query before the loop sleeps, check and
        // dispatch after it wakes; a reverse GSource serves the loop in nested GLib loops.
        .target(
            name: "RunLoopGLib",
            dependencies: [
                "RunLoopKit",
                .product(name: "Logging", package: "swift-log"),
                .target(name: "CGLib", condition: .when(traits: ["GLib"])),
            ]
        ),
        // Test-only: GLib scenarios on a process's main thread (RunLoop.main, GLib's default
        // context, the main queue and main actor, fork); RunLoopGLibTests launch it.
        .executableTarget(
            name: "GLibProbe",
            dependencies: [
                "RunLoopKit",
                "RunLoopGLib",
                "RunLoopMonitor",
                .target(name: "CGLib", condition: .when(traits: ["GLib"])),
            ],
            path: "Tests/GLibProbe"
        ),
        .testTarget(
            name: "RunLoopGLibTests",
            dependencies: [
                "RunLoopKit",
                "RunLoopGLib",
                "RunLoopMonitor",
                "SharedTestSupport",
                .target(name: "CGLib", condition: .when(traits: ["GLib"])),
            ]
        ),
        // A loop on virtual time for users' deterministic tests (advance(by:), runUntilIdle()).
        .target(name: "RunLoopTesting", dependencies: ["RunLoopKit"]),
        // The lab's own C shims (accept4 for its echo server, gettid, thread names).
        .target(name: "CRunLoopLab"),
        // The lab's demo network code (the TCP echo server and its client), a library target of
        // its own so that the tests of the echo server import it, not the lab's executable.
        .target(
            name: "RunLoopLabNetwork",
            dependencies: [
                "RunLoopKit",
                "CRunLoopLab",
                .product(name: "SystemPackage", package: "swift-system"),
            ]
        ),
        // The seeds' experiments. Only the products' public API and the lab's own targets: not
        // RunLoopKit's private C shim.
        .executableTarget(
            name: "runloop-lab",
            dependencies: [
                "RunLoopKit",
                "RunLoopMonitor",
                "RunLoopScheduling",
                "RunLoopLabNetwork",
                "RunLoopConcurrency",
                "CRunLoopLab",
                .product(name: "SystemPackage", package: "swift-system"),
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
                // Experiment 24 (a GTK 4 window dragged under Xvfb), with the trait GTK only.
                .target(name: "RunLoopGLib", condition: .when(traits: ["GTK"])),
                .target(name: "GTKScrollDemo", condition: .when(traits: ["GTK"])),
                // Experiment 23 (a blocked NIO event loop), with the trait SwiftNIO only.
                .target(name: "RunLoopMonitorNIO", condition: .when(traits: ["SwiftNIO"])),
                .target(name: "NIOStallServer", condition: .when(traits: ["SwiftNIO"])),
                .product(name: "NIOCore", package: "swift-nio", condition: .when(traits: ["SwiftNIO"])),
                .product(name: "NIOPosix", package: "swift-nio", condition: .when(traits: ["SwiftNIO"])),
                .product(name: "Prometheus", package: "swift-prometheus", condition: .when(traits: ["SwiftNIO"])),
            ],
            // The lab guide: the experiments, their seeds and their outputs.
            exclude: ["README.md"]
        ),
        // Test-only: stalls in a process of their own (a stall killed mid-way for the report store;
        // the monitor in a release build, where frame pointers are omitted; misuse that must stop
        // the process). Tests/RunLoopMonitorTests launch it.
        .executableTarget(
            name: "MonitorProbe",
            dependencies: ["RunLoopKit", "RunLoopMonitor", "CAllocationCounter"],
            path: "Tests/MonitorProbe"
        ),
        // Test-only: runs a main-queue scenario on a process's main thread, which tests never have
        // (see Tests/MainQueueProbe/main.swift); Integration/MainQueueTests launch it.
        .executableTarget(
            name: "MainQueueProbe",
            dependencies: ["RunLoopKit", "CRunLoopKit"],
            path: "Tests/MainQueueProbe"
        ),
        // Test-only: hostile scenarios that must run in a process of their own (descriptor
        // exhaustion, fork, thread-exit teardown that may hang or trap; see
        // Tests/HostileProbe/main.swift); the Hostile suites launch it.
        .executableTarget(
            name: "HostileProbe",
            dependencies: [
                "RunLoopKit",
                "CRunLoopKit",
                "CAllocationCounter",
                .product(name: "SystemPackage", package: "swift-system"),
            ],
            path: "Tests/HostileProbe"
        ),
        // Test-only: counts a thread's heap allocations and the process's open descriptors (see
        // Tests/CAllocationCounter).
        .target(name: "CAllocationCounter", path: "Tests/CAllocationCounter"),
        .testTarget(
            name: "RunLoopKitTests",
            dependencies: [
                "RunLoopKit",
                "RunLoopTesting",
                "CRunLoopKit",
                "CAllocationCounter",
                "SharedTestSupport",
                .product(name: "Logging", package: "swift-log"),
            ]
        ),
        // The lab's tests: its echo server (RunLoopLabNetwork) under load and misuse, and its
        // experiments run as a user runs them (`runloop-lab tour --only N`, launched as a child).
        .testTarget(
            name: "RunLoopLabTests",
            dependencies: [
                "RunLoopKit",
                "RunLoopLabNetwork",
                "CRunLoopKit",
                "SharedTestSupport",
                .product(name: "SystemPackage", package: "swift-system"),
            ]
        ),
        // Test-only: what every test target shares (Tests/SharedTestSupport): the thread host,
        // bounded waits, the child-process launcher, sanitizer detection, the process's threads,
        // the exclusive-suite trait, and the one swift-log and swift-metrics backend of the test
        // process.
        .target(
            name: "SharedTestSupport",
            dependencies: [
                "RunLoopKit",
                "CRunLoopKit",
                "CAllocationCounter",
                .product(name: "Logging", package: "swift-log"),
                .product(name: "Metrics", package: "swift-metrics"),
                .product(name: "MetricsTestKit", package: "swift-metrics"),
            ],
            path: "Tests/SharedTestSupport"
        ),
        .testTarget(
            name: "RunLoopMonitorTests",
            dependencies: [
                "RunLoopKit",
                "RunLoopMonitor",
                "RunLoopTesting",
                "CRunLoopMonitor",
                // epoll, for a test thread parked in epoll_wait.
                "CRunLoopKit",
                "CAllocationCounter",
                "SharedTestSupport",
                .product(name: "Logging", package: "swift-log"),
                .product(name: "Metrics", package: "swift-metrics"),
                .product(name: "MetricsTestKit", package: "swift-metrics"),
            ]
        ),
        // Test-only: misuse of RunLoopScheduling that must stop the process with a precondition
        // message (Tests/SchedulingProbe/main.swift); RunLoopSchedulingTests launch it.
        .executableTarget(
            name: "SchedulingProbe",
            dependencies: ["RunLoopKit", "RunLoopScheduling"],
            path: "Tests/SchedulingProbe"
        ),
        .testTarget(
            name: "RunLoopTestingTests",
            dependencies: [
                "RunLoopKit", "RunLoopTesting", "RunLoopScheduling", "SharedTestSupport",
                // swift-clocks' TestClock, compared with virtual time on the same async code.
                .product(name: "Clocks", package: "swift-clocks"),
            ]
        ),
        .testTarget(
            name: "RunLoopSchedulingTests",
            dependencies: [
                "RunLoopKit",
                "RunLoopScheduling",
                "SharedTestSupport",
                .product(name: "Metrics", package: "swift-metrics"),
                .product(name: "MetricsTestKit", package: "swift-metrics"),
            ]
        ),
        // GTK 4's headers and libraries, found with pkg-config (trait `GTK` only: only the targets
        // below and the lab depend on it, and only with the trait).
        .systemLibrary(
            name: "CGtk",
            pkgConfig: "gtk4",
            providers: [.apt(["libgtk-4-dev"])]
        ),
        // A GTK 4 window on RunLoopGLib's bridge (trait `GTK`): the scroll view that an xdotool drag
        // puts in `.tracking`, the virtual X display it runs on, the drag and the screenshots.
        // Experiment 24 of the lab and GTKProbe run it; not a product.
        .target(
            name: "GTKScrollDemo",
            dependencies: [
                "RunLoopKit",
                .target(name: "RunLoopGLib", condition: .when(traits: ["GTK"])),
                .target(name: "CGtk", condition: .when(traits: ["GTK"])),
            ],
            path: "Examples/GTKScrollDemo"
        ),
        // Test-only: GTK scenarios on a process's main thread (GTK is initialised once per process,
        // on the main thread), each on an Xvfb display of its own; RunLoopGTKTests launch it.
        .executableTarget(
            name: "GTKProbe",
            dependencies: [
                "RunLoopKit",
                "RunLoopConcurrency",
                .target(name: "RunLoopGLib", condition: .when(traits: ["GTK"])),
                .target(name: "GTKScrollDemo", condition: .when(traits: ["GTK"])),
                .target(name: "CGtk", condition: .when(traits: ["GTK"])),
            ],
            path: "Tests/GTKProbe"
        ),
        .testTarget(name: "RunLoopGTKTests", dependencies: ["SharedTestSupport"]),
    ],
    swiftLanguageModes: [.v6]
)
