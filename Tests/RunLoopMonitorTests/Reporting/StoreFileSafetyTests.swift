import Foundation
import Glibc
import RunLoopKit
import RunLoopMonitor
import SharedTestSupport
import Testing

/// The store refuses a directory someone else could have prepared (not the process's user's, or
/// writable by others), opens no file through a symlink, and makes its directory private, again
/// after it was removed.
@Suite(.serialized, .exclusive(.monitor)) struct StoreFileSafetyTests {
@Test func aSymlinkedStoreFileIsRefusedAndItsTargetStaysUntouched() throws {
    let directory = try storeTestDirectory()
    let elsewhere = try storeTestDirectory()
    defer {
        try? FileManager.default.removeItem(at: directory)
        try? FileManager.default.removeItem(at: elsewhere)
    }
    let victim = elsewhere.appendingPathComponent("victim.txt")
    try Data("secret\n".utf8).write(to: victim)
    let store = try StallReportStore(directory: directory)
    try FileManager.default.createSymbolicLink(at: store.fileURL, withDestinationURL: victim)
    let refused = StallReportStore.StoreError.symbolicLink(path: store.fileURL.path)
    #expect(throws: refused) { try store.record(.began(storeTestReport(id: "a", processID: neverRunningProcessID))) }
    #expect(throws: refused) { try store.acknowledge([storeTestReport(id: "a", processID: neverRunningProcessID)]) }
    #expect(try String(contentsOf: victim, encoding: .utf8) == "secret\n")
    #expect(throws: refused) { try store.unfinished() }
    #expect(refused.description.contains("symbolic link"))
}

/// A store directory that is a symlink is refused, even to a private directory of the process's
/// user: whoever can replace the directory's entry in its parent could point it anywhere between
/// a check and a write. Also when the directory is swapped for a symlink after the store was made.
@Test func aSymlinkedStoreDirectoryIsRefused() throws {
    let parent = try storeTestDirectory()
    let target = try storeTestDirectory()
    defer {
        try? FileManager.default.removeItem(at: parent)
        try? FileManager.default.removeItem(at: target)
    }
    try #require(chmod(target.path, 0o700) == 0)
    let link = parent.appendingPathComponent("stalls")
    try FileManager.default.createSymbolicLink(at: link, withDestinationURL: target)
    let refused = StallReportStore.StoreError.symbolicLink(path: link.path)
    #expect(throws: refused) { try StallReportStore(directory: link) }
    #expect(refused.description.contains("symbolic link"))

    // Made on a real directory, which is then replaced by a symlink to another one.
    let directory = parent.appendingPathComponent("real")
    let store = try StallReportStore(directory: directory)
    try store.record(.began(storeTestReport(id: "a", processID: neverRunningProcessID)))
    try FileManager.default.removeItem(at: directory)
    try FileManager.default.createSymbolicLink(at: directory, withDestinationURL: target)
    let swapped = StallReportStore.StoreError.symbolicLink(path: directory.path)
    #expect(throws: swapped) { try store.record(.began(storeTestReport(id: "b", processID: neverRunningProcessID))) }
    #expect(throws: swapped) { try store.unfinished() }
    #expect(throws: swapped) { try store.synchronize() }
    #expect(try FileManager.default.contentsOfDirectory(atPath: target.path).isEmpty)
}

/// A forged previous file (a symlink to a file of reports the attacker wrote) is not read.
@Test func aSymlinkedPreviousFileIsNotRead() throws {
    let directory = try storeTestDirectory()
    let elsewhere = try storeTestDirectory()
    defer {
        try? FileManager.default.removeItem(at: directory)
        try? FileManager.default.removeItem(at: elsewhere)
    }
    let forged = elsewhere.appendingPathComponent("forged.jsonl")
    let decoy = try storeTestDirectory()
    defer { try? FileManager.default.removeItem(at: decoy) }
    let decoyStore = try StallReportStore(directory: decoy)
    try decoyStore.record(.began(storeTestReport(id: "forged", processID: neverRunningProcessID)))
    try FileManager.default.copyItem(at: decoyStore.fileURL, to: forged)
    let store = try StallReportStore(directory: directory)
    try FileManager.default.createSymbolicLink(at: store.previousFileURL, withDestinationURL: forged)
    let refused = StallReportStore.StoreError.symbolicLink(path: store.previousFileURL.path)
    #expect(throws: refused) { try store.unfinished() }
    #expect(throws: refused) { try store.reports() }
}

/// A device (or any file that is not a regular one) in the store's place is refused.
@Test(.enabled(if: geteuid() == 0, "mknod needs root"))
func aStoreFileThatIsNotARegularFileIsRefused() throws {
    let directory = try storeTestDirectory()
    defer { try? FileManager.default.removeItem(at: directory) }
    let store = try StallReportStore(directory: directory)
    // /dev/null: major 1, minor 3 (makedev is a macro Swift does not import).
    try #require(mknod(store.fileURL.path, S_IFCHR | 0o644, dev_t(1 << 8 | 3)) == 0)
    let refused = StallReportStore.StoreError.notARegularFile(path: store.fileURL.path)
    #expect(throws: refused) { try store.record(.began(storeTestReport(id: "a", processID: neverRunningProcessID))) }
    #expect(throws: refused) { try store.unfinished() }
}

@Test func aDirectoryOthersCanWriteIsRefused() throws {
    for mode: mode_t in [0o777, 0o770, 0o1777] {
        let directory = try storeTestDirectory()
        defer { try? FileManager.default.removeItem(at: directory) }
        try #require(chmod(directory.path, mode) == 0)
        #expect(throws: StallReportStore.StoreError.directoryWritableByOthers(path: directory.path, mode: UInt32(mode))) {
            try StallReportStore(directory: directory)
        }
    }
    // Checked at each write too: a directory opened up after the store was made.
    let directory = try storeTestDirectory()
    defer { try? FileManager.default.removeItem(at: directory) }
    let store = try StallReportStore(directory: directory)
    try #require(chmod(directory.path, 0o777) == 0)
    let error = #expect(throws: StallReportStore.StoreError.self) {
        try store.record(.began(storeTestReport(id: "a", processID: neverRunningProcessID)))
    }
    #expect(error?.description.contains("its group or others can write it (mode 777)") == true, "\(String(describing: error))")
    #expect(!FileManager.default.fileExists(atPath: store.fileURL.path))
}

