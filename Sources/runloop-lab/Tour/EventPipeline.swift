import Foundation
import RunLoopKit
import RunLoopMonitor
import Synchronization

import class RunLoopKit.RunLoop

/// Experiment 16 (seeds 002, 003): the touch pipeline — a port (Source1) receives events from
/// another thread and hands each to a Source0, whose callout runs the handler — seen in the
/// loop's own trace.
struct EventPipeline: Experiment {
    let title = "A touch's way in: port (Source1) -> Source0 -> handler"
    let seed = Seed.cite(2, 3)
    let seedSays = """
        Seed 002: a touch is an IOHIDEvent SpringBoard sends to the app's mach port; the Source1 \
        __IOHIDEventSystemClientQueueCallback queues it and signals a Source0 that wakes the main \
        thread and delivers it; seed 003: "通过回调函数触发Sourece0(所以UIEvent实际上是基于Source0 \
        的)" (the callback fires a Source0, so UIEvent is Source0-based), calling \
        _UIApplicationHandleEventQueue. The Source0's name __handleEventQueue is iOS 9+'s, from \
        outside the seeds.
        """
    let summary = """
        On iOS, IOKit turns a touch into an IOHIDEvent that SpringBoard sends to the app's mach \
        port; the port's Source1 (__IOHIDEventSystemClientQueueCallback) only queues it and \
        signals a Source0 (__handleEventQueue), which delivers it through UIApplication's \
        sendEvent: to touchesBegan:. Here a "springboard" thread sends three touches 30 ms apart \
        to a MessagePort on the app thread's loop; its handler queues each touch and signals a \
        RunLoopSource, whose perform calls the handler. A TraceRecorder records the loop: the \
        callouts below are read from the recorded trace, not printed by the callbacks.
        """

    struct Touch: Sendable {
        let id: Int
        let x: Int
        let y: Int
    }

    func run() {
        let trace = TourLog()
        // `tour --trace` records the loop already (LoopThread): its recorder is the one to read.
        let recorder: TraceRecorder
        do { recorder = try LabTrace.recording ?? TraceRecorder(capacityPerLoop: 4_096) } catch {
            Out.line("cannot record: \(error)")
            return
        }
        let app = LoopThread(name: "app-main") { loop in
            recorder.record(loop)
            let queued = Mutex<[Touch]>([])
            let handled = SharedCounter()
            let eventQueue = RunLoopSource {
                for touch in queued.locked({ touches in defer { touches = [] }; return touches }) {
                    trace.log("    handler: sendEvent -> touchesBegan(touch \(touch.id) at \(touch.x),\(touch.y))")
                    if handled.increment() == 3 { RunLoop.current.stop() }
                }
            }
            eventQueue.label = "__handleEventQueue (Source0)"
            let port = MessagePort<Touch> { touch in
                queued.locked { $0.append(touch) }
                eventQueue.signal()
            }
            port.label = "__IOHIDEventSystemClientQueueCallback (Source1 port)"
            loop.add(eventQueue, forMode: .common)
            loop.add(port, forMode: .common)
            Pipeline.port.locked { $0 = port }
            loop.run(mode: .default, for: .seconds(5))
            port.invalidate()
            eventQueue.invalidate()
        }
        let loop = app.loop
        loop.waitUntilAsleep()
        for id in 1...3 {
            guard let port = Pipeline.port.locked({ $0 }) else { break }
            trace.log("springboard: send touch \(id) to the app's port")
            try? port.send(Touch(id: id, x: 40 * id, y: 300))
            usleep(30_000)
        }
        app.join()
        Pipeline.port.locked { $0 = nil }
        if LabTrace.recording == nil { recorder.stop() }
        let lane = recorder.snapshot().lanes.first { $0.threadName == "app-main" }

        Out.subheading("what the threads printed")
        trace.printEvents()
        Out.subheading("the loop's trace (TraceRecorder): the pass of each callout, and what ended each sleep")
        var pipelineLines = 0
        for span in lane?.spans ?? [] {
            switch span.kind {
            case .callout where span.phase == .sources1 || span.phase == .sources0:
                pipelineLines += 1
                Out.line("\(TourLog.ms(span.start, width: 8))  pass \(span.firstPass)  \(span.phase!)  \(span.name)")
            case .sleep:
                Out.line("\(TourLog.ms(span.start + span.duration, width: 8))  pass \(span.firstPass)  woke: \(span.detail ?? "?")")
            default: continue
            }
        }
        Out.subheading("summary: \(pipelineLines) pipeline callouts for 3 touches")
        Out.conclusion(
            "each touch takes two passes: the port's Source1 runs after the wake (it only queues the "
                + "touch and signals the Source0), and the Source0 runs at the start of the next pass, "
                + "without a sleep in between: a signalled Source0 makes the wait a poll.")
    }

    /// The app thread's port, handed to the sending thread.
    private enum Pipeline {
        static let port = Mutex<MessagePort<Touch>?>(nil)
    }
}
