// FleetTokenPostgres: creating and migrating the store's schema, the same rules as SQLite's:
// each migration in its own transaction and recorded; a schema written by a newer release is
// refused and left untouched; hosts opening one old schema at once queue on an advisory lock.
import FleetTokenStore
import FleetTokenMigrations
import Foundation
import Logging
import PostgresNIO

/// What opening a PostgreSQL store found and did.
public struct PostgresOpenReport: Sendable, Equatable {
    /// The schema was created by this open.
    public var created: Bool
    /// The schema version before this open (0 when created).
    public var schemaVersionBefore: Int
    /// The schema version after it.
    public var schemaVersion: Int
}

/// Applies the embedded PostgreSQL migrations to one schema.
struct PostgresSchemaMigrator: Sendable {
    let migrations: [EmbeddedMigration]
    let schema: String
    let store: String
    /// The sessions' statement timeout: each migration statement's limit, as errors name it.
    let statementTimeout: Duration

    init(schema: String, store: String, statementTimeout: Duration = .seconds(10),
         migrations: [EmbeddedMigration] = EmbeddedMigrations.postgres) {
        self.migrations = migrations.sorted { $0.version < $1.version }
        self.schema = schema
        self.store = store
        self.statementTimeout = statementTimeout
    }

    /// How long an open waits for another process's migration of the schema: three statement
    /// timeouts, so that a slow migration is waited for and a stuck one is named.
    var lockWait: Duration { statementTimeout * 3 }

    var latestVersion: Int { migrations.last?.version ?? 0 }

    /// The schema as a quoted identifier: the URL's rule admits SQL's reserved words
    /// (`user`, `order`), which work only quoted.
    private var quoted: String { "\"\(schema)\"" }

    /// Where the schema stands: the recorded identifiers (nil when there is no store yet).
    func applied(_ connection: PostgresConnection, logger: Logger) async throws -> Set<String>? {
        let rows = try await connection.query(
            "SELECT to_regclass(\(quoted + ".schema_migrations"))::text", logger: logger)
        var exists = false
        for try await (name) in rows.decode((String?).self) { exists = name != nil }
        guard exists else { return nil }
        let identifiers = try await connection.query(
            PostgresQuery(unsafeSQL: "SELECT identifier FROM \(quoted).schema_migrations"), logger: logger)
        var applied: Set<String> = []
        for try await (identifier) in identifiers.decode(String.self) { applied.insert(identifier) }
        return applied
    }

    /// The schema's version: the highest recorded migration's number.
    static func version(of applied: Set<String>) -> Int {
        applied.compactMap { EmbeddedMigration(identifier: $0, sql: "")?.version }.max() ?? 0
    }

    /// Checks the schema against this build and, as `mode` allows, creates and migrates it.
    func prepare(_ connection: PostgresConnection, mode: StoreOpenMode, logger: Logger) async throws -> PostgresOpenReport {
        guard !mode.readOnly && (mode.createIfMissing || mode.applyMigrations) else {
            let version = try verify(try await applied(connection, logger: logger), mode: mode)
            return PostgresOpenReport(created: false, schemaVersionBefore: version, schemaVersion: version)
        }
        // One migrating process per schema at a time, on every host: the others wait here and
        // then find nothing left to do. A session lock, released below or with the connection.
        let lockKey = "fleet_token_store." + schema
        try await takeLock(lockKey, connection, logger: logger)
        do {
            let report = try await migrate(connection, mode: mode, logger: logger)
            _ = try? await connection.query("SELECT pg_advisory_unlock(hashtext(\(lockKey)))", logger: logger).collect()
            return report
        } catch {
            _ = try? await connection.query("SELECT pg_advisory_unlock(hashtext(\(lockKey)))", logger: logger).collect()
            throw error
        }
    }

    /// Takes the schema's migration lock, polling (a blocking wait would end at the statement
    /// timeout, reported as the database not answering): a holder past ``lockWait`` is named as
    /// what it is, with how to find it.
    private func takeLock(_ lockKey: String, _ connection: PostgresConnection, logger: Logger) async throws {
        let deadline = ContinuousClock.now + lockWait
        while true {
            var taken = false
            let rows = try await connection.query("SELECT pg_try_advisory_lock(hashtext(\(lockKey)))", logger: logger)
            for try await (got) in rows.decode(Bool.self) { taken = got }
            if taken { return }
            guard ContinuousClock.now < deadline else {
                throw TokenStoreError.databaseUnavailable(path: store, reason:
                    "another session has held the migration lock of schema \(schema) for over \(lockWait.components.seconds) s "
                    + "(a migration running, or one whose process stopped mid-way): wait for it, or find it, in this database, with "
                    + "SELECT pid, state, query FROM pg_stat_activity WHERE pid IN (SELECT pid FROM pg_locks WHERE locktype = 'advisory' "
                    + "AND granted AND database = (SELECT oid FROM pg_database WHERE datname = current_database()) "
                    + "AND objid = (hashtext('\(lockKey)')::bigint & 4294967295)::oid) "
                    + "and end it with pg_terminate_backend(pid)")
            }
            try await Task.sleep(for: .milliseconds(250))
        }
    }

