import TestSupportKit
import Foundation
import GRDB
import Testing
@testable import FleetTokenStore
#if canImport(Glibc)
import Glibc
#endif

/// Issue 12 item 9: in a directory other users can write, another user can plant the store (or a
/// side file, or a symbolic link) so that the tokens written to it are theirs to read. The store
/// refuses any file it cannot make private to the running user.
@Suite("Store files another user controls are refused", .paced)
struct StoreOwnershipTests {
    /// `nobody`: a user other than the one running the tests. Only root can give a file away.
    static let otherUser: uid_t = 65534
    static let canChown = geteuid() == 0

    /// A sound, cleanly closed store holding one entry.
    static func makeStore(in dir: Scratch, name: String = "tokens.sqlite") async throws -> String {
        let path = dir.file(name)
        let store = try openStore(path)
        try await store.upsert(token(try .vehicle("v"), expiresIn: 600))
        store.close()
        return path
    }

    static func owner(_ path: String) -> uid_t {
        var info = stat()
        return lstat(path, &info) == 0 ? info.st_uid : uid_t.max
    }

    @Test("a store owned by another user, mode 0666, is refused in every mode and left as it was",
          .enabled(if: canChown, "only root can give a file to another user"))
    func foreignStore() async throws {
        let dir = Scratch()
        let path = try await Self.makeStore(in: dir)
        #expect(chown(path, Self.otherUser, gid_t(Self.otherUser)) == 0)
        #expect(chmod(path, 0o666) == 0)
        let hash = sha256(ofFile: path)
        for mode in [StoreOpenMode.agent, .adminReadWrite, .migrate, .readOnly] {
            let error = #expect(throws: TokenStoreError.self, "mode \(mode)") { try openStore(path, mode: mode).close() }
            let text = error?.description ?? ""
            #expect(text.contains(path) && text.contains("\(Self.otherUser)") && text.contains("\(geteuid())"), "\(text)")
        }
        #expect(fileMode(path) == 0o666)
        #expect(Self.owner(path) == Self.otherUser)
        #expect(sha256(ofFile: path) == hash)
        #expect(!FileManager.default.fileExists(atPath: path + "-wal"))
    }

    @Test("a -wal or -shm file planted by another user is refused",
          .enabled(if: canChown, "only root can give a file to another user"), arguments: ["-wal", "-shm"])
    func foreignSideFile(suffix: String) async throws {
        let dir = Scratch()
        let path = try await Self.makeStore(in: dir)
        let planted = path + suffix
        #expect(FileManager.default.createFile(atPath: planted, contents: nil))
        #expect(chown(planted, Self.otherUser, gid_t(Self.otherUser)) == 0)
        #expect(chmod(planted, 0o666) == 0)
        let error = #expect(throws: TokenStoreError.self) { try openStore(path).close() }
        #expect(error?.description.contains(planted) == true, "\(String(describing: error))")
        #expect(Self.owner(planted) == Self.otherUser)
    }

    @Test("a store that is a symbolic link is refused by default, and the link's target is untouched")
    func symlinkedStoreRefused() async throws {
        let dir = Scratch()
        let target = try await Self.makeStore(in: dir, name: "real.sqlite")
        let link = dir.file("tokens.sqlite")
        #expect(symlink(target, link) == 0)
        let hash = sha256(ofFile: target)
        for mode in [StoreOpenMode.agent, .readOnly] {
            let error = #expect(throws: TokenStoreError.self, "mode \(mode)") { try openStore(link, mode: mode).close() }
            let text = error?.description ?? ""
            #expect(text.contains(link) && text.contains("symbolic link"), "\(text)")
        }
        #expect(sha256(ofFile: target) == hash)
        #expect(!FileManager.default.fileExists(atPath: target + "-wal"))
    }

    @Test("a -wal file that is a symbolic link is refused")
    func symlinkedSideFileRefused() async throws {
        let dir = Scratch()
        let path = try await Self.makeStore(in: dir)
        let elsewhere = dir.file("elsewhere")
        #expect(FileManager.default.createFile(atPath: elsewhere, contents: nil))
        #expect(symlink(elsewhere, path + "-wal") == 0)
        let error = #expect(throws: TokenStoreError.self) { try openStore(path).close() }
        #expect(error?.description.contains(path + "-wal") == true, "\(String(describing: error))")
        #expect(try Data(contentsOf: URL(fileURLWithPath: elsewhere)).isEmpty)
    }

