// Issue 27 item 7: V0004 adds the failure's configuration digest. A store of the schema before
// it migrates and keeps its failures (their digest unknown, so their backoff holds); a store
// that has it is refused by a build that does not know it, as any newer store is.

import FleetTokenStoreTesting
import FleetTokenMigrations
import Foundation
import Logging
import TestSupportKit
import Testing
@testable import FleetTokenStore

@Suite("V0004: the failure's configuration digest", .paced)
struct FailureDigestMigrationTests {
    static let beforeDigest = SchemaMigrator(migrations: EmbeddedMigrations.all.filter { $0.version <= 3 })

    func openBeforeDigest(_ path: String) throws -> SQLiteTokenRepository {
        try SQLiteTokenRepository(path: path, mode: .agent, configuration: StoreConfiguration(), logger: Logger(label: "test"),
                                  migrator: Self.beforeDigest)
    }

    @Test("a version 3 store migrates to 4 and keeps its tokens and failures, their digest unknown")
    func migratesAndKeepsFailures() async throws {
        let dir = Scratch()
        let path = dir.file("tokens.sqlite")
        let key = try TokenKey.vehicle("v-tls"), held = try TokenKey.vehicle("held")
        let failure = RefreshFailureState(consecutiveFailures: 2, nextAttemptAt: referenceNow + 30, lastErrorKind: "tlsCertificate",
                                          lastErrorMessage: "TLS certificate problem", lastFailureAt: referenceNow)
        let old = try openBeforeDigest(path)
        #expect(old.openReport.schemaVersion == 3)
        old.close()
        // Written as a build of schema 3 wrote them (this build's statements name the new column).
        let stored = token(held, expiresIn: 600)
        let (now, expires, issued) = (referenceNow.timeIntervalSince1970, stored.expiresAt.timeIntervalSince1970,
                                      stored.fetchedAt.timeIntervalSince1970)
        _ = try await sqlite3(path, """
            INSERT INTO tokens (kind, subject_id, failure_count, next_attempt_at, last_error_kind, last_error_message, last_failure_at)
            VALUES ('vehicle', 'v-tls', 2, \(now + 30), 'tlsCertificate', 'TLS certificate problem', \(now));
            INSERT INTO tokens (kind, subject_id, token, expires_at, issued_at, fetched_at)
            VALUES ('vehicle', 'held', '\(stored.value)', \(expires), \(issued), \(issued));
            """)
        #expect(try await sqlite3(path, "SELECT count(*) FROM pragma_table_info('tokens') WHERE name = 'failure_config_digest'") == "0")

        let store = try openStore(path)
        defer { store.close() }
        #expect(store.openReport.schemaVersionBefore == 3)
        #expect(store.openReport.schemaVersion == 4 && EmbeddedMigrations.latestVersion == 4)
        #expect(try await store.entry(for: key) == TokenEntry(key: key, token: nil, failure: failure))
        #expect(try await store.entry(for: key)?.failure?.configurationDigest == nil)
        #expect(try await store.entry(for: held)?.token == stored)
        var bound = failure
        bound.configurationDigest = String(repeating: "0f", count: 32)
        try await store.recordFailure(bound, for: key)
        #expect(try await store.entry(for: key)?.failure == bound)
    }

    @Test("a version 4 store is refused as newer by a build that knows only 3, untouched")
    func refusedByOlderBuild() async throws {
        let dir = Scratch()
        let path = dir.file("tokens.sqlite")
        let store = try openStore(path)
        try await store.upsert(token(try .trip("t1"), expiresIn: 600))
        store.close()
        _ = try await sqlite3(path, "PRAGMA wal_checkpoint(TRUNCATE)")
        let before = try await sqlite3(path, "SELECT group_concat(identifier) FROM grdb_migrations; SELECT count(*) FROM tokens;")
        let error = #expect(throws: TokenStoreError.self) { try openBeforeDigest(path) }
        #expect(error == .storeNewerThanBuild(path: path, storeVersion: 4, buildVersion: 3))
        #expect(try await sqlite3(path, "SELECT group_concat(identifier) FROM grdb_migrations; SELECT count(*) FROM tokens;") == before)
    }
}
