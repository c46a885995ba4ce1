import CRunLoopMonitor

/// Samples one thread's stack again and again, merging identical stacks with counts.
///
/// Each sample is a ``ThreadStack`` capture: a thread parked in the kernel is read without a
/// signal, so sampling a blocked thread as often as it likes changes nothing for it.
struct StackSampler {
    let threadID: Int32
    private(set) var sampleCount = 0
    private(set) var lastError: ThreadStackError?
    private var counts: [[UInt64]: Int] = [:]
    private var order: [[UInt64]] = []

    init(threadID: Int32) { self.threadID = threadID }

    /// What identifies a stall for the back-off: the functions (their unwind-table start
    /// addresses, so the instruction inside each does not matter) of the first stack's innermost
    /// six frames outside the system libraries (the C library's sleep or clock frames, the Swift
    /// runtime); nil before a sample.
    var signature: [UInt64]? {
        guard let first = order.first else { return nil }
        var functions: [UInt64] = []
        for address in first where functions.count < 6 {
            if Self.isSystemImage(address) { continue }
            let start = crlm_function_start(address == first.first ? address : address &- 1)
            functions.append(start != 0 ? start : address)
        }
        return functions.isEmpty ? Array(first.prefix(6)) : functions
    }

    /// Whether `address` is in a system library, or in a sanitizer's runtime (linked into the
    /// executable, its exported functions named `__asan_…`, `__interceptor_…` and the like).
    private static func isSystemImage(_ address: UInt64) -> Bool {
        guard let (name, function) = imageAndSymbol(of: address) else { return false }
        if CallTree.systemImagePrefixes.contains(where: { name.hasPrefix($0) }) { return true }
        return Self.sanitizerPrefixes.contains { function.hasPrefix($0) }
    }

