import CRunLoopMonitor
import Dispatch
import Glibc
import RunLoopKit
import Synchronization

/// A source for a loop the application runs itself (a GLib main loop, a game loop, a worker that
/// takes jobs from a queue): the loop calls ``begin(_:)`` when a unit of work starts and ``end()``
/// when it waits again, or only ``beat(_:)`` once per frame. Each call is a few atomic stores and a
/// clock read: no allocation, no lock, no system call.
///
/// Made on the thread itself with ``current(name:)``, or from another thread with
/// ``init(threadID:name:)`` (which checks that the thread exists).
public final class ThreadStallSource: StallSource {
    /// The watched thread's kernel id.
    public let threadID: Int32
    /// The name given at init.
    public let stallSourceName: String
    private let work = Atomic<UInt64>(0)
    private let busy = Atomic<Bool>(false)
    private let sinceNs = Atomic<Int64>(0)
    /// The item's UTF-8, NUL-terminated (a string literal's storage), or 0.
    private let itemStart = Atomic<UInt>(0)

    /// Why a source cannot be made.
    public enum SourceError: Error, Sendable, Hashable, CustomStringConvertible {
        /// No thread with this id exists in this process.
        case noSuchThread(threadID: Int32)

        /// In words.
        public var description: String {
            switch self {
            case .noSuchThread(let id):
                "no thread \(id) in this process (/proc/self/task/\(id) does not exist): it exited, or the id is another process's"
            }
        }
    }

    /// A source for thread `threadID` of this process (its kernel id, `gettid()`).
    ///
    /// - Throws: ``SourceError/noSuchThread(threadID:)`` when no such thread exists now.
    public init(threadID: Int32, name: String) throws(SourceError) {
        guard threadID > 0, ProcessThreads.exists(threadID) else { throw .noSuchThread(threadID: threadID) }
        self.threadID = threadID
        self.stallSourceName = name
    }

    /// A source for the calling thread, prepared for sampling (its capture signal unblocked).
    public static func current(name: String) -> ThreadStallSource {
        ThreadStack.prepareCurrentThread()
        // The calling thread exists.
        return try! ThreadStallSource(threadID: crlm_gettid(), name: name)
    }

    /// A unit of work named `item` begins on the thread. Call it on the watched thread.
    public func begin(_ item: StaticString = "work") {
        // One word, so a look never pairs one item's start with another's length; a StaticString
        // with a pointer is NUL-terminated. (One made from a single scalar has none: "work".)
        itemStart.store(item.hasPointerRepresentation ? UInt(bitPattern: item.utf8Start) : 0, ordering: .relaxed)
        sinceNs.store(RunLoop.nanoseconds(of: ContinuousClock.now), ordering: .relaxed)
        work.add(1, ordering: .relaxed)
        busy.store(true, ordering: .releasing)
    }

    /// The unit of work ends; the thread waits. Call it on the watched thread.
    public func end() {
        sinceNs.store(RunLoop.nanoseconds(of: ContinuousClock.now), ordering: .relaxed)
        busy.store(false, ordering: .releasing)
    }

    /// The thread is alive and starts its next unit of work (a frame): for a loop that never
    /// waits, so only a frame that lasts longer than the threshold is a stall.
    public func beat(_ item: StaticString = "frame") { begin(item) }

    /// What the hooks published; the thread's exit is read from the kernel.
    public func stallSnapshot() -> StallSnapshot {
        let isBusy = busy.load(ordering: .acquiring)
        let since = RunLoop.instant(ofNanoseconds: sinceNs.load(ordering: .relaxed))
        let item: String
        if isBusy {
            let start = UnsafePointer<CChar>(bitPattern: itemStart.load(ordering: .relaxed))
            item = start.map { String(cString: $0) } ?? "work"
        } else {
            item = ""
        }
        return StallSnapshot(
            activity: isBusy ? .busy : .idle, threadID: threadID, work: work.load(ordering: .relaxed),
            busySince: isBusy ? since : nil, idleSince: isBusy ? nil : since, phase: isBusy ? "callout" : "waiting",
            item: item, threadExited: !ProcessThreads.exists(threadID))
    }

    /// Nothing to do: ``current(name:)`` prepared the thread; a thread named by id is sampled
    /// while it is blocked in the kernel, and while it runs if it does not block the signal.
    public func prepareForStallMonitoring() {}
}

extension StallMonitor {
    /// Watches thread `threadID` of this process (its kernel id), which reports its own work
    /// through the returned source's hooks (``ThreadStallSource/begin(_:)``,
    /// ``ThreadStallSource/end()``, ``ThreadStallSource/beat(_:)``).
    ///
    /// - Throws: ``ThreadStallSource/SourceError/noSuchThread(threadID:)`` when no such thread
    ///   exists.
    @discardableResult
    public func watch(threadID: Int32, name: String) throws(ThreadStallSource.SourceError) -> ThreadStallSource {
        let source = try ThreadStallSource(threadID: threadID, name: name)
        watch(source)
        return source
    }
}
