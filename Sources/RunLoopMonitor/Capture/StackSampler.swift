/// Samples one thread's stack again and again, merging identical stacks with counts.
///
/// A thread blocked in the same system call (same `/proc/self/task/<tid>/syscall` reading: call,
/// arguments, stack pointer and program counter) that used no CPU since the last sample has not
/// moved: its last stack is counted again without a signal, so a blocked thread is interrupted
/// once per stretch, not once per sample (a signal makes calls such as `nanosleep` return `EINTR`).
struct StackSampler {
    let threadID: Int32
    private(set) var sampleCount = 0
    private(set) var lastError: ThreadStackError?
    private var counts: [[UInt64]: Int] = [:]
    private var order: [[UInt64]] = []
    private var last: (stack: [UInt64], call: String, cpu: Duration)?

    init(threadID: Int32) { self.threadID = threadID }

    /// The innermost frames of the first stack: what identifies a stall for the back-off.
    var signature: [UInt64]? { order.first.map { Array($0.prefix(8)) } }

    /// Takes one sample. Returns false when the thread is gone.
    mutating func sample(timeout: Duration) -> Bool {
        let cpu = ProcessThreads.cpuTime(of: threadID)
        if let last, let cpu, cpu - last.cpu < .milliseconds(1), let call = ProcessThreads.blockedCall(of: threadID),
            !call.hasPrefix("running"), call == last.call
        {
            record(last.stack)
            self.last = (last.stack, call, cpu)
            return true
        }
        do {
            let stack = try ThreadStack.captureAddresses(threadID: threadID, timeout: timeout)
            record(stack.addresses)
            if let cpu, let call = ProcessThreads.blockedCall(of: threadID), !call.hasPrefix("running") {
                last = (stack.addresses, call, cpu)
            } else {
                last = nil
            }
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
    func samples() -> [StackSample] {
        var merged: [[String]: Int] = [:]
        var result: [StackSample] = []
        for stack in order {
            let frames = Self.withoutSanitizerDelivery(Symbolicator.shared.frames(for: stack))
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
