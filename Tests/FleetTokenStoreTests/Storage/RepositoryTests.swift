import TestSupportKit
import Foundation
import GRDB
import Logging
import Testing
@testable import FleetTokenStore

@Suite("SQLiteTokenRepository: what only the SQLite store does (the rest: RepositoryContractTests)", .paced)
struct RepositoryTests {
    let dir = Scratch()
    var path: String { dir.file("tokens.sqlite") }

    /// The contract's seed: 3 valid vehicles, 2 expired vehicles, 2 valid trips, 1 expired
    /// trip, 1 trip with only failure state.
    func seeded() async throws -> SQLiteTokenRepository {
        let store = try openStore(path)
        try await RepositoryContract.seed(store)
        return store
    }

    @Test("a batch upsert is one commit: one data_version step for a second connection")
    func groupCommit() async throws {
        let store = try openStore(path)
        defer { store.close() }
        let batch = (0..<500).map { token(try! .trip("trip-\($0)"), expiresIn: 900) }
        try await store.upsert(batch)
        #expect(try await store.list(.all, page: .everything).count == 500)
        // One commit: the 50 rows of one transaction, seen as one data_version step
        // by a second connection. (All or nothing, and the rest of a store's behaviour: RepositoryContract.)
        let probe = try DatabaseQueue(path: path)
        let before = try await probe.read { try Int.fetchOne($0, sql: "PRAGMA data_version") }
        try await store.upsert((0..<50).map { token(try! .trip("more-\($0)"), expiresIn: 900) })
        let after = try await probe.read { try Int.fetchOne($0, sql: "PRAGMA data_version") }
        #expect(after != before)
    }

    @Test("stats report the schema version and the file size (counts: RepositoryContract)")
    func statsFileFacts() async throws {
        let store = try await seeded()
        defer { store.close() }
        let stats = try await store.stats(at: referenceNow)
        #expect(stats.total == 9)
        #expect(stats.schemaVersion == SQLiteTokenRepository.buildSchemaVersion)
        #expect(stats.fileSizeBytes > 0)
    }

    @Test("check reports the store's files as the library judges them, a loose mode and a missing store")
    func checkReport() async throws {
        let store = try await seeded()
        defer { store.close() }
        let report = await store.check()
        #expect(report.isHealthy, "\(report.problems)")
        #expect(report.storePath == store.path)
        #expect(report.files?.files.map { ($0.path as NSString).lastPathComponent }.contains("tokens.sqlite") == true)
        #expect(report.files?.files.allSatisfy { $0.mode == 0o600 } == true)
        #expect(report.schemaVersion == SQLiteTokenRepository.buildSchemaVersion)
        #expect(report.integrityProblems == [])

        chmod(path, 0o644)
        let loose = await SQLiteTokenRepository.check(path: path, logger: Logger(label: "test"))
        #expect(loose.problems.count == 1 && loose.problems[0].contains("chmod 600"), "\(loose.problems)")
        #expect(loose.integrityProblems == [] && loose.schemaVersion == SQLiteTokenRepository.buildSchemaVersion)
        chmod(path, 0o600)

        let missing = await SQLiteTokenRepository.check(path: dir.file("absent.sqlite"), logger: Logger(label: "test"))
        #expect(missing.problems == [TokenStoreError.storeMissing(path: dir.file("absent.sqlite")).description])
        #expect(missing.schemaVersion == nil && missing.integrityProblems == nil && missing.files?.files == [])
    }

    @Test("stock sqlite3 reads the store and finds it sound")
    func stockSQLiteReads() async throws {
        let store = try await seeded()
        #expect(try await sqlite3(path, "PRAGMA integrity_check") == "ok")
        #expect(try await sqlite3(path, "SELECT count(*) FROM tokens WHERE token IS NOT NULL") == "8")
        store.close()
        #expect(try await sqlite3(path, "PRAGMA integrity_check") == "ok")
    }

    @Test("a full disk fails the write whole with diskFull")
    func diskFull() async throws {
        let store = try openStore(path)
        defer { store.close() }
        try await store.upsert((0..<10).map { token(try! .vehicle("base-\($0)"), expiresIn: 600) })
        // Cap the file at its current size: the next growth hits SQLITE_FULL.
        try await store.pool.write { db in
            let pages = try Int.fetchOne(db, sql: "PRAGMA page_count") ?? 0
            _ = try Int.fetchOne(db, sql: "PRAGMA max_page_count = \(pages)")
        }
        let big = (0..<200).map { token(try! .trip("big-\($0)"), expiresIn: 600, value: fakeToken("big\($0)", length: 2000)) }
        let error = await #expect(throws: TokenStoreError.self) { try await store.upsert(big) }
        #expect(error == .diskFull(path: path))
        #expect(error?.description.contains("full") == true)
        #expect(try await store.list(TokenFilter(kind: .trip)).isEmpty)
        #expect(try await store.list(.all).count == 10)
    }
}
