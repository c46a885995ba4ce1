import Foundation
import RunLoopKit
import Synchronization
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

/// A stall's first report is blamed from names alone when its full frames are not resolved yet.
/// Names carry no file, so a function the compiler wrote in the application's image (a synthesized
/// `Equatable`/`Codable` conformance, which the line tables give as `<compiler-generated>`) looked
/// like the application's code: the stall server's JSON handler was counted under
/// `Record.encode(to:)`. Now a name the compiler writes, or a requirement a derived conformance
/// implements, is not the application's code without a file; an address resolved in full keeps
/// its full frames; and a function's other addresses borrow its file.
struct NamesBorrowFunctionFilesTests {
    struct Inner: Equatable {
        static func == (lhs: Inner, rhs: Inner) -> Bool {
            // A Swift concurrency thread blocks every signal: unblock the capture's.
            ThreadStack.prepareCurrentThread()
            defer { ThreadStack.forgetCurrentThread() }
            let stack = try? ThreadStack.captureAddresses(threadID: ProcessThreads.ownID)
            captured.locked { $0 = stack?.addresses ?? [] }
            return true
        }
    }

    /// `==` synthesized: the compiler writes it, and it calls `Inner.==`.
    struct Record: Equatable {
        var inner = Inner()
        var number = 1
    }

    static let captured = Mutex<[UInt64]>([])

    @Test func aSynthesizedFunctionNamedWithoutLinesIsNotTheApplicationsCode() throws {
        #expect(Record() == Record())
        let addresses = Self.captured.locked { $0 }
        try #require(!addresses.isEmpty)
        func synthesized(_ frames: [StackFrame]) -> StackFrame? {
            frames.first { ($0.symbol ?? "").contains("Record.__derived_struct_equals") }
        }
        // Before any full resolution of these addresses: the name alone, no file, and the name
        // says the compiler wrote it.
        let named = try #require(Symbolicator.shared.nameFrames(for: addresses, patience: .seconds(60)))
        let before = try #require(synthesized(named), "no frame of Record.== in \(named.map { $0.symbol ?? "?" })")
        #expect(before.file == nil)
        #expect(!CallTree.isApplicationCode(before))
        // The full frames say what the compiler wrote...
        let full = try #require(synthesized(Symbolicator.shared.frames(for: addresses)))
        #expect(full.file?.contains(Symbolicator.generatedFile) == true)
        #expect(!CallTree.isApplicationCode(full))
        // ...names of those addresses are now their full frames...
        let renamed = try #require(Symbolicator.shared.nameFrames(for: addresses, patience: .seconds(60)))
        #expect(synthesized(renamed)?.file == full.file)
        // ...and another address of the same function (one byte on: the same function, never
        // resolved in full) borrows the function's file, without a line.
        let index = try #require(addresses.indices.dropFirst().first { index in
            synthesized(Symbolicator.shared.nameFrames(for: [addresses[index]], patience: .seconds(60)) ?? []) != nil
        })
        let other = try #require(Symbolicator.shared.nameFrames(for: [addresses[0], addresses[index] + 1], patience: .seconds(60)))
        let borrowed = try #require(synthesized(Array(other.dropFirst())))
        #expect(borrowed.file == full.file)
        #expect(borrowed.line == nil)
        // The test's own `Inner.==` keeps its real file.
        let own = try #require(renamed.first { ($0.symbol ?? "").contains("Inner.== infix") })
        #expect(own.file?.hasSuffix("OptimizedBlameTests.swift") == true)
        #expect(CallTree.isApplicationCode(own))
    }

    @Test func namesTheCompilerWrites() {
        for name in [
            "outlined copy of Record", "initializeWithCopy for Record", "specialized Record.encode(to:)", "Record.init(from:)",
            "Key.hash(into:)", "static Record.__derived_struct_equals(_:_:) -> Bool", "protocol witness for Encodable.encode(to:) in conformance Record",
            "thunk for @escaping @callee_guaranteed () -> ()", "static Record.== infix(_:_:)",
        ] {
            #expect(CallTree.isCompilerWrittenName(name), "\(name)")
        }
        for name in ["handleHugeJSONEncode()", "Server.encodeEverything(to:)", "closure #1 in Server.routes()", "Record.encoded(to:)"] {
            #expect(!CallTree.isCompilerWrittenName(name), "\(name)")
        }
        // Without a file a name the compiler writes is not the application's code; with a real
        // file it is whatever its file says.
        #expect(!CallTree.isApplicationCode(OptimizedBlameTests.frame("Record.encode(to:)", module: "Server")))
        #expect(CallTree.isApplicationCode(OptimizedBlameTests.frame("Record.encode(to:)", file: "/srv/app/Sources/Server/Record.swift", module: "Server")))
    }
}

/// A stall's first report is blamed from one sample: a capture whose unwinding stopped short (an
/// instruction without unwind information: seen in the Swift runtime under the stall server, a
/// stack of two `libswiftCore` frames, counted as `unknown`) is taken again.
struct FirstSampleTests {
    @Test func aWholeStackReachesItsThreadsEntryAndATruncatedOneDoesNot() throws {
        ThreadStack.prepareCurrentThread()
        defer { ThreadStack.forgetCurrentThread() }
        let own = try ThreadStack.captureAddresses(threadID: ProcessThreads.ownID).addresses
        #expect(StackSampler.reachesThreadEntry(own))
        // Two addresses in the Swift runtime's library, nothing below them.
        let runtime = UInt64(UInt(bitPattern: try #require(dlsym(nil, "swift_retain"))))
        #expect(!StackSampler.reachesThreadEntry([runtime + 16, runtime + 32]))
        #expect(!StackSampler.reachesThreadEntry([]))
        // One frame in the C library (an unwinder stopped in `free`): not the thread's entry.
        let free = UInt64(UInt(bitPattern: try #require(dlsym(nil, "free"))))
        #expect(!StackSampler.reachesThreadEntry([free + 16]))
    }

    @Test func theFirstSampleOfALiveThreadIsWhole() throws {
        let thread = PermanentThread(name: "first-sample")
        defer { thread.stop() }
        // A thread started from a Swift Testing thread inherits its blocked signals: unblock the
        // capture's there, then sample it parked or running.
        let prepared = DispatchSemaphore(value: 0)
        try thread.execute {
            ThreadStack.prepareCurrentThread()
            prepared.signal()
        }
        prepared.wait()
        let threadID = thread.loop.threadID
        var sampler = StackSampler(threadID: threadID)
        let alive = sampler.sampleFirst(timeout: .seconds(5))
        #expect(alive)
        #expect(sampler.sampleCount == 1)
    }
}