@Test(.enabled(if: geteuid() == 0, "chown to another user needs root"))
func aDirectoryOfAnotherUserIsRefused() throws {
    let directory = try storeTestDirectory()
    defer { try? FileManager.default.removeItem(at: directory) }
    try #require(chmod(directory.path, 0o700) == 0)
    try #require(chown(directory.path, 65534, 65534) == 0)  // nobody
    #expect(throws: StallReportStore.StoreError.directoryNotOwned(path: directory.path, owner: 65534, effectiveUser: 0)) {
        try StallReportStore(directory: directory)
    }
}

@Test func aNewDirectoryIsPrivate() throws {
    let parent = try storeTestDirectory()
    defer { try? FileManager.default.removeItem(at: parent) }
    let directory = parent.appendingPathComponent("app/stalls")
    _ = try StallReportStore(directory: directory)
    #expect(permissionBits(of: directory) == 0o700)
}

@Test func aRemovedDirectoryIsMadeAgainAtTheNextWrite() throws {
    let parent = try storeTestDirectory()
    defer { try? FileManager.default.removeItem(at: parent) }
    let directory = parent.appendingPathComponent("stalls")
    let store = try StallReportStore(directory: directory)
    try FileManager.default.removeItem(at: directory)
    try store.record(.began(storeTestReport(id: "a", processID: neverRunningProcessID)))
    #expect(try store.unfinished().map(\.id) == ["a"])
    #expect(permissionBits(of: directory) == 0o700)
}
}
