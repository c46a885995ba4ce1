import Foundation
import Glibc
import RunLoopMonitor
import SharedTestSupport
import Testing

/// Rotation by size with a retention count, and two processes writing one directory at once.
@Suite struct StoreRotationTests {
    /// Past `maximumBytes` the file rotates; `retainedFiles` rotated files are kept, the oldest
    /// dropped; the reports read back are those of the kept files, oldest first.
    @Test func rotationKeepsTheRetainedFilesOnly() throws {
        let directory = try storeTestDirectory()
        defer { try? FileManager.default.removeItem(at: directory) }
        let store = try StallReportStore(directory: directory, maximumBytes: 4096, retainedFiles: 3)
        for index in 0..<200 {
            try store.record(.began(storeTestReport(id: "r\(index)", processID: neverRunningProcessID)))
        }
        let exists = { (url: URL) in FileManager.default.fileExists(atPath: url.path) }
        #expect(exists(store.fileURL))
        #expect((1...3).allSatisfy { exists(store.rotatedFileURL($0)) })
        #expect(!exists(store.rotatedFileURL(4)))
        let ids = try store.reports().map(\.id)
        // The newest ones, in order, ending with the last written; the oldest were dropped.
        #expect(ids.last == "r199")
        #expect(ids.count < 200)
        #expect(ids == (200 - ids.count..<200).map { "r\($0)" })
        // Every kept file is at most one line over the limit.
        for url in [store.fileURL] + (1...3).map(store.rotatedFileURL) {
            let size = (try FileManager.default.attributesOfItem(atPath: url.path)[.size] as? Int) ?? 0
            #expect(size <= 4096 + 1024, "\(url.lastPathComponent): \(size) bytes")
        }
    }

    /// No retention: a rotation starts the file over.
    @Test func retainingNoFileStartsOver() throws {
        let directory = try storeTestDirectory()
        defer { try? FileManager.default.removeItem(at: directory) }
        let store = try StallReportStore(directory: directory, maximumBytes: 4096, retainedFiles: 0)
        for index in 0..<100 {
            try store.record(.began(storeTestReport(id: "r\(index)", processID: neverRunningProcessID)))
        }
        #expect(!FileManager.default.fileExists(atPath: store.previousFileURL.path))
        #expect(try store.reports().map(\.id).last == "r99")
    }

    /// Two processes write 300 lines each into one directory at once, rotating about every 8
    /// lines (each waits for the other's lock): every line of both is there, once, whole.
    @Test func twoProcessesWritingOneDirectoryLoseNothing() throws {
        let directory = try storeTestDirectory()
        defer { try? FileManager.default.removeItem(at: directory) }
        let results = TestMonitor<[Int32]>([])
        let writers = ["a", "b"].map { tag in
            Thread {
                let status = (try? runMonitorProbe(["store-write", directory.path, "300", tag], timeout: .seconds(120)))?.status ?? -1
                results.update { $0.append(status) }
            }
        }
        writers.forEach { $0.start() }
        #expect(results.wait(timeout: .seconds(180)) { $0.count == 2 })
        #expect(results.read { $0 } == [0, 0])
        let store = try StallReportStore(directory: directory, maximumBytes: 4096, retainedFiles: 100)
        let ids = try store.reports().map(\.id)
        let expected = Set((0..<300).flatMap { ["a-\($0)", "b-\($0)"] })
        #expect(ids.count == 600)
        #expect(Set(ids) == expected)
        // Each writer's lines are in its own order.
        for tag in ["a", "b"] {
            let mine = ids.filter { $0.hasPrefix("\(tag)-") }
            #expect(mine == (0..<300).map { "\(tag)-\($0)" })
        }
        // And no line anywhere is cut or glued.
        let files = try FileManager.default.contentsOfDirectory(atPath: directory.path).filter { $0.hasSuffix(".jsonl") }
        var lines = 0
        for file in files {
            let data = try Data(contentsOf: directory.appendingPathComponent(file))
            for line in data.split(separator: 0x0A) {
                lines += 1
                #expect((try? JSONSerialization.jsonObject(with: Data(line))) != nil, "a broken line in \(file)")
            }
        }
        #expect(lines == 600)
    }
}
