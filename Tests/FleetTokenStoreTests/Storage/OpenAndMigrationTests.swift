import FleetTokenStoreTesting
import FleetTokenMigrations
import Foundation
import TestSupportKit
import GRDB
import Logging
import Testing
@testable import FleetTokenStore

@Suite("Opening a store and migrating its schema", .paced)
struct OpenAndMigrationTests {
    @Test("a fresh store gets the whole schema, WAL, synchronous=NORMAL, secure_delete, a 5 s busy timeout and private modes")
    func freshStore() async throws {
        let dir = Scratch()
        let path = dir.file("nested/deeper/tokens.sqlite")
        let store = try openStore(path)
        #expect(store.openReport.created)
        #expect(store.openReport.schemaVersion == EmbeddedMigrations.latestVersion)
        #expect(try await store.schemaVersion() == EmbeddedMigrations.latestVersion)

        try await store.upsert(token(try .vehicle("v1"), expiresIn: 600))
        let pragmas = try await store.pool.write { db in
            (try String.fetchOne(db, sql: "PRAGMA journal_mode"),
             try Int.fetchOne(db, sql: "PRAGMA synchronous"),
             try Int.fetchOne(db, sql: "PRAGMA busy_timeout"))
        }
        #expect(pragmas.0 == "wal")
        #expect(pragmas.1 == 1) // NORMAL
        #expect((pragmas.2 ?? 0) >= 5000)
        // Set explicitly (issue 26): a purged token must not stay in free pages on SQLite
        // builds whose default is off. On the writer and on a reader (readers write nothing,
        // but a checkpoint or a pool change must not depend on which connection runs it).
        #expect(try await store.pool.write { try Int.fetchOne($0, sql: "PRAGMA secure_delete") } == 1)
        #expect(try await store.pool.read { try Int.fetchOne($0, sql: "PRAGMA secure_delete") } == 1)

        #expect(fileMode(path) == 0o600)
        #expect(fileMode(path + "-wal") == 0o600)
        #expect(fileMode(path + "-shm") == 0o600)
        #expect(fileMode(dir.file("nested")) == 0o700)
        #expect(fileMode(dir.file("nested/deeper")) == 0o700)
        store.close()
    }

    @Test("reopening a current store applies nothing: same migrations, schema and rows")
    func reopenIsNoOp() async throws {
        let dir = Scratch()
        let path = dir.file("tokens.sqlite")
        let first = try openStore(path)
        try await first.upsert(token(try .vehicle("v1"), expiresIn: 600))
        first.close()
        // (Bytes are not compared: GRDB writes an empty transaction into a fresh WAL on open.)
        let dump = try await sqlite3(path, "SELECT group_concat(identifier) FROM grdb_migrations; SELECT sql FROM sqlite_master ORDER BY name; SELECT * FROM tokens;")

        let second = try openStore(path)
        #expect(second.openReport.schemaVersionBefore == EmbeddedMigrations.latestVersion)
        #expect(!second.openReport.created)
        #expect(try await second.entry(for: try .vehicle("v1"))?.token != nil)
        second.close()
        #expect(try await sqlite3(path, "SELECT group_concat(identifier) FROM grdb_migrations; SELECT sql FROM sqlite_master ORDER BY name; SELECT * FROM tokens;") == dump)
    }

    @Test("a store made by the first schema is upgraded and keeps its entries")
    func upgradeFromFixture() async throws {
        let dir = Scratch()
        let path = dir.file("tokens.sqlite")
        let fixture = try #require(Bundle.module.path(forResource: "store-v1", ofType: "sqlite", inDirectory: "Fixtures"))
        try FileManager.default.copyItem(atPath: fixture, toPath: path)
        let logger = LogRecorder()

        let store = try openStore(path, logger: logger.logger)
        #expect(store.openReport.schemaVersionBefore == 1)
        #expect(store.openReport.schemaVersion == EmbeddedMigrations.latestVersion)
        #expect(logger.messages(at: .notice).contains { $0.contains("schema upgraded") })

        let vehicle = try #require(try await store.entry(for: try .vehicle("fixture-vehicle-1")))
        #expect(vehicle.token?.expiresAt == Date(timeIntervalSince1970: 4_102_444_800))
        let trip = try #require(try await store.entry(for: try .trip("fixture-trip-1")))
        #expect(trip.token == nil)
        #expect(trip.failure?.consecutiveFailures == 3)
        // V0002's objects exist and work on the upgraded data.
        try await store.upsert(token(try .vehicle("fixture-vehicle-2"), expiresIn: 60))
        let changes = try await store.pool.read { try Int.fetchOne($0, sql: "SELECT count(*) FROM token_changes") }
        #expect(changes == 1)
        store.close()
    }

