// From a review of the PostgreSQL store: an open waiting for another session's migration lock,
// and a migration past the statement timeout, are reported as what they are.

import FleetTokenMigrations
import FleetTokenStoreTesting
import Foundation
import Logging
import Testing
import TestSupportKit
@testable import FleetTokenPostgres
@testable import FleetTokenStore

@Suite("PostgreSQL: the migration lock and a slow migration, named", .paced, .enabled(if: PostgresServer.testsEnabled))
struct PostgresMigrationLockTests {
    let logger = Logger(label: "migration-lock")

    /// The advisory lock an open of the default schema takes, as a statement for psql.
    static let lockName = "hashtext('fleet_token_store.\(PostgresStoreLocation.defaultSchema)')"
    static let takeLock = "SELECT pg_advisory_lock(\(lockName))"
    /// That lock, held in this test's database: the server is shared with other tests, whose
    /// own migration locks (in their databases) must not be seen, or ended.
    static let thisLock = """
        FROM pg_locks WHERE locktype = 'advisory' AND granted AND objsubid = 1
          AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
          AND objid = (\(lockName)::bigint & 4294967295)::oid
        """
    static let lockGranted = "SELECT count(*) \(thisLock)"

    // The open's wait was one statement under the 10 s statement timeout, so a second host
    // waiting for a slow migration was told the database ran past its timeout.
    @Test("a session holding the migration lock: an open waits for it, and one held past the wait is named, with how to find its holder")
    func lockHeld() async throws {
        let (server, database, base) = try await freshDatabase()
        var configuration = base
        configuration.statementTimeout = .seconds(1) // a wait of 3 s for the lock
        try await PostgresTokenRepository.withRepository(configuration, logger: logger) { _ in }

        // Held for 1.5 s, then released: the open waits and succeeds.
        let brief = Task { try? await server.psql("\(Self.takeLock); SELECT pg_sleep(1.5);", database: database) }
        try #require(await eventually(within: 30) { (try? await server.psql(Self.lockGranted, database: database)) == "1" })
        try await PostgresTokenRepository.withRepository(configuration, logger: logger) { _ in }
        _ = await brief.value

        // Held past the wait: refused, naming the lock.
        let stuck = Task { try? await server.psql("\(Self.takeLock); SELECT pg_sleep(120);", database: database) }
        try #require(await eventually(within: 30) { (try? await server.psql(Self.lockGranted, database: database)) == "1" })
        let refused = await #expect(throws: TokenStoreError.self) {
            try await PostgresTokenRepository.withRepository(configuration, logger: logger) { _ in }
        }
        let text = refused?.description ?? ""
        #expect(text.contains("another session has held the migration lock of schema \(PostgresStoreLocation.defaultSchema)"), "\(text)")
        #expect(text.contains("pg_terminate_backend") && !text.contains("statement timeout"), "\(text)")
        _ = try await server.psql("SELECT pg_terminate_backend(pid) \(Self.thisLock)", database: database)
        _ = await stuck.value
        try await PostgresTokenRepository.withRepository(configuration, logger: logger) { _ in }
    }

    // The migration's error named a statement timeout of 0 seconds.
    @Test("a migration past the statement timeout is rolled back and named with the real timeout")
    func slowMigration() async throws {
        let (_, _, base) = try await freshDatabase()
        var slow = base
        slow.statementTimeout = .seconds(1)
        slow.migrations = EmbeddedMigrations.postgres + [EmbeddedMigration(identifier: "V0098__slow", sql: "SELECT pg_sleep(3);")!]
        let error = await #expect(throws: TokenStoreError.self) {
            try await PostgresTokenRepository.withRepository(slow, logger: logger) { _ in }
        }
        #expect(error?.code == .migrationFailed && error?.migrationIdentifier == "V0098__slow")
        let text = error?.description ?? ""
        #expect(text.contains("statement timeout (1.0 seconds)"), "\(text)")
        #expect(text.contains("pg_dump's schema-only dump"), "\(text)")
    }
}