    @Test("with allowsSymlinkedStore the link's target is the store: its owner and mode are checked, its side files live beside it")
    func symlinkedStoreOptIn() async throws {
        let dir = Scratch()
        let target = try await Self.makeStore(in: dir, name: "real.sqlite")
        #expect(chmod(target, 0o644) == 0)
        let link = dir.file("tokens.sqlite")
        #expect(symlink(target, link) == 0)
        let store = try openStore(link) { $0.allowsSymlinkedStore = true }
        #expect(store.path == target)
        #expect(store.openReport.tightenedFiles == [target])
        #expect(fileMode(target) == 0o600)
        try await store.upsert(token(try .trip("t"), expiresIn: 600))
        #expect(FileManager.default.fileExists(atPath: target + "-wal"))
        #expect(!FileManager.default.fileExists(atPath: link + "-wal"))
        store.close()
        #expect(StoreFiles.isSymbolicLink(link))
        #expect(try await sqlite3(target, "SELECT count(*) FROM tokens") == "2")

        if Self.canChown {
            #expect(chown(target, Self.otherUser, gid_t(Self.otherUser)) == 0)
            let error = #expect(throws: TokenStoreError.self) { try openStore(link) { $0.allowsSymlinkedStore = true } }
            #expect(error == .notOwnedByUser(path: target, file: target, ownerID: Self.otherUser, userID: UInt32(geteuid())))
        }
    }

    @Test("inspectFiles reports what opening would refuse or tighten, and changes nothing")
    func inspectFiles() async throws {
        let dir = Scratch()
        let path = try await Self.makeStore(in: dir)
        let sound = SQLiteTokenRepository.inspectFiles(at: path)
        #expect(sound.problems.isEmpty)
        #expect(sound.storePath == path)
        #expect(sound.files.map(\.path) == [path] && sound.files.first?.mode == 0o600 && sound.files.first?.ownerID == UInt32(geteuid()))

        #expect(chmod(path, 0o640) == 0)
        let loose = SQLiteTokenRepository.inspectFiles(at: path)
        #expect(loose.problems == [.fileModeTooOpen(path: path, file: path, mode: 0o640, reason: nil)])
        #expect(loose.problems.first?.description.contains("chmod 600") == true)
        #expect(fileMode(path) == 0o640)

        let link = dir.file("link.sqlite")
        #expect(symlink(path, link) == 0)
        let linked = SQLiteTokenRepository.inspectFiles(at: link)
        #expect(linked.problems == [.symbolicLink(path: link, file: link, target: path)])
        #expect(linked.files.isEmpty)
        var optIn = StoreConfiguration()
        optIn.allowsSymlinkedStore = true
        let followed = SQLiteTokenRepository.inspectFiles(at: link, configuration: optIn)
        #expect(followed.storePath == path && followed.files.map(\.path) == [path])

        #expect(SQLiteTokenRepository.inspectFiles(at: dir.file("absent.sqlite")) == StoreFileReport(storePath: dir.file("absent.sqlite"), files: [], problems: []))
    }

    @Test("a connection SQLite opened through a link at the last component is refused (a link swapped in after the checks)")
    func connectionThroughLinkRefused() async throws {
        let dir = Scratch()
        let target = try await Self.makeStore(in: dir, name: "real.sqlite")
        let link = dir.file("tokens.sqlite")
        #expect(symlink(target, link) == 0)
        let files = StoreFiles(path: link)
        let queue = try DatabaseQueue(path: link)
        defer { try? queue.close() }
        try queue.inDatabase { db in
            #expect(throws: TokenStoreError.symbolicLink(path: link, file: link, target: target)) {
                try files.verifyConnection(db, expected: files.pathAsSQLiteNamesIt)
            }
            try StoreFiles(path: target).verifyConnection(db, expected: StoreFiles(path: target).pathAsSQLiteNamesIt)
        }
    }
}
