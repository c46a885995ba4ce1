// swift-tools-version: 6.2
// RunLoopKit's benchmarks: RunLoopKit side by side with CFRunLoop (swift-corelibs-foundation) and
// SwiftNIO. A separate package so the main package stays lean:
//   swift run -c release --package-path Benchmarks runloop-bench
import PackageDescription

let package = Package(
    name: "RunLoopKitBenchmarks",
    // `--traits GTK` builds gtk-bench with GTK 4 (the `gtk` workload); without it gtk-bench only
    // says so, and nothing here needs GTK.
    traits: [
        .trait(name: "GTK", description: "The `gtk` workload: a GTK 4 window under Xvfb on GLibBridge, a 50 ms tickler and g_main_loop_run."),
        .default(enabledTraits: []),
    ],
    dependencies: [
        // The trait SwiftNIO builds RunLoopMonitorNIO (the `niotick` workload), the trait GLib
        // RunLoopGLib (the `glib` workload's glib-bench: only that target needs glib-2.0's
        // development files).
        .package(name: "RunLoopKit", path: "..", traits: ["SwiftNIO", "GLib"]),
        .package(url: "https://github.com/apple/swift-nio", from: "2.101.2"),
        .package(url: "https://github.com/apple/swift-argument-parser", from: "1.8.2"),
        // The `clocktest` workload compares RunLoopClock with swift-clocks' TestClock.
        .package(url: "https://github.com/pointfreeco/swift-clocks", exact: "1.1.1"),
        // RunLoopKitOperations: per-operation CPU, allocations, syscalls and context switches in
        // package-benchmark's form (`swift package --package-path Benchmarks benchmark`). Its malloc
        // interposer only: the runtime interposer's package is not among those this machine
        // resolves offline, and the figures here do not need retain counts.
        .package(url: "https://github.com/ordo-one/benchmark", exact: "1.38.1", traits: ["MallocInterposer"]),
    ],
    targets: [
        // eventfd + epoll ping-pong floor, gettid, a per-thread malloc counter, mallinfo2.
        .target(name: "CBenchSupport"),
        // One process per main-actor executor (the choice is process-wide): the `mainactor`
        // workload runs it.
        .executableTarget(
            name: "mainactor-bench",
            dependencies: [
                "CBenchSupport",
                .product(name: "RunLoopKit", package: "RunLoopKit"),
                .product(name: "RunLoopConcurrency", package: "RunLoopKit"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
            ]
        ),
        // GLib through pkg-config, for glib-bench only.
        .systemLibrary(name: "CGLibBench", pkgConfig: "glib-2.0", providers: [.apt(["libglib2.0-dev"])]),
        // GLib idles dispatched by RunLoopGLib's bridge and by g_main_loop_run, one process each:
        // the `glib` workload runs it (build it first: `swift build -c release --package-path
        // Benchmarks --product glib-bench`).
        .executableTarget(
            name: "glib-bench",
            dependencies: [
                "CGLibBench",
                .product(name: "RunLoopKit", package: "RunLoopKit"),
                .product(name: "RunLoopGLib", package: "RunLoopKit"),
            ]
        ),
        // GTK 4 (trait GTK only) and libdispatch's main-queue port for a GLib-owned loop.
        .systemLibrary(name: "CBenchGtk", pkgConfig: "gtk4", providers: [.apt(["libgtk-4-dev"])]),
        // One process per way of running a GTK window's main thread: the `gtk` workload runs it.
        .executableTarget(
            name: "gtk-bench",
            dependencies: [
                .product(name: "RunLoopKit", package: "RunLoopKit"),
                .product(name: "RunLoopGLib", package: "RunLoopKit"),
                .target(name: "CBenchGtk", condition: .when(traits: ["GTK"])),
            ]
        ),
        // One fresh process's first stall report: the `firstreport` workload runs it.
        .executableTarget(
            name: "firstreport-bench",
            dependencies: [
                .product(name: "RunLoopKit", package: "RunLoopKit"),
                .product(name: "RunLoopMonitor", package: "RunLoopKit"),
            ]
        ),
        // package-benchmark's target: its own executable, since package-benchmark interposes malloc
        // and runloop-bench's CBenchSupport does too.
        .executableTarget(
            name: "RunLoopKitOperations",
            dependencies: [
                .product(name: "Benchmark", package: "benchmark"),
                .product(name: "RunLoopKit", package: "RunLoopKit"),
            ],
            path: "Benchmarks/RunLoopKitOperations",
            plugins: [.plugin(name: "BenchmarkPlugin", package: "benchmark")]
        ),
        .executableTarget(
            name: "runloop-bench",
            dependencies: [
                "CBenchSupport",
                .product(name: "RunLoopKit", package: "RunLoopKit"),
                .product(name: "RunLoopMonitor", package: "RunLoopKit"),
                .product(name: "RunLoopMonitorNIO", package: "RunLoopKit"),
                .product(name: "RunLoopScheduling", package: "RunLoopKit"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
                .product(name: "RunLoopTesting", package: "RunLoopKit"),
                .product(name: "Clocks", package: "swift-clocks"),
            ]
        ),
    ],
    swiftLanguageModes: [.v6]
)
