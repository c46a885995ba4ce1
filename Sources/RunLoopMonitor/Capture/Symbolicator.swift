import CRunLoopMonitor
@_spi(Internal) import Runtime
import RunLoopKit
import Synchronization

/// Turns addresses into frames, off the captured thread, with a cache per address.
///
/// Names, files and lines come from the Swift runtime's symbolicator (`Runtime`, SE-0419): it
/// reads each image's full symbol table and DWARF, which `dladdr` cannot (Swift's internal and
/// specialized functions are local symbols). Building a `Backtrace` from captured addresses is
/// its `@_spi(Internal)` API, which may change between toolchains; when it gives nothing, the
/// frame gets `dladdr`'s dynamic symbol (demangled) or no name, and always its image and offset.
final class Symbolicator: Sendable {
    static let shared = Symbolicator()

    private struct State {
        var images: ImageMap?
        var imagesCapturedAt: ContinuousClock.Instant?
        /// Frames per (address, is-the-interrupted-instruction).
        var cache: [Key: [StackFrame]] = [:]
    }

    private struct Key: Hashable {
        let address: UInt64
        let isProgramCounter: Bool
    }

    /// Fork-safe (see ``ForkSafeLock``): a child may symbolicate while the parent was.
    private let state = ForkSafeLock { State() }
    private let warm = Atomic<Bool>(false)

    /// Whether the symbol tables of the images a stack usually crosses (the executable, the C
    /// library, the Swift runtime) are loaded: symbolicating then takes microseconds a frame
    /// instead of the first load's hundreds of milliseconds to seconds (a large binary's DWARF).
    var isWarm: Bool { warm.load(ordering: .acquiring) }

    /// Loads those tables, by symbolicating the calling thread's own stack; then ``isWarm``.
    func warmUp() {
        if let own = try? ThreadStack.captureAddresses(threadID: ProcessThreads.ownID) { _ = frames(for: own.addresses) }
        warm.store(true, ordering: .releasing)
    }

    /// What is known of `addresses` without the symbol tables (no lock, no loading): image, offset
    /// and the nearest exported symbol, as `dladdr` gives them; what a report made before
    /// ``isWarm`` carries.
    static func unsymbolicatedFrames(for addresses: [UInt64]) -> [StackFrame] {
        addresses.map { dladdrFrame($0, nil) }
    }

    /// The frames of `addresses` (the first the interrupted instruction, the others return
    /// addresses); inlined functions give extra frames at the same address.
    func frames(for addresses: [UInt64]) -> [StackFrame] {
        state.locked { state in
            let missing = addresses.enumerated().filter { state.cache[Key(address: $1, isProgramCounter: $0 == 0)] == nil }
            if !missing.isEmpty { resolve(missing.map { ($1, $0 == 0) }, &state) }
            return addresses.enumerated().flatMap { index, address in
                state.cache[Key(address: address, isProgramCounter: index == 0)] ?? []
            }
        }
    }

    /// Images as they are now; captured again (at most once a second) when an address lies in
    /// none of them (a library loaded since).
    private func images(covering addresses: [UInt64], _ state: inout State) -> ImageMap {
        let now = ContinuousClock.now
        if let images = state.images {
            let allFound = addresses.allSatisfy { images.indexOfImage(at: Backtrace.Address($0)) != nil }
            if allFound || (state.imagesCapturedAt.map { now - $0 < .seconds(1) } ?? false) { return images }
        }
        let images = ImageMap.capture()
        state.images = images
        state.imagesCapturedAt = now
        return images
    }

    private func resolve(_ entries: [(address: UInt64, isProgramCounter: Bool)], _ state: inout State) {
        let images = images(covering: entries.map(\.address), &state)
        let richFrames: [RichFrame<UInt64>] = entries.map {
            $0.isProgramCounter ? .programCounter($0.address) : .returnAddress($0.address)
        }
        let backtrace = Backtrace(architecture: Self.architecture, frames: richFrames, images: images)
        var resolved: [Key: [StackFrame]] = [:]
        if let symbolicated = backtrace.symbolicated(
            with: images, options: [.showInlineFrames, .showSourceLocations, .useSymbolCache])
        {
            // Inlined frames come before the frame they were inlined into, all with its address.
            for frame in symbolicated.frames {
                guard let (address, isProgramCounter) = Self.address(of: frame.captured) else { continue }
                let key = Key(address: address, isProgramCounter: isProgramCounter)
                let base = Self.imageBase(address, images)
                var stackFrame = StackFrame(
                    address: address, image: base.path, imageOffset: address &- base.base, inlined: frame.inlined)
                if let symbol = frame.symbol, !symbol.rawName.isEmpty, symbol.rawName != "<unknown>" {
                    stackFrame.symbol = symbol.name
                    stackFrame.module = StackFrame.module(ofMangledName: symbol.rawName)
                    if let location = symbol.sourceLocation, !location.path.isEmpty, location.path != "<unknown>" {
                        stackFrame.file = location.path
                        stackFrame.line = location.line > 0 ? location.line : nil
                    }
                }
                resolved[key, default: []].append(stackFrame)
            }
        }
        for entry in entries {
            let key = Key(address: entry.address, isProgramCounter: entry.isProgramCounter)
            var frames = resolved[key] ?? []
            if frames.isEmpty || frames.allSatisfy({ $0.symbol == nil }) {
                frames = [Self.dladdrFrame(entry.address, images)]
            }
            state.cache[key] = frames
        }
        if state.cache.count > 100_000 { state.cache.removeAll(keepingCapacity: true) }
    }

    private static func address(of frame: Backtrace.Frame) -> (UInt64, Bool)? {
        switch frame {
        case .programCounter(let address): UInt64(address).map { ($0, true) }
        case .returnAddress(let address): UInt64(address).map { ($0, false) }
        default: nil
        }
    }

    private static func imageBase(_ address: UInt64, _ images: ImageMap) -> (path: String, base: UInt64) {
        if let index = images.indexOfImage(at: Backtrace.Address(address)) {
            let image = images[index]
            return (image.path ?? image.name ?? "", UInt64(image.baseAddress) ?? 0)
        }
        return ("", 0)
    }

    /// What `dladdr` knows: the image and the nearest dynamic symbol, demangled.
    private static func dladdrFrame(_ address: UInt64, _ images: ImageMap?) -> StackFrame {
        var image = [CChar](repeating: 0, count: 1024)
        var symbol = [CChar](repeating: 0, count: 1024)
        var base: UInt64 = 0
        var symbolAddress: UInt64 = 0
        let known = crlm_dladdr(address, &image, image.count, &base, &symbol, symbol.count, &symbolAddress)
        let fromMap: (path: String, base: UInt64) = images.map { Self.imageBase(address, $0) } ?? ("", 0)
        let path = fromMap.path.isEmpty ? (known ? Self.string(image) : "") : fromMap.path
        let imageBase = fromMap.path.isEmpty ? base : fromMap.base
        var frame = StackFrame(address: address, image: path, imageOffset: address &- imageBase)
        if known, symbol[0] != 0 {
            var demangled = [CChar](repeating: 0, count: 2048)
            frame.symbol = crlm_demangle(symbol, &demangled, demangled.count) ? Self.string(demangled) : Self.string(symbol)
            frame.module = StackFrame.module(ofMangledName: Self.string(symbol))
        }
        return frame
    }

    private static func string(_ buffer: [CChar]) -> String {
        String(decoding: buffer.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
    }

    #if arch(x86_64)
    private static let architecture = "x86_64"
    #elseif arch(arm64)
    private static let architecture = "arm64"
    #else
    private static let architecture = "unknown"
    #endif
}
