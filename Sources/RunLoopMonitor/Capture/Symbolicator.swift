import CRunLoopMonitor
import Dispatch
import Glibc
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
///
/// The runtime's symbolicator keeps the ELF images it loaded in a cache per thread, and loading a
/// large binary's tables takes from hundreds of milliseconds to seconds: so every resolution runs
/// on one thread, `rlk.symbols` (started at the first, then parked), whose cache ``warmUp()``
/// fills. A call whose addresses are all cached returns without it. In a child made by `fork()`,
/// where that thread does not exist, the calling thread resolves.
final class Symbolicator: Sendable {
    static let shared = Symbolicator()

    private struct State {
        var images: ImageMap?
        var imagesCapturedAt: ContinuousClock.Instant?
        /// Frames per (address, is-the-interrupted-instruction).
        var cache: [Key: [StackFrame]] = [:]
        /// The source file of each function a full resolution has seen (its own frames, not the
        /// frames inlined into it): a real file once any address of the function had one, else
        /// `<compiler-generated>`. A function's file is the same at every address, so a name
        /// resolved without line tables borrows it (``nameFrames(for:patience:)``): what tells
        /// a synthesized `encode(to:)` from the handler that called the encoder.
        var functionFiles: [String: String] = [:]
        /// The base addresses of the images a resolution has read (their tables are in the
        /// resolving thread's cache): an address in one of them resolves in microseconds.
        var readImages: Set<UInt64> = []
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

    private let namesWarm = Atomic<Bool>(false)

    /// Whether the names thread has the symbol table of every image mapped at ``warmUp()``: a name
    /// then takes microseconds. Before, a name may wait behind the load of one (up to a hundred
    /// milliseconds for libFoundation's, more on a busy machine).
    var namesAreWarm: Bool { namesWarm.load(ordering: .acquiring) }

    /// Loads those tables on the symbolication thread (by symbolicating its own stack), in the
    /// background; ``isWarm`` once done.
    func warmUp() {
        namesWorker.post { [self] in
            if let own = try? ThreadStack.captureAddresses(threadID: ProcessThreads.ownID) { _ = nameFramesHere(own.addresses) }
            // Then every image mapped now, one address each, so that the names thread has every
            // symbol table (a stall in Foundation's JSON encoder is named at once, not after the
            // hundred milliseconds libFoundation's table takes to read). One image per background
            // request, smallest first: a stall's request, which a caller waits for, runs between
            // two of them instead of after all (a process that stalls at once is named at once).
            for address in Self.oneAddressPerImage() {
                namesWorker.postInBackground { [self] in _ = nameFramesHere([address]) }
            }
            namesWorker.postInBackground { [self] in namesWarm.store(true, ordering: .releasing) }
        }
        worker.post { [self] in
            if let own = try? ThreadStack.captureAddresses(threadID: ProcessThreads.ownID) { _ = resolveHere(own.addresses) }
            warm.store(true, ordering: .releasing)
            // Not every image's line tables: that took 1.6 s of CPU in the stall server, and the
            // runtime's reader trapped on one of them (Swift 6.3).
        }
    }

    /// An address in the text (its last byte) of each image mapped from a file, the smallest
    /// image's first.
    private static func oneAddressPerImage() -> [UInt64] {
        ImageMap.capture().compactMap { image -> (size: UInt64, address: UInt64)? in
            guard let path = image.path, path.hasPrefix("/"), let end = UInt64(image.endOfText), let base = UInt64(image.baseAddress), end > base
            else { return nil }
            return (end - base, end - 1)
        }
        .sorted { $0.size < $1.size }
        .map(\.address)
    }

    private let worker = SymbolicationThread(name: "rlk.symbols")
    /// Names only (``nameFrames(for:)``), on a thread of their own: its cache of loaded images is
    /// its own too, and a name is never queued behind a full resolution's line tables.
    private let namesWorker = SymbolicationThread(name: "rlk.names")

    /// What is known of `addresses` without the symbol tables (no lock, no loading): image and
    /// offset, as `dladdr` gives them; what a report made before they are resolved carries.
    static func unsymbolicatedFrames(for addresses: [UInt64]) -> [StackFrame] {
        addresses.map { address in
            // dladdr's name is the nearest exported symbol below the address, often another
            // function's: image and offset only.
            var frame = dladdrFrame(address, nil)
            frame.symbol = nil
            frame.module = nil
            return frame
        }
    }