    /// A schema that needs nothing of this open: refused when missing, newer or (without
    /// migrating) older.
    private func verify(_ applied: Set<String>?, mode: StoreOpenMode) throws -> Int {
        guard let applied else { throw TokenStoreError.storeMissing(path: store) }
        try refuseNewer(applied)
        let version = Self.version(of: applied)
        if migrations.contains(where: { !applied.contains($0.identifier) }) {
            throw TokenStoreError.storeOlderThanBuild(path: store, storeVersion: version, buildVersion: latestVersion)
        }
        return version
    }

    private func refuseNewer(_ applied: Set<String>) throws {
        let known = Set(migrations.map(\.identifier))
        if !applied.subtracting(known).isEmpty {
            throw TokenStoreError.storeNewerThanBuild(path: store, storeVersion: Self.version(of: applied),
                                                      buildVersion: latestVersion)
        }
    }

    private func migrate(_ connection: PostgresConnection, mode: StoreOpenMode, logger: Logger) async throws -> PostgresOpenReport {
        let before = try await applied(connection, logger: logger)
        if let before {
            try refuseNewer(before) // left untouched: nothing was written yet
            if !mode.applyMigrations {
                let version = try verify(before, mode: mode)
                return PostgresOpenReport(created: false, schemaVersionBefore: version, schemaVersion: version)
            }
        } else {
            guard mode.createIfMissing else { throw TokenStoreError.storeMissing(path: store) }
            for statement in [
                "CREATE SCHEMA IF NOT EXISTS \(quoted)",
                """
                CREATE TABLE IF NOT EXISTS \(quoted).schema_migrations (
                    identifier text PRIMARY KEY,
                    applied_at double precision NOT NULL DEFAULT extract(epoch FROM now())
                )
                """,
            ] {
                _ = try await connection.query(PostgresQuery(unsafeSQL: statement), logger: logger).collect()
            }
        }
        var applied = before ?? []
        for migration in migrations where !applied.contains(migration.identifier) {
            do {
                // The migration's statements and its record commit together or not at all.
                // (postgres-nio speaks the extended protocol only: one statement per query.)
                let statements = ["BEGIN", "SET LOCAL search_path TO \(quoted)"]
                    + SQLStatements.split(migration.sql)
                    + ["INSERT INTO \(quoted).schema_migrations (identifier) VALUES ('\(migration.identifier)')", "COMMIT"]
                for statement in statements {
                    _ = try await connection.query(PostgresQuery(unsafeSQL: statement), logger: logger).collect()
                }
            } catch {
                _ = try? await connection.query("ROLLBACK", logger: logger).collect()
                let reason = PostgresFailure.storeError(error, store: store, statementTimeout: statementTimeout)
                throw TokenStoreError.migrationFailed(path: store, identifier: migration.identifier,
                                                      reason: reason.reason ?? reason.description)
            }
            logger.notice("applied a token store migration", metadata: [
                "store": .string(store), "migration": .string(migration.identifier),
            ])
            applied.insert(migration.identifier)
        }
        return PostgresOpenReport(created: before == nil, schemaVersionBefore: Self.version(of: before ?? []),
                                  schemaVersion: Self.version(of: applied))
    }
}

/// Splits a SQL script into its statements at the semicolons outside quotes, dollar-quoted
/// bodies and comments; comments and empty statements are dropped.
enum SQLStatements {
    static func split(_ script: String) -> [String] {
        var statements: [String] = []
        var current = ""
        let characters = Array(script)
        var index = 0
        func flush() {
            let statement = current.trimmingCharacters(in: .whitespacesAndNewlines)
            if !statement.isEmpty { statements.append(statement) }
            current = ""
        }
        while index < characters.count {
            let character = characters[index]
            let next: Character? = index + 1 < characters.count ? characters[index + 1] : nil
            if character == "-" && next == "-" {
                while index < characters.count && characters[index] != "\n" { index += 1 }
                continue
            }
            if character == "/" && next == "*" {
                index += 2
                while index + 1 < characters.count && !(characters[index] == "*" && characters[index + 1] == "/") { index += 1 }
                index += 2
                continue
            }
            if character == "'" {
                // A string, with '' as an escaped quote.
                current.append(character)
                index += 1
                while index < characters.count {
                    current.append(characters[index])
                    if characters[index] == "'" {
                        if index + 1 < characters.count && characters[index + 1] == "'" {
                            current.append("'")
                            index += 2
                            continue
                        }
                        index += 1
                        break
                    }
                    index += 1
                }
                continue
            }
            if character == "$", let end = dollarTagEnd(characters, from: index) {
                // $tag$ ... $tag$: copied whole.
                let tag = String(characters[index...end])
                current += tag
                index = end + 1
                while index < characters.count {
                    if characters[index] == "$", String(characters[index..<min(characters.count, index + tag.count)]) == tag {
                        current += tag
                        index += tag.count
                        break
                    }
                    current.append(characters[index])
                    index += 1
                }
                continue
            }
            if character == ";" {
                flush()
                index += 1
                continue
            }
            current.append(character)
            index += 1
        }
        flush()
        return statements
    }

    /// The index of the `$` closing a dollar-quote tag that opens at `start` (`$$` or
    /// `$name$`), or nil when none opens there (a `$1` parameter, say).
    private static func dollarTagEnd(_ characters: [Character], from start: Int) -> Int? {
        var index = start + 1
        while index < characters.count {
            let character = characters[index]
            if character == "$" { return index }
            guard character.isLetter || character == "_" || (character.isNumber && index > start + 1) else { return nil }
            index += 1
        }
        return nil
    }
}