    @Test("a store written by a newer release is refused as newer, naming both versions, byte for byte untouched")
    func newerStoreRefused() async throws {
        let dir = Scratch()
        let path = dir.file("tokens.sqlite")
        let store = try openStore(path)
        try await store.upsert(token(try .trip("t1"), expiresIn: 600))
        store.close()
        _ = try await sqlite3(path, "INSERT INTO grdb_migrations VALUES ('V0099__from_the_future'); PRAGMA wal_checkpoint(TRUNCATE);")
        let before = sha256(ofFile: path)
        let filesBefore = dir.contents

        for mode in [StoreOpenMode.agent, .migrate, .readOnly, .adminReadWrite] {
            let error = #expect(throws: TokenStoreError.self) { try openStore(path, mode: mode) }
            #expect(error == .storeNewerThanBuild(path: path, storeVersion: 99, buildVersion: EmbeddedMigrations.latestVersion))
            let message = error?.description ?? ""
            #expect(message.contains("newer"))
            #expect(message.contains("99") && message.contains("\(EmbeddedMigrations.latestVersion)"))
        }
        #expect(sha256(ofFile: path) == before)
        // Nothing was written to the WAL for a later checkpoint to fold in either.
        #expect(try await sqlite3(path, "PRAGMA integrity_check") == "ok")
        #expect(sha256(ofFile: path) == before)
        #expect(dir.contents.filter { !$0.hasSuffix("-shm") && !$0.hasSuffix("-wal") } == filesBefore.filter { !$0.hasSuffix("-shm") && !$0.hasSuffix("-wal") })
        #expect(try await sqlite3(path, "SELECT count(*) FROM tokens") == "1")
    }

