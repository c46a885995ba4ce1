// swift-tools-version: 6.2
// A GTK 4 application whose main thread is RunLoopKit's main loop, driving GTK through
// RunLoopGLib's GLibBridge: what a GTK app's `main` looks like on the bridge. A package of its own,
// depending on RunLoopKit by path with the trait GLib, as an application would; it needs
// libgtk-4-dev. Not built by CI (the lab's experiment 24 and the GTK tests run the same recipe).
//
//   swift run --package-path Examples/GTKScrollApp GTKScrollApp            # a window; close it to quit
//   swift run --package-path Examples/GTKScrollApp GTKScrollApp --quit-after 3
import PackageDescription

let package = Package(
    name: "GTKScrollApp",
    dependencies: [
        // The path is the repository root; its identity is its directory's name, so it is named here.
        .package(name: "RunLoopKit", path: "../..", traits: ["GLib"])
    ],
    targets: [
        // GTK 4's headers and libraries, through pkg-config: the application's own module map.
        .systemLibrary(name: "CGtkApp", pkgConfig: "gtk4", providers: [.apt(["libgtk-4-dev"])]),
        .executableTarget(
            name: "GTKScrollApp",
            dependencies: [
                "CGtkApp",
                .product(name: "RunLoopKit", package: "RunLoopKit"),
                .product(name: "RunLoopGLib", package: "RunLoopKit"),
                .product(name: "RunLoopConcurrency", package: "RunLoopKit"),
            ]
        ),
    ],
    swiftLanguageModes: [.v6]
)
