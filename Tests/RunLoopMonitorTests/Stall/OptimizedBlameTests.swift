import Foundation
@testable import RunLoopMonitor
import Testing

/// Blame in optimized builds, where the line table often misses a frame's return address (the
/// call is followed by inlined standard-library code) and RunLoopKit's own files may be recorded
/// with relative paths. The real case runs in MonitorProbe's `trust inlined`, built in release by CI.
struct OptimizedBlameTests {
    static let libc = "/lib/x86_64-linux-gnu/libc.so.6"

    static func frame(_ symbol: String, image: String = "/srv/app/.build/release/Server", file: String? = nil, module: String? = nil) -> StackFrame {
        var frame = StackFrame(address: UInt64(abs(symbol.hashValue) % 100_000), image: image, imageOffset: 0, symbol: symbol, file: file, line: file == nil ? nil : 1)
        frame.module = module
        return frame
    }

    /// The handler's frame has no file (its return address is in inlined `ContinuousClock.now`):
    /// it is still the application's code, so it is blamed, not its caller (before: the caller,
    /// `partial apply for closure #14 in`, which has a line).
    @Test func aHandlerWithoutLineInformationIsBlamedNotItsCaller() {
        let stack = [
            Self.frame("clock_nanosleep", image: Self.libc), Self.frame("usleep", image: Self.libc),
            Self.frame("blockingHandler(_:)", module: "Server"),
            Self.frame("partial apply for closure #14 in Server.routes()", file: "/srv/app/Sources/Server/Routes.swift", module: "Server"),
            Self.frame("RunLoop.doBlocks(_:)", file: "Sources/RunLoopKit/Core/Loop/RunLoop+Run.swift", module: "RunLoopKit"),
            Self.frame("start_thread", image: Self.libc),
        ]
        let tree = CallTree([StackSample(count: 5, frames: stack)])
        #expect(tree.blamed == "blockingHandler(_:)")
    }

    /// A library's frame is known by its mangled name's module even without a file, or with a
    /// relative one (`Sources/RunLoopKit/…`, as release builds record some): never blamed.
    @Test func libraryFramesAreKnownByTheirModule() {
        let stack = [
            Self.frame("clock_nanosleep", image: Self.libc),
            Self.frame("PendingBlock.run(on:)", file: "Sources/RunLoopKit/Core/Loop/LoopState.swift", module: "RunLoopKit"),
            Self.frame("RunLoop.doBlocks(_:)", module: "RunLoopKit"),
            Self.frame("specialized Array.append(_:)", module: "Swift"),
            Self.frame("main", file: "/srv/app/Sources/Server/main.swift", module: "Server"),
        ]
        #expect(CallTree([StackSample(count: 3, frames: stack)]).blamed == "main")
    }

    /// The Swift runtime linked into the executable (a static standard library), or a generic
    /// metadata instantiation on the first call of a handler: never the blame, in the tree or in
    /// the fallback that names the closest frame it has (before: `_swift_getGenericMetadata(...)`).
    @Test func aRuntimeFunctionIsNeverBlamed() {
        let runtime = [
            Self.frame("_swift_getGenericMetadata(swift::MetadataRequest, void const* const*, swift::TargetTypeContextDescriptor<swift::InProcess> const*)"),
            Self.frame("swift_getGenericMetadata"),
            Self.frame("__swift_instantiateConcreteTypeFromMangledName"),
        ]
        let handler = Self.frame("handleHeavyJSON()", module: "Server")
        #expect(CallTree([StackSample(count: 1, frames: runtime + [handler])]).blamed == "handleHeavyJSON()")
        #expect(StackSample.culprit(in: [StackSample(count: 1, frames: runtime + [handler])]) == "handleHeavyJSON()")
        // Nothing but the runtime and the C library: still no runtime function.
        let culprit = StackSample.culprit(in: [StackSample(count: 1, frames: runtime + [Self.frame("start_thread", image: Self.libc)])])
        #expect(culprit == "start_thread")
    }

    @Test func modulesOfMangledNames() {
        #expect(StackFrame.module(ofMangledName: "$s10RunLoopKit0aB0C8doBlocksyyF") == "RunLoopKit")
        #expect(StackFrame.module(ofMangledName: "_$s6Server15blockingHandleryys6UInt32VF") == "Server")
        #expect(StackFrame.module(ofMangledName: "$sSa6appendyyxnF") == "Swift")
        #expect(StackFrame.module(ofMangledName: "$ss5print_9separator10terminatoryypd_S2StF") == "Swift")
        #expect(StackFrame.module(ofMangledName: "usleep") == nil)
        #expect(StackFrame.module(ofMangledName: "$s99Short") == nil)
    }
}
