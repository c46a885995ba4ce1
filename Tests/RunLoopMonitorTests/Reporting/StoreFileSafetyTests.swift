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
