// The schema's SQL files, compiled into the binary by SwiftPM (`resources: [.embedInCode(...)]`).
// Adding a migration: add `VNNNN__what.sql` here, to `resources` in Package.swift, and to the
// list below. A test fails when a file in this folder is missing from the list.

/// One numbered schema migration, embedded in the binary.
public struct EmbeddedMigration: Sendable, Equatable {
    /// The number in the file name (`V0002__...` → 2); the schema version once applied.
    public let version: Int
    /// The file name without `.sql`, recorded in the store as the applied migration's identifier.
    public let identifier: String
    /// The SQL text, run in one transaction.
    public let sql: String

    /// Creates a migration from its identifier (`V0001__create_tokens`) and SQL text.
    /// Returns nil when the identifier does not start with `V` and a number followed by `__`.
    public init?(identifier: String, sql: String) {
        guard identifier.hasPrefix("V"),
              let separator = identifier.firstRange(of: "__"),
              let version = Int(identifier[identifier.index(after: identifier.startIndex)..<separator.lowerBound]),
              version > 0
        else { return nil }
        self.version = version
        self.identifier = identifier
        self.sql = sql
    }
}

/// The migrations this build knows, in order. The last one's version is this build's schema version.
public enum EmbeddedMigrations {
    /// Every migration of this build, sorted by version.
    public static let all: [EmbeddedMigration] = [
        make("V0001__create_tokens", PackageResources.V0001__create_tokens_sql),
        make("V0002__leases_and_change_log", PackageResources.V0002__leases_and_change_log_sql),
        make("V0003__value_key_id", PackageResources.V0003__value_key_id_sql),
        make("V0004__failure_configuration_digest", PackageResources.V0004__failure_configuration_digest_sql),
    ]

    /// The PostgreSQL schema's migrations (`postgres/` in this folder), sorted by version: the
    /// same rules, numbered on their own.
    public static let postgres: [EmbeddedMigration] = [
        make("V0001__postgres_tokens_leases_notify", PackageResources.V0001__postgres_tokens_leases_notify_sql),
        make("V0002__postgres_value_key_id", PackageResources.V0002__postgres_value_key_id_sql),
        make("V0003__postgres_failure_configuration_digest", PackageResources.V0003__postgres_failure_configuration_digest_sql),
    ]

    /// The schema version a store has once this build has migrated it.
    public static var latestVersion: Int { all.last?.version ?? 0 }

    private static func make(_ identifier: String, _ bytes: [UInt8]) -> EmbeddedMigration {
        // Both inputs are fixed at build time; a bad name is a programming error caught by tests.
        EmbeddedMigration(identifier: identifier, sql: String(decoding: bytes, as: UTF8.self))!
    }
}