    /// The frames of `addresses` (the first the interrupted instruction, the others return
    /// addresses); inlined functions give extra frames at the same address.
    func frames(for addresses: [UInt64]) -> [StackFrame] {
        if let cached = cachedFrames(addresses) { return cached }
        return worker.run { [self] in resolveHere(addresses) } ?? resolveHere(addresses)
    }

    /// The frames of `addresses` if every one is cached (no waiting); else nil, and the missing
    /// ones are resolved in the background on the symbolication thread.
    func framesIfResolved(for addresses: [UInt64]) -> [StackFrame]? {
        if let cached = cachedFrames(addresses) { return cached }
        // Once per stack until it is resolved: callers ask again while it is.
        guard queued.locked({ $0.insert(addresses).inserted }) else { return nil }
        worker.post { [self] in
            _ = resolveHere(addresses)
            queued.locked { _ = $0.remove(addresses) }
        }
        return nil
    }

    /// The frames of `addresses`, waiting at most `patience` for the symbolication thread; nil when
    /// they did not come by then (they are cached when they do) or in a forked child (no
    /// symbolication thread there: ``nameFrames(for:patience:)`` resolves locally). Once the
    /// thread ``isWarm``, a stack not seen before usually resolves in well under a millisecond.
    func frames(for addresses: [UInt64], patience: Duration) -> [StackFrame]? {
        if let cached = cachedFrames(addresses) { return cached }
        return worker.run(patience: patience) { [self] in resolveHere(addresses) }
    }

    /// Names only, from a thread of their own (`rlk.names`), never queued behind the full
    /// resolutions: the symbol tables give names in milliseconds where DWARF's line and inline tables can
    /// take seconds to read for code not seen before. No file, line or inlined frame (a frame's
    /// ``StackFrame/module`` tells the application's code all the same), cached apart from full
    /// frames. What a stall's first report carries while its full frames are resolved.
    ///
    /// Waits at most `patience` for the names thread (it loads its tables once, from
    /// ``warmUp()``); nil when they did not come by then (they are cached when they do).
    ///
    /// An address that a full resolution has already resolved keeps its full frames: the
    /// application's own image is read in full at ``warmUp()``, and ``frames(for:patience:)``
    /// resolves the addresses of images already read before the others, so a first report that
    /// could not wait for a library's line tables still has the application's frames with their
    /// files (a synthesized `encode(to:)` says `<compiler-generated>`). Any other function that a
    /// full resolution has seen gets its file (no line): see `State.functionFiles`.
    func nameFrames(for addresses: [UInt64], patience: Duration) -> [StackFrame]? {
        let isNamed =
            namesState.locked { state in Self.cached(addresses, in: state) != nil }
            || namesWorker.run(patience: patience) { [self] in !nameFramesHere(addresses).isEmpty } ?? false
            || (crlm_fork_generation() != 0 && !nameFramesHere(addresses).isEmpty)
        guard isNamed, let named = namesState.locked({ state in Self.framesPerAddress(addresses, in: state) }) else { return nil }
        let (full, files) = state.locked { state in
            (addresses.indices.map { state.cache[Key(address: addresses[$0], isProgramCounter: $0 == 0)] }, state.functionFiles)
        }
        var frames: [StackFrame] = []
        for (index, names) in named.enumerated() {
            if let resolved = full[index] {
                frames += resolved
                continue
            }
            for var frame in names {
                if frame.file == nil, let symbol = frame.symbol, let file = files[symbol] { frame.file = file }
                frames.append(frame)
            }
        }
        return frames
    }

    private func nameFramesHere(_ addresses: [UInt64]) -> [StackFrame] {
        resolve(addresses, in: namesState, options: [.useSymbolCache])
    }

    private static func cached(_ addresses: [UInt64], in state: State) -> [StackFrame]? {
        framesPerAddress(addresses, in: state).map { Array($0.joined()) }
    }

    /// The frames of each of `addresses` (the first the interrupted instruction), if every one is
    /// cached in `state`.
    private static func framesPerAddress(_ addresses: [UInt64], in state: State) -> [[StackFrame]]? {
        var frames: [[StackFrame]] = []
        frames.reserveCapacity(addresses.count)
        for (index, address) in addresses.enumerated() {
            guard let known = state.cache[Key(address: address, isProgramCounter: index == 0)] else { return nil }
            frames.append(known)
        }
        return frames
    }

