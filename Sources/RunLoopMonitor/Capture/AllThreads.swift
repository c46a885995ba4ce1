import CRunLoopMonitor
import Glibc

// Every thread's stack at once: what the seeds' lag monitor dumps with BSBacktraceLogger's
// `HCCCallStackTypeAll` (seeds 000/001), on Linux. Each thread is captured as
// `captureAddresses(threadID:)` captures one: a thread parked in the kernel is read where it is
// parked, without a signal; a running one gets the capture signal, with the same checks before it
// is sent. The calling thread is captured too, as the others are (the handler runs on it before
// the capture's wait begins).

extension ThreadStack {
    /// One thread's stack in an all-threads capture (``captureAll(timeout:)``).
    public struct ThreadSnapshot: Sendable, Hashable, Codable, CustomStringConvertible {
        /// The thread's kernel id.
        public var threadID: Int32
        /// Its name (`/proc/self/task/<tid>/comm`, at most 15 bytes), or `?` if it exited meanwhile.
        public var name: String
        /// Whether it is the thread that made the capture.
        public var isCallingThread: Bool
        /// Its stack, innermost frame first; empty when it could not be captured.
        public var frames: [StackFrame]
        /// How the stack was unwound; nil when it could not be captured.
        public var unwinder: RawStack.Unwinder?
        /// Why it could not be captured (``ThreadStackError``'s description), nil when it was.
        public var error: String?

        /// Makes a snapshot (tests and decoders; ``captureAll(timeout:)`` makes the real ones).
        public init(
            threadID: Int32, name: String, isCallingThread: Bool, frames: [StackFrame], unwinder: RawStack.Unwinder?,
            error: String?
        ) {
            self.threadID = threadID
            self.name = name
            self.isCallingThread = isCallingThread
            self.frames = frames
            self.unwinder = unwinder
            self.error = error
        }

        /// `thread 1234 'name'`, then one line per frame (or the error).
        public var description: String {
            var lines = ["thread \(threadID) '\(name)'\(isCallingThread ? " (the capturing thread)" : "")"]
            if let error {
                lines.append("  not captured: \(error)")
            } else {
                for (index, frame) in frames.enumerated() { lines.append("  \(index) \(frame.summary)") }
            }
            return lines.joined(separator: "\n")
        }
    }

    /// A thread's stack as addresses, before symbolication (see ``captureAllAddresses(timeout:)``).
    public struct RawThreadSnapshot: Sendable, Hashable {
        /// The thread's kernel id.
        public var threadID: Int32
        /// Its name, or `?` if it exited meanwhile.
        public var name: String
        /// Whether it is the thread that made the capture.
        public var isCallingThread: Bool
        /// The captured stack, or why it could not be captured.
        public var stack: Result<RawStack, ThreadStackError>
    }

    /// Captures the stack of every thread of the process, the calling thread included, and
    /// symbolicates them: a dump of all threads, as iOS lag monitors take with
    /// `HCCCallStackTypeAll`.
    ///
    /// Threads are captured one after another (a snapshot of each, not of all at one instant),
    /// in ascending id order; a thread that exits meanwhile is left out, one that cannot be
    /// captured (it blocks the capture signal, a C library made its stack too small) is listed
    /// with its ``ThreadSnapshot/error``. Threads blocked in the kernel are read without a signal
    /// (their calls go on undisturbed); each running thread is interrupted for a few
    /// microseconds.
    ///
    /// ```swift
    /// for thread in ThreadStack.captureAll() { print(thread) }
    /// ```
    ///
    /// - Parameter timeout: How long to wait for each running thread's handler.
    /// - Complexity: One capture per thread (tens of microseconds each), plus symbolication of new
    ///   addresses on the calling thread.
    public static func captureAll(timeout: Duration = defaultTimeout) -> [ThreadSnapshot] {
        captureAllAddresses(timeout: timeout).map(symbolicate)
    }

    /// ``captureAll(timeout:)`` without symbolication: what a monitor takes while a stall lasts,
    /// to symbolicate later on another thread (``symbolicate(_:)->ThreadStack.ThreadSnapshot``).
    public static func captureAllAddresses(timeout: Duration = defaultTimeout) -> [RawThreadSnapshot] {
        captureAllAddresses(timeout: timeout, first: nil)
    }

    /// ``captureAllAddresses(timeout:)``, capturing thread `first` before the others (a stalled
    /// loop's thread, while it is still where the stall is); listed in id order all the same.
    static func captureAllAddresses(timeout: Duration, first: Int32?) -> [RawThreadSnapshot] {
        let own = ProcessThreads.ownID
        var snapshots: [RawThreadSnapshot] = []
        var order = ProcessThreads.ids().sorted()
        if let first, let index = order.firstIndex(of: first) { order.insert(order.remove(at: index), at: 0) }
        for threadID in order {
            let stack: Result<RawStack, ThreadStackError>
            do {
                stack = .success(try captureAddresses(threadID: threadID, timeout: timeout))
            } catch .noSuchThread {
                continue  // it exited since the listing
            } catch {
                stack = .failure(error)
            }
            snapshots.append(
                RawThreadSnapshot(
                    threadID: threadID, name: ProcessThreads.name(of: threadID) ?? "?", isCallingThread: threadID == own,
                    stack: stack))
        }
        return snapshots.sorted { $0.threadID < $1.threadID }
    }

    /// Names the addresses of one thread of an all-threads capture.
    public static func symbolicate(_ snapshot: RawThreadSnapshot) -> ThreadSnapshot {
        switch snapshot.stack {
        case .success(let stack):
            ThreadSnapshot(
                threadID: snapshot.threadID, name: snapshot.name, isCallingThread: snapshot.isCallingThread,
                frames: symbolicate(stack), unwinder: stack.unwinder, error: nil)
        case .failure(let error):
            ThreadSnapshot(
                threadID: snapshot.threadID, name: snapshot.name, isCallingThread: snapshot.isCallingThread,
                frames: [], unwinder: nil, error: error.description)
        }
    }
}