    @Test("a failing migration rolls back whole and leaves the previous schema usable")
    func failingMigrationRollsBack() async throws {
        let dir = Scratch()
        let path = dir.file("tokens.sqlite")
        let store = try openStore(path)
        try await store.upsert(token(try .vehicle("kept"), expiresIn: 600))
        store.close()

        let broken = try #require(EmbeddedMigration(identifier: "V0005__broken", sql: """
            CREATE TABLE half_done (x INTEGER);
            ALTER TABLE tokens ADD COLUMN extra TEXT;
            INSERT INTO table_that_does_not_exist VALUES (1);
            """))
        let migrator = SchemaMigrator(migrations: EmbeddedMigrations.all + [broken])
        let error = #expect(throws: TokenStoreError.self) {
            try SQLiteTokenRepository(path: path, mode: .agent, configuration: StoreConfiguration(),
                                      logger: Logger(label: "test"), migrator: migrator)
        }
        guard let error, error.code == .migrationFailed, let identifier = error.migrationIdentifier, let reason = error.reason else {
            Issue.record("expected migrationFailed, got \(String(describing: error))")
            return
        }
        #expect(identifier == "V0005__broken")
        #expect(reason.contains("table_that_does_not_exist"))
        #expect(try await sqlite3(path, "SELECT count(*) FROM sqlite_master WHERE name = 'half_done'") == "0")
        #expect(try await sqlite3(path, "SELECT count(*) FROM pragma_table_info('tokens') WHERE name = 'extra'") == "0")
        #expect(try await sqlite3(path, "SELECT group_concat(identifier, ',') FROM grdb_migrations ORDER BY identifier")
                == EmbeddedMigrations.all.map(\.identifier).joined(separator: ","))

        let reopened = try openStore(path)
        #expect(try await reopened.entry(for: try .vehicle("kept"))?.token != nil)
        reopened.close()
    }

    @Test("several openers migrating one old store at once all succeed; each migration runs once")
    func concurrentMigration() async throws {
        let dir = Scratch()
        let path = dir.file("tokens.sqlite")
        let fixture = try #require(Bundle.module.path(forResource: "store-v1", ofType: "sqlite", inDirectory: "Fixtures"))
        try FileManager.default.copyItem(atPath: fixture, toPath: path)
        let versions = try await withThrowingTaskGroup(of: Int.self) { group in
            for _ in 0..<6 {
                group.addTask {
                    let store = try openStore(path)
                    defer { store.close() }
                    return try await store.schemaVersion()
                }
            }
            return try await group.reduce(into: [Int]()) { $0.append($1) }
        }
        #expect(versions == Array(repeating: EmbeddedMigrations.latestVersion, count: 6))
        #expect(try await sqlite3(path, "SELECT count(*) FROM grdb_migrations") == "\(EmbeddedMigrations.latestVersion)")
        #expect(try await sqlite3(path, "SELECT count(*) FROM tokens") == "2")
    }

    @Test("several openers making one new store at once: one makes it, all open it, one token written by each is there; no private file is left")
    func concurrentCreation() async throws {
        let dir = Scratch()
        let path = dir.file("tokens.sqlite")
        let created = try await withThrowingTaskGroup(of: Bool.self) { group in
            for index in 0..<6 {
                group.addTask {
                    let store = try openStore(path)
                    defer { store.close() }
                    try await store.upsert([token(try .vehicle("opener-\(index)"), expiresIn: 3600)], clearFailure: true)
                    return store.openReport.created
                }
            }
            return try await group.reduce(into: [Bool]()) { $0.append($1) }
        }
        #expect(created.filter { $0 }.count == 1, "\(created)")
        #expect(try await sqlite3(path, "SELECT count(*) FROM tokens") == "6")
        #expect(try await sqlite3(path, "SELECT count(*) FROM grdb_migrations") == "\(EmbeddedMigrations.latestVersion)")
        let names = try FileManager.default.contentsOfDirectory(atPath: dir.path)
        #expect(!names.contains { $0.contains(".new-") }, "\(names)")
    }

    @Test("a private file left by a process that died making the store is removed by the next opening; one of a live process is left alone")
    func abandonedStagingRemoved() async throws {
        let dir = Scratch()
        let path = dir.file("tokens.sqlite")
        // A pid that surely belongs to no process: one that has exited and was reaped.
        let exited = Process()
        exited.executableURL = URL(fileURLWithPath: "/bin/true")
        try exited.run()
        exited.waitUntilExit()
        let dead = "\(path).new-\(exited.processIdentifier)-abc"
        let live = "\(path).new-\(getppid())-def"
        for file in [dead, dead + "-wal", live] {
            #expect(FileManager.default.createFile(atPath: file, contents: Data("torn".utf8)))
        }
        let store = try openStore(path)
        store.close()
        #expect(!FileManager.default.fileExists(atPath: dead))
        #expect(!FileManager.default.fileExists(atPath: dead + "-wal"))
        #expect(FileManager.default.fileExists(atPath: live), "another live process's file is not ours to remove")
    }

    @Test("every SQL file in Migrations/ and Migrations/postgres/ is embedded and listed in order")
    func everyMigrationIsEmbedded() throws {
        let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
            .deletingLastPathComponent().deletingLastPathComponent()
        let manifest = try String(contentsOf: root.appendingPathComponent("Package.swift"), encoding: .utf8)
        for (folder, listed) in [("", EmbeddedMigrations.all), ("postgres/", EmbeddedMigrations.postgres)] {
            let files = try FileManager.default.contentsOfDirectory(atPath: root.appendingPathComponent("Migrations/" + folder).path)
                .filter { $0.hasSuffix(".sql") }.sorted()
            #expect(files.map { String($0.dropLast(4)) } == listed.map(\.identifier))
            #expect(listed.map(\.version) == Array(1...listed.count))
            for file in files { #expect(manifest.contains(".embedInCode(\"\(folder)\(file)\")")) }
            for migration in listed {
                let onDisk = try String(contentsOf: root.appendingPathComponent("Migrations/\(folder)\(migration.identifier).sql"), encoding: .utf8)
                #expect(onDisk == migration.sql)
            }
        }
    }
}