    private let namesState = ForkSafeLock { State() }

    /// Stacks queued for resolution in the background.
    private let queued = Mutex<Set<[UInt64]>>([])

    /// The frames of `addresses` if every one is cached.
    private func cachedFrames(_ addresses: [UInt64]) -> [StackFrame]? {
        state.locked { state in Self.cached(addresses, in: state) }
    }

    /// Resolves on the calling thread (the symbolication thread, but in a forked child). The
    /// addresses in images already read first, cached at once (microseconds), then the others
    /// (a library's line tables not read yet take from tens of milliseconds to seconds): what
    /// ``nameFrames(for:patience:)`` finds of them meanwhile.
    private func resolveHere(_ addresses: [UInt64]) -> [StackFrame] {
        let options: Backtrace.SymbolicationOptions = [.showInlineFrames, .showSourceLocations, .useSymbolCache]
        let inReadImages = state.locked { state -> [Int] in
            guard let images = state.images else { return [] }
            return addresses.indices.filter { index in
                images.indexOfImage(at: Backtrace.Address(addresses[index])).map { state.readImages.contains(UInt64(images[$0].baseAddress) ?? 0) } ?? false
            }
        }
        if !inReadImages.isEmpty, inReadImages.count < addresses.count {
            resolve(inReadImages.map { (address: addresses[$0], isProgramCounter: $0 == 0) }, in: state, options: options)
        }
        return resolve(addresses, in: state, options: options)
    }

    /// Resolves what `lock`'s cache lacks of `addresses`, then returns their frames. The lock is
    /// not held while the runtime reads the tables (up to seconds): a caller that only looks in
    /// the cache never waits for a resolution.
    private func resolve(_ addresses: [UInt64], in lock: ForkSafeLock<State>, options: Backtrace.SymbolicationOptions) -> [StackFrame] {
        resolve(addresses.enumerated().map { (address: $1, isProgramCounter: $0 == 0) }, in: lock, options: options)
        return lock.locked { state in Self.cached(addresses, in: state) } ?? []
    }

