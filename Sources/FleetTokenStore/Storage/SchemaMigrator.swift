// Storage layer: applies the embedded SQL migrations and refuses a schema newer than this build.

import FleetTokenMigrations
import GRDB

/// Applies the embedded SQL migrations with GRDB's migrator, one transaction each, and refuses
/// stores written by newer builds (GRDB's migrator would silently skip what it does not know).
struct SchemaMigrator: Sendable {
    let migrations: [EmbeddedMigration]

    init(migrations: [EmbeddedMigration] = EmbeddedMigrations.all) {
        self.migrations = migrations.sorted { $0.version < $1.version }
    }

    var latestVersion: Int { migrations.last?.version ?? 0 }

    /// Where a store stands against this build.
    struct State: Sendable, Equatable {
        /// Highest version recorded in the store (0 when none).
        var storeVersion: Int
        /// Recorded identifiers this build does not know.
        var unknownIdentifiers: [String]
        /// Known migrations not yet applied.
        var pending: [String]
    }

    func state(_ db: Database) throws -> State {
        let applied = try Self.appliedIdentifiers(db)
        let known = Set(migrations.map(\.identifier))
        // A store is newer when it records migrations this build does not know (GRDB's test).
        let unknown = applied.subtracting(known).sorted()
        let storeVersion = applied.compactMap { EmbeddedMigration(identifier: $0, sql: "")?.version }.max() ?? 0
        let pending = migrations.map(\.identifier).filter { !applied.contains($0) }
        return State(storeVersion: storeVersion, unknownIdentifiers: unknown, pending: pending)
    }

    /// Applies pending migrations, each in its own `BEGIN IMMEDIATE` transaction that first
    /// re-reads what is applied: two processes opening one old store at once queue on SQLite's
    /// write lock and the second finds nothing left to do. (GRDB's migrator reads the applied
    /// list before taking the lock, and traps when another process got further meanwhile.)
    /// A failing migration is rolled back whole and named; earlier ones stay applied.
    /// Records go to GRDB's `grdb_migrations` table, so GRDB's migrator reads them as its own.
    func migrate(_ writer: any DatabaseWriter) throws(MigrationFailure) {
        for migration in migrations {
            do {
                try writer.write { db in
                    try db.execute(sql: "CREATE TABLE IF NOT EXISTS grdb_migrations (identifier TEXT NOT NULL PRIMARY KEY)")
                    let applied = try String.fetchSet(db, sql: "SELECT identifier FROM grdb_migrations")
                    guard !applied.contains(migration.identifier) else { return }
                    try db.execute(sql: migration.sql)
                    try db.execute(sql: "INSERT INTO grdb_migrations (identifier) VALUES (?)", arguments: [migration.identifier])
                }
            } catch {
                throw MigrationFailure(identifier: migration.identifier, underlying: error)
            }
        }
    }

    /// The identifiers recorded in `grdb_migrations`; none when the table does not exist yet.
    ///
    /// Asked of `sqlite_master` first, so both reads see one snapshot. GRDB's
    /// `appliedIdentifiers` tries the table first and, on "no such table", looks it up: when
    /// another process created it in between (several agents opening a new store at once), the
    /// lookup finds it and the first error was thrown.
    static func appliedIdentifiers(_ db: Database) throws -> Set<String> {
        let exists = try Bool.fetchOne(db, sql: "SELECT count(*) > 0 FROM sqlite_master WHERE type = 'table' AND name = 'grdb_migrations'") ?? false
        guard exists else { return [] }
        return try String.fetchSet(db, sql: "SELECT identifier FROM grdb_migrations")
    }
}

/// A migration that failed, with GRDB's error.
struct MigrationFailure: Error {
    let identifier: String
    let underlying: any Error
}
