#if GLib
internal import CGLib
import Glibc
import Synchronization

// The name of the GLib source a thread is dispatching, read from another thread: what a stall in
// the bridge's dispatch callout is reported with (`g_source_get_name (g_main_current_source ())`,
// which only the dispatching thread can call, and that thread is the one stuck).
//
// GLib keeps, per thread, the depth of dispatches and the source being dispatched in a
// GMainDispatch (gmain.c: `struct _GMainDispatch { gint depth; GSource *source; }`, a GPrivate,
// so a pthread key's value; GLib before 2.36 kept `GSList *dispatching_sources` there instead).
// It is private, so the reader finds it by probing rather than by trusting a layout: on the
// loop's thread, inside the dispatch of a probe source of its own (on a throwaway context: the
// record is per thread, not per context), it looks through the thread's pthread keys for a
// record whose depth is `g_main_depth()` and whose source is `g_main_current_source()` (or a list
// whose first element is). Found, the record's address is kept; not found (another GLib, another
// layout), there is no reader and stalls are named by the callout's label alone.
//
// Another thread then reads the record, the source's `name` field (GSource is public) and the
// name's bytes with process_vm_readv on its own process, which fails instead of faulting where
// memory is gone: the dispatch may end, and the source go, while the reader reads. What it reads
// then is checked by the loop (`RunLoop.calloutDetail(of:)` drops an answer given after the loop
// left the callout); a name read just as the loop moved to the next source belongs to one of the
// callout's sources.

/// Reads the name of the GLib source a thread is dispatching (see above).
final class DispatchNames: Sendable {
    /// The thread's GMainDispatch record.
    private let record: UInt
    /// The record's second field is the list of sources being dispatched (GLib < 2.36), not the
    /// source.
    private let isList: Bool
    private let nameOffset = UInt(crlg_source_name_offset())
    /// process_vm_readv was refused (seccomp): nothing more is read.
    private let unavailable = Atomic<Bool>(false)

    private init(record: UInt, isList: Bool) {
        self.record = record
        self.isList = isList
    }

    /// The calling thread's reader; nil when the record cannot be found. Loop thread.
    static func reader() -> DispatchNames? {
        let context = g_main_context_new()
        defer { g_main_context_unref(context) }
        let found = UnsafeMutablePointer<(record: UInt, isList: Bool)?>.allocate(capacity: 1)
        found.initialize(to: nil)
        defer { found.deallocate() }
        let funcs = UnsafeMutablePointer<GSourceFuncs>.allocate(capacity: 1)
        defer { funcs.deallocate() }
        funcs.initialize(
            to: GSourceFuncs(
                prepare: { _, timeout in
                    timeout?.pointee = 0
                    return 1
                },
                check: { _ in 1 },
                dispatch: { _, _, data in
                    data?.assumingMemoryBound(to: (record: UInt, isList: Bool)?.self).pointee = DispatchNames.probe()
                    return 1
                },
                finalize: nil, closure_callback: nil, closure_marshal: nil))
        let source = g_source_new(funcs, UInt32(MemoryLayout<GSource>.size))
        // The dispatch function gets the callback's data: set a callback that is never called.
        g_source_set_callback(source, { _ in 0 }, UnsafeMutableRawPointer(found), nil)
        g_source_attach(source, context)
        g_main_context_iteration(context, 0)
        g_source_destroy(source)
        g_source_unref(source)
        guard let record = found.pointee else { return nil }
        return DispatchNames(record: record.record, isList: record.isList)
    }

    /// On the probe's dispatch: the address of the thread's record, found among its pthread keys'
    /// values.
    private static func probe() -> (record: UInt, isList: Bool)? {
        let depth = g_main_depth()
        guard let current = g_main_current_source() else { return nil }
        let source = UInt(bitPattern: current)
        var unavailable = false
        for key in 0..<crlg_thread_keys_max() {
            guard let value = crlg_thread_specific(key) else { continue }
            var header: (Int32, Int32, UInt) = (0, 0, 0)
            guard withUnsafeMutableBytes(of: &header, { crlg_read_own_memory($0.baseAddress, value, 16, &unavailable) }),
                header.0 == depth
            else {
                if unavailable { return nil }
                continue
            }
            if header.2 == source { return (UInt(bitPattern: value), false) }
            // GLib < 2.36: a GSList whose first element's data is the source.
            var node: (UInt, UInt) = (0, 0)
            if header.2 != 0,
                withUnsafeMutableBytes(of: &node, { crlg_read_own_memory($0.baseAddress, UnsafeRawPointer(bitPattern: header.2), 16, &unavailable) }),
                node.0 == source
            {
                return (UInt(bitPattern: value), true)
            }
        }
        return nil
    }

    /// The name of the source the thread dispatches now; nil when it dispatches none, the source
    /// has no name, or the memory is gone. Any thread; never blocks.
    func currentSourceName() -> String? {
        guard !unavailable.load(ordering: .relaxed) else { return nil }
        var header: (Int32, Int32, UInt) = (0, 0, 0)
        guard read(&header, at: record), header.0 > 0, header.2 != 0 else { return nil }
        var source = header.2
        if isList {
            var node: (UInt, UInt) = (0, 0)
            guard read(&node, at: source), node.0 != 0 else { return nil }
            source = node.0
        }
        var name: UInt = 0
        guard read(&name, at: source &+ nameOffset), name != 0 else { return nil }
        // Up to 256 bytes, a page's end at a time (a read that crosses into an unmapped page
        // fails as a whole).
        var bytes: [UInt8] = []
        var address = name
        while bytes.count < 256 {
            let toPageEnd = 4096 - Int(address % 4096)
            var chunk = [UInt8](repeating: 0, count: min(toPageEnd, 64))
            let ok = chunk.withUnsafeMutableBytes { buffer in
                var refused = false
                defer { if refused { unavailable.store(true, ordering: .relaxed) } }
                return crlg_read_own_memory(buffer.baseAddress, UnsafeRawPointer(bitPattern: address), buffer.count, &refused)
            }
            guard ok else { return nil }
            if let end = chunk.firstIndex(of: 0) {
                bytes += chunk[..<end]
                return String(decoding: bytes, as: UTF8.self)
            }
            bytes += chunk
            address &+= UInt(chunk.count)
        }
        return String(decoding: bytes, as: UTF8.self) + "…"
    }

    private func read<T>(_ value: inout T, at address: UInt) -> Bool {
        var refused = false
        let ok = withUnsafeMutableBytes(of: &value) { buffer in
            crlg_read_own_memory(buffer.baseAddress, UnsafeRawPointer(bitPattern: address), buffer.count, &refused)
        }
        if refused { unavailable.store(true, ordering: .relaxed) }
        return ok
    }
}
#endif
