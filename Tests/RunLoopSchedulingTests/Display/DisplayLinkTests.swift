import Glibc
import RunLoopKit
import RunLoopScheduling
import SharedTestSupport
import Synchronization
import Testing

@Suite struct DisplayLinkTests {
    /// Frames at the requested rate, on the grid: timestamps differ by whole frame durations,
    /// sequences grow by droppedFrames + 1.
    @Test func framesComeAtTheRateOnTheGrid() {
        onNewThread { loop in
            let frames = Mutex<[DisplayLink.Frame]>([])
            let link = DisplayLink(loop: loop, framesPerSecond: 100) { frame in frames.locked { $0.append(frame) } }
            defer { link.invalidate() }
            #expect(link.creationError == nil)
            run(loop, until: { frames.locked { $0.count } >= 20 })
            let all = frames.locked { $0 }
            #expect(all.count >= 20)
            for (previous, frame) in zip(all, all.dropFirst()) {
                #expect(frame.sequence == previous.sequence + UInt64(frame.droppedFrames) + 1)
                #expect(previous.timestamp.duration(to: frame.timestamp) == .milliseconds(10) * Int(frame.sequence - previous.sequence))
                #expect(frame.targetTimestamp == frame.timestamp + frame.duration)
            }
        }
    }

    /// A 100 ms stall at 100 frames per second: the next frame counts the frames that went by
    /// (from the timerfd's expiration count), 10 or so.
    @Test func aStallIsCountedAsDroppedFrames() {
        onNewThread { loop in
            let frames = Mutex<[DisplayLink.Frame]>([])
            let link = DisplayLink(loop: loop, framesPerSecond: 100) { frame in
                frames.locked { $0.append(frame) }
            }
            defer { link.invalidate() }
            run(loop, until: { frames.locked { $0.count } >= 3 })
            loop.perform { spin(for: .milliseconds(100)) }
            let count = frames.locked { $0.count }
            run(loop, until: { frames.locked { $0.count } >= count + 3 })
            let dropped = frames.locked { $0 }.map(\.droppedFrames).max() ?? 0
            // 100 ms is 10 frames: 9 dropped, at least 8 even if the stall began just after a frame.
            #expect(dropped >= 8, "\(frames.locked { $0.map(\.droppedFrames) })")
        }
    }

    /// Paused means disarmed: the loop is never woken by it; resumed, frames come again with no
    /// dropped frames counted for the pause.
    @Test func aPausedLinkNeverWakesTheLoop() {
        onNewThread { loop in
            let frames = Count()
            let lastDropped = Count()
            let link = DisplayLink(loop: loop, framesPerSecond: 100) { frame in
                frames.add()
                if frame.droppedFrames > 0 { lastDropped.add(frame.droppedFrames) }
            }
            defer { link.invalidate() }
            run(loop, until: { frames.value >= 2 })
            link.isPaused = true
            let counter = ActivityCounter(loop)
            let before = frames.value
            loop.run(mode: .default, for: .milliseconds(200))
            // One wakeup: the run's own deadline.
            #expect(counter.wakeups.value <= 1)
            #expect(frames.value == before)
            let droppedBefore = lastDropped.value
            link.isPaused = false
            run(loop, until: { frames.value >= before + 3 })
            #expect(lastDropped.value == droppedBefore)
        }
    }

    /// invalidate() from inside the handler: no more frames, the handler is released.
    @Test func invalidatingFromTheHandlerIsSafe() {
        let object = Tracked()
        let watch = WeakRef(object)
        onNewThread { [object] loop in
            let source = keepAlive(loop)
            defer { source.invalidate() }
            let frames = Count()
            let holder = Mutex<DisplayLink?>(nil)
            let link = DisplayLink(loop: loop, framesPerSecond: 200) { [object] _ in
                _ = object
                frames.add()
                holder.locked { $0 }?.invalidate()
            }
            holder.locked { $0 = link }
            run(loop, until: { !link.isValid })
            loop.run(mode: .default, for: .milliseconds(50))
            #expect(frames.value == 1)
            holder.locked { $0 = nil }
        }
        _ = consume object
        #expect(watch.isReleased)
    }

    /// FPS over a window and dropped-frame buckets.
    @Test func frameRateMonitorCountsFramesAndBuckets() {
        onNewThread { loop in
            let link = DisplayLink(loop: loop, framesPerSecond: 100) { _ in }
            defer { link.invalidate() }
            let monitor = FrameRateMonitor(link: link, window: .milliseconds(200), label: "test")
            run(loop, until: { monitor.lastReport != nil })
            loop.perform { spin(for: .milliseconds(100)) }
            run(loop, until: { monitor.totals.droppedFrames >= 8 })
            let report = monitor.lastReport
            // 100 frames per second, minus what a loaded machine drops.
            #expect((report?.framesPerSecond ?? 0) > 50 && (report?.framesPerSecond ?? 0) <= 101)
            let totals = monitor.totals
            #expect((totals.buckets[.middle] ?? 0) + (totals.buckets[.high] ?? 0) >= 1)
            #expect(FrameRateMonitor.Bucket(dropped: 0) == .best)
            #expect(FrameRateMonitor.Bucket(dropped: 42) == .frozen)
        }
    }
}
