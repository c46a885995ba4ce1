// Labels: the names a loop's items carry in traces (RunLoopMonitor's TraceRecorder) and in the
// loop's description. An item with no label is named by its kind and a stable identity, not by its
// `description`, which shows state that changes from one call to the next.

extension RunLoopSource: TraceNamed {
    /// A name for the source in traces and in its loop's description (e.g. `"touch dispatch"`);
    /// nil (the default) names it `RunLoopSource 0x… order N`. Any thread.
    public var label: String? {
        get { traceNameSlot.label }
        set { traceNameSlot.label = newValue }
    }

    func traceName(in buffer: TraceBuffer) -> UInt32 {
        traceNameSlot.index(in: buffer) { "RunLoopSource \(objectAddress(self)) order \(order)" }
    }
}

extension RunLoopTimer: TraceNamed {
    /// A name for the timer in traces and in its loop's description (e.g. `"frame timer"`); nil
    /// (the default) names it `RunLoopTimer 0x… interval …`. Any thread.
    public var label: String? {
        get { traceNameSlot.label }
        set { traceNameSlot.label = newValue }
    }

    func traceName(in buffer: TraceBuffer) -> UInt32 {
        traceNameSlot.index(in: buffer) {
            intervalNs == 0
                ? "RunLoopTimer \(objectAddress(self)) one-shot"
                : "RunLoopTimer \(objectAddress(self)) interval \(formatNanoseconds(intervalNs))"
        }
    }
}

extension RunLoopObserver: TraceNamed {
    /// A name for the observer in traces and in its loop's description (e.g.
    /// `"_wrapRunLoopWithAutoreleasePoolHandler"`); nil (the default) names it
    /// `RunLoopObserver 0x… order N`. Any thread.
    public var label: String? {
        get { traceNameSlot.label }
        set { traceNameSlot.label = newValue }
    }

    func traceName(in buffer: TraceBuffer) -> UInt32 {
        traceNameSlot.index(in: buffer) { "RunLoopObserver \(objectAddress(self)) order \(order)" }
    }
}

extension MessagePort: TraceNamed {
    /// A name for the port in traces and in its loop's description; nil (the default) names it
    /// `MessagePort<Message> 0x…`. Any thread.
    public var label: String? {
        get { traceNameSlot.label }
        set { traceNameSlot.label = newValue }
    }

    func traceName(in buffer: TraceBuffer) -> UInt32 {
        traceNameSlot.index(in: buffer) { "MessagePort<\(Message.self)> \(objectAddress(self))" }
    }
}

extension FileDescriptorSource: TraceNamed {
    /// A name for the source in traces and in its loop's description; nil (the default) names it
    /// `FileDescriptorSource fd N`. Any thread.
    public var label: String? {
        get { traceNameSlot.label }
        set { traceNameSlot.label = newValue }
    }

    func traceName(in buffer: TraceBuffer) -> UInt32 {
        traceNameSlot.index(in: buffer) { "FileDescriptorSource fd \(descriptor)" }
    }
}