    /// Resolves what `lock`'s cache lacks of `entries` into it.
    private func resolve(
        _ entries: [(address: UInt64, isProgramCounter: Bool)], in lock: ForkSafeLock<State>, options: Backtrace.SymbolicationOptions
    ) {
        let (missing, imageMap) = lock.locked { state -> ([(address: UInt64, isProgramCounter: Bool)], ImageMap?) in
            let missing = entries.filter { state.cache[Key(address: $0.address, isProgramCounter: $0.isProgramCounter)] == nil }
            return (missing, missing.isEmpty ? nil : self.images(covering: missing.map(\.address), &state))
        }
        if let imageMap {
            let resolved = Self.symbolicate(missing, imageMap, options: options)
            let withFiles = options.contains(.showSourceLocations)
            lock.locked { state in
                if state.cache.count + resolved.count > 100_000 { state.cache.removeAll(keepingCapacity: true) }
                if state.functionFiles.count > 100_000 { state.functionFiles.removeAll(keepingCapacity: true) }
                state.cache.merge(resolved) { _, new in new }
                for entry in missing { state.readImages.insert(Self.imageBase(entry.address, imageMap).base) }
                guard withFiles else { return }
                for frame in resolved.values.joined() where !frame.inlined {
                    guard let symbol = frame.symbol, let file = frame.file else { continue }
                    if let known = state.functionFiles[symbol], !known.contains(Self.generatedFile) { continue }
                    state.functionFiles[symbol] = file
                }
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

    private static func symbolicate(
        _ entries: [(address: UInt64, isProgramCounter: Bool)], _ images: ImageMap, options: Backtrace.SymbolicationOptions
    ) -> [Key: [StackFrame]] {
        let richFrames: [RichFrame<UInt64>] = entries.map {
            $0.isProgramCounter ? .programCounter($0.address) : .returnAddress($0.address)
        }
        let backtrace = Backtrace(architecture: Self.architecture, frames: richFrames, images: images)
        var resolved: [Key: [StackFrame]] = [:]
        if let symbolicated = backtrace.symbolicated(with: images, options: options) {
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
        var result: [Key: [StackFrame]] = [:]
        for entry in entries {
            let key = Key(address: entry.address, isProgramCounter: entry.isProgramCounter)
            var frames = resolved[key] ?? []
            if frames.isEmpty || frames.allSatisfy({ $0.symbol == nil }) {
                frames = [Self.dladdrFrame(entry.address, images)]
            }
            result[key] = frames
        }
        return result
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

    /// What the line tables give as the file of code the compiler wrote (synthesized conformances,
    /// thunks), after a directory (`//<compiler-generated>`).
    static let generatedFile = "<compiler-generated>"

    #if arch(x86_64)
    private static let architecture = "x86_64"
    #elseif arch(arm64)
    private static let architecture = "arm64"
    #else
    private static let architecture = "unknown"
    #endif
}

/// The thread every symbolication runs on (see ``Symbolicator``): requests are closures, run in
/// order; a caller waits for its own. Background requests (``postInBackground(_:)``) run one at a
/// time, only when no other request is queued.
private final class SymbolicationThread: Sendable {
    private let name: String

    init(name: String) { self.name = name }

    private struct State {
        var thread: MonitorThread?
        /// The process that started the thread: in a forked child it does not exist.
        var owner: Int32 = 0
        var requests: [@Sendable () -> Void] = []
        var background: [@Sendable () -> Void] = []
    }

    private let state = ForkSafeLock { State() }

    /// Runs `body` on the thread and returns its result; nil when the caller is the thread itself
    /// or the thread is not this process's (a forked child): the caller then runs it.
    func run<Result: Sendable>(_ body: @escaping @Sendable () -> Result) -> Result? {
        let box = ResultBox<Result>()
        guard post({ box.set(body()) }) else { return nil }
        return box.wait()
    }

    /// ``run(_:)``, waiting at most `patience`: nil too when the result did not come by then (the
    /// request still runs).
    func run<Result: Sendable>(patience: Duration, _ body: @escaping @Sendable () -> Result) -> Result? {
        let box = ResultBox<Result>()
        guard post({ box.set(body()) }) else { return nil }
        return box.wait(patience: patience)
    }

    /// Queues `body` on the thread without waiting; false (nothing queued) where ``run(_:)``
    /// gives nil.
    @discardableResult
    func post(_ body: @escaping @Sendable () -> Void) -> Bool {
        // A forked child resolves on its calling threads, as before the thread existed: a thread of
        // its parent may have held the runtime's locks at the fork, and starting one in a child of
        // a multi-threaded process is what ThreadSanitizer does not support.
        if crlm_fork_generation() != 0 { return false }
        let pid = getpid()
        let thread = state.locked { state -> MonitorThread? in
            if state.owner == 0 {
                state.owner = pid
                state.thread = MonitorThread(name: name) { [self] in serve() }
            }
            guard state.owner == pid, let thread = state.thread, !thread.isCurrent else { return nil }
            state.requests.append(body)
            return thread
        }
        thread?.wake()
        return thread != nil
    }

    /// Queues `body` behind every request, now and to come, that is not a background one; from
    /// the thread itself too. Dropped in a forked child (nothing waits for it).
    func postInBackground(_ body: @escaping @Sendable () -> Void) {
        if crlm_fork_generation() != 0 { return }
        let pid = getpid()
        let thread = state.locked { state -> MonitorThread? in
            guard state.owner == pid, let thread = state.thread else { return nil }
            state.background.append(body)
            return thread
        }
        thread?.wake()
    }

    private func serve() {
        while true {
            let batch = state.locked { state -> [@Sendable () -> Void] in
                if !state.requests.isEmpty {
                    defer { state.requests.removeAll() }
                    return state.requests
                }
                return state.background.isEmpty ? [] : [state.background.removeFirst()]
            }
            for request in batch { request() }
            if batch.isEmpty, let thread = state.locked({ $0.thread }) { thread.sleep(until: .now + .seconds(3600)) }
        }
    }
}

/// One result, handed from the symbolication thread to the caller that waits for it.
private final class ResultBox<Value: Sendable>: Sendable {
    private let value = Mutex<Value?>(nil)
    private let ready = DispatchSemaphore(value: 0)

    func set(_ result: Value) {
        value.locked { $0 = result }
        ready.signal()
    }

    func wait() -> Value {
        ready.wait()
        return value.locked { $0 }!
    }

    func wait(patience: Duration) -> Value? {
        let nanoseconds = Int(min(max(patience.saturatedNanoseconds, 0), 3_600_000_000_000))
        guard ready.wait(timeout: .now() + .nanoseconds(nanoseconds)) == .success else { return nil }
        return value.locked { $0 }
    }
}