    /// The file name of the image `address` is in and its nearest dynamic symbol (`dladdr`).
    private static func imageAndSymbol(of address: UInt64) -> (image: String, symbol: String)? {
        var image = [CChar](repeating: 0, count: 512)
        var symbol = [CChar](repeating: 0, count: 64)
        var base: UInt64 = 0
        var symbolAddress: UInt64 = 0
        guard crlm_dladdr(address, &image, image.count, &base, &symbol, symbol.count, &symbolAddress) else { return nil }
        let path = String(decoding: image.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
        let name = path.split(separator: "/").last.map(String.init) ?? path
        return (name, String(decoding: symbol.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self))
    }

    /// Whether a captured stack was unwound to the thread's entry: three frames at least (the
    /// entry, the thread's body, what it runs), one of the two outermost in the C library
    /// (`start_thread` and `clone3` for a thread it started; `__libc_start_main` below `_start`
    /// for the main thread). An unwinder that meets an instruction without unwind information
    /// stops there: seen in the Swift runtime (two frames) and in the C library's `free` (one),
    /// stacks that name none of the code that called them.
    static func reachesThreadEntry(_ stack: [UInt64]) -> Bool {
        stack.count >= 3 && stack.suffix(2).contains { address in imageAndSymbol(of: address)?.image.hasPrefix("libc.so") ?? false }
    }

    static let sanitizerPrefixes = ["__asan", "__tsan", "__sanitizer", "__interceptor", "___interceptor", "__lsan", "__ubsan"]

    /// Takes one sample. Returns false when the thread is gone.
    mutating func sample(timeout: Duration) -> Bool {
        guard threadID != 0 else {
            lastError = .threadUnknown
            return true
        }
        do {
            let stack = try ThreadStack.captureAddresses(threadID: threadID, timeout: timeout)
            record(stack.addresses)
            return true
        } catch {
            lastError = error
            if case .noSuchThread = error { return false }
            return true
        }
    }

    /// Under ThreadSanitizer the handler does not run where the signal arrived but where the
    /// sanitizer's runtime delivers it (its next interceptor or atomic operation), below frames of
    /// its own: those frames and the handler's are dropped, so the stack starts at the sanitizer's
    /// entry point in the application's code.
    static func withoutSanitizerDelivery(_ frames: [StackFrame]) -> [StackFrame] {
        guard let last = frames.lastIndex(where: { frame in
            guard let symbol = frame.symbol else { return false }
            return symbol.hasPrefix("__tsan::ProcessPendingSignals") || symbol.contains("CallUserSignalHandler")
        }) else { return frames }
        return Array(frames[(last + 1)...])
    }

    /// Takes a stall's first sample, which its first report is blamed from alone: a capture that
    /// did not unwind to the thread's entry (``reachesThreadEntry(_:)``) is taken again, twice at
    /// most, and only the last is kept. Returns false when the thread is gone.
    mutating func sampleFirst(timeout: Duration) -> Bool {
        guard threadID != 0 else { return sample(timeout: timeout) }
        var kept: [UInt64]?
        for _ in 0..<3 {
            do {
                let addresses = try ThreadStack.captureAddresses(threadID: threadID, timeout: timeout).addresses
                kept = addresses
                if Self.reachesThreadEntry(addresses) { break }
            } catch {
                lastError = error
                if case .noSuchThread = error, kept == nil { return false }
                break
            }
        }
        if let kept { record(kept) }
        return true
    }

    private mutating func record(_ stack: [UInt64]) {
        sampleCount += 1
        if let count = counts[stack] {
            counts[stack] = count + 1
        } else {
            counts[stack] = 1
            order.append(stack)
        }
    }

    /// The distinct stacks so far, symbolicated, most frequent first (ties: first seen first).
    /// Stacks that differ only in where inside the same functions they were (the exact
    /// instruction, the line) are one stack: its frames are those of the first seen.
    /// `symbolicated` false: frames as ``Symbolicator/unsymbolicatedFrames(for:)`` gives them
    /// (no waiting for the symbol tables).
    func samples(symbolicated: Bool = true) -> [StackSample] {
        samples { symbolicated ? Symbolicator.shared.frames(for: $0) : Symbolicator.unsymbolicatedFrames(for: $0) }!
    }

    /// The samples symbolicated if every address is resolved already (no waiting); else nil, and
    /// the missing addresses are resolved in the background (a large binary's line tables can take
    /// seconds to read, and a stall's first report must not wait for them).
    func samplesIfSymbolicated() -> [StackSample]? {
        var complete = true
        for stack in order where Symbolicator.shared.framesIfResolved(for: stack) == nil { complete = false }
        return complete ? samples { Symbolicator.shared.framesIfResolved(for: $0) } : nil
    }

    /// The samples fully symbolicated, waiting at most `patience` in all for the symbolication
    /// thread (``Symbolicator/frames(for:patience:)``); nil when they did not all come by then (the
    /// rest are still resolved, and cached).
    func samplesSymbolicated(patience: Duration) -> [StackSample]? {
        let deadline = ContinuousClock.now + patience
        return samples { Symbolicator.shared.frames(for: $0, patience: max(deadline - .now, .zero)) }
    }

    /// The samples with names only (``Symbolicator/nameFrames(for:patience:)``), for a first
    /// report whose full frames are still being resolved; nil when the names did not come within
    /// `patience`.
    func namedSamples(patience: Duration) -> [StackSample]? {
        samples { Symbolicator.shared.nameFrames(for: $0, patience: patience) }
    }

    private func samples(_ frames: ([UInt64]) -> [StackFrame]?) -> [StackSample]? {
        var merged: [[String]: Int] = [:]
        var result: [StackSample] = []
        for stack in order {
            guard let resolved = frames(stack) else { return nil }
            let frames = Self.withoutSanitizerDelivery(resolved)
            let key = frames.map { $0.symbol ?? "\($0.image)+\($0.imageOffset)" }
            if let index = merged[key] {
                result[index].count += counts[stack]!
            } else {
                merged[key] = result.count
                result.append(StackSample(count: counts[stack]!, frames: frames))
            }
        }
        return result.enumerated().sorted { ($0.element.count, -$0.offset) > ($1.element.count, -$1.offset) }.map(\.element)
    }
}
