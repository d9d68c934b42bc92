// Issue 27 item 7 on PostgreSQL: V0003 adds the failure's configuration digest. A schema of the
// version before it migrates and keeps its failures (digest unknown: their backoff holds); a
// schema that has it is refused by a build that does not know it.

import FleetTokenStoreTesting
import FleetTokenMigrations
import Foundation
import Logging
import TestSupportKit
import Testing
@testable import FleetTokenPostgres
@testable import FleetTokenStore

@Suite("PostgreSQL V0003: the failure's configuration digest", .paced, .enabled(if: PostgresServer.testsEnabled))
struct PostgresFailureDigestMigrationTests {
    let logger = Logger(label: "migrations")

    @Test("a version 2 schema migrates to 3 and keeps its failures, their digest unknown; a version 3 schema is refused by a build that knows 2")
    func migratesAndOlderBuildRefuses() async throws {
        let (server, database, configuration) = try await freshDatabase()
        var old = configuration
        old.migrations = EmbeddedMigrations.postgres.filter { $0.version <= 2 }
        let key = try TokenKey.vehicle("v-tls")
        let failure = RefreshFailureState(consecutiveFailures: 2, nextAttemptAt: referenceNow + 30, lastErrorKind: "tlsCertificate",
                                          lastErrorMessage: "TLS certificate problem", lastFailureAt: referenceNow)
        try await PostgresTokenRepository.withRepository(old, logger: logger) { store in
            #expect(store.openReport.schemaVersion == 2)
        }
        // Written as a build of schema 2 wrote it (this build's statements name the new column).
        let now = referenceNow.timeIntervalSince1970
        _ = try await server.psql("""
            INSERT INTO fleet_token_store.tokens (kind, subject_id, failure_count, next_attempt_at, last_error_kind,
                                                  last_error_message, last_failure_at)
            VALUES ('vehicle', 'v-tls', 2, \(now + 30), 'tlsCertificate', 'TLS certificate problem', \(now))
            """, database: database)
        let report = try await PostgresTokenRepository.withRepository(configuration, logger: logger) { store in
            #expect(try await store.entry(for: key) == TokenEntry(key: key, token: nil, failure: failure))
            var bound = failure
            bound.configurationDigest = String(repeating: "0f", count: 32)
            try await store.recordFailure(bound, for: key)
            #expect(try await store.entry(for: key)?.failure == bound)
            return store.openReport
        }
        #expect(report == PostgresOpenReport(created: false, schemaVersionBefore: 2, schemaVersion: 3))
        #expect(PostgresTokenRepository.buildSchemaVersion == 3)
        #expect(try await server.psql("SELECT count(*) FROM information_schema.columns WHERE table_schema = 'fleet_token_store' AND column_name = 'failure_config_digest'",
                                      database: database) == "1")
        await #expect {
            try await PostgresTokenRepository.withRepository(old, logger: logger) { _ in }
        } throws: { error in
            guard let error = error as? TokenStoreError else { return false }
            return error.code == .storeNewerThanBuild && error.storeVersion == 3 && error.buildVersion == 2
        }
    }
}
