// swift-tools-version: 6.2
// A Hummingbird 2 application watched by RunLoopKit's stall monitor, set up as the documentation
// shows (RunLoopMonitorService's and RunLoopMonitorNIO's articles): a package of its own, so that
// Hummingbird never enters RunLoopKit's graph. `.ci/stall-server-check` builds it (release) and
// runs it under wrk.
import PackageDescription

let package = Package(
    name: "HummingbirdStallServer",
    platforms: [.macOS(.v14)],
    dependencies: [
        // The path is the repository root; its identity is its directory's name, so it is named here.
        .package(name: "RunLoopKit", path: "../..", traits: ["SwiftNIO", "ServiceLifecycle"]),
        .package(url: "https://github.com/hummingbird-project/hummingbird", exact: "2.28.1"),
        .package(url: "https://github.com/apple/swift-nio", from: "2.101.2"),
    ],
    targets: [
        .executableTarget(
            name: "HummingbirdStallServer",
            dependencies: [
                .product(name: "Hummingbird", package: "hummingbird"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "RunLoopMonitor", package: "RunLoopKit"),
                .product(name: "RunLoopMonitorNIO", package: "RunLoopKit"),
                .product(name: "RunLoopMonitorService", package: "RunLoopKit"),
            ]
        ),
    ],
    swiftLanguageModes: [.v6]
)
