// Storage layer: the `tokens` table's SQL: row mapping, filters and writes.

import Foundation
import GRDB

/// The `tokens` table's SQL: row mapping, filters and writes. Every value is a bound parameter.
enum TokenRow {
    /// The rows of `keys` keys, bound as (kind, subject id) pairs in order: one primary-key
    /// probe per key. Written as a join on the pairs, since SQLite plans `(kind, subject_id) IN
    /// (VALUES ...)` as a scan of the whole table: each 500-key read of a 100,000-row store took
    /// about 150 ms, and an agent re-reading what it holds read the table 200 times over.
    static func entriesSQL(keys: Int) -> String {
        let pairs = Array(repeating: "(?, ?)", count: keys).joined(separator: ", ")
        return """
            SELECT tokens.* FROM (VALUES \(pairs)) AS wanted
            JOIN tokens ON tokens.kind = wanted.column1 AND tokens.subject_id = wanted.column2
            """
    }

    /// A WHERE clause under construction.
    struct Condition {
        private(set) var clauses: [String] = []
        private(set) var arguments: [DatabaseValue] = []

        init(_ shared: TokenConditions = TokenConditions()) {
            clauses = shared.clauses
            arguments = shared.values.map { value in
                switch value {
                case .text(let text): text.databaseValue
                case .real(let number): number.databaseValue
                }
            }
        }

        mutating func append(_ clause: String, _ values: [any DatabaseValueConvertible]) {
            clauses.append(clause)
            arguments.append(contentsOf: values.map(\.databaseValue))
        }

        var whereClause: String { clauses.isEmpty ? "" : "WHERE " + clauses.joined(separator: " AND ") }
    }

    static func condition(for filter: TokenFilter) -> Condition {
        Condition(.matching(filter))
    }

    /// Entries dead since before `cutoff` (``TokenConditions/retired(before:)``).
    static func retiredCondition(before cutoff: Date) -> Condition {
        Condition(.retired(before: cutoff))
    }

    /// The status rule (``TokenConditions/status(greatest:now:softPointFraction:)``) in SQLite's
    /// dialect. Parameters: now, soft-point fraction.
    static let statusSQL = TokenConditions.status(greatest: "max", now: "?1", softPointFraction: "?2")

    /// Where each column of the `tokens` table is in a result row (nil: not selected). GRDB
    /// finds a column by name by lower-casing names on every access; a bulk read finds them
    /// once per statement instead (reading 100,000 rows by name, a fifth of the agent's
    /// start-up read went there).
    struct Columns {
        let kind, subjectID, token, expiresAt, issuedAt, fetchedAt, lastUsedAt: Int?
        let failureCount, nextAttemptAt, lastErrorKind, lastErrorMessage, lastFailureAt, failureConfigDigest: Int?

        init<Names: Collection<String>>(_ names: Names) {
            let names = Array(names)
            // As GRDB matches a name: exactly, else ignoring case.
            func at(_ name: String) -> Int? { names.firstIndex(of: name) ?? names.firstIndex { $0.lowercased() == name } }
            (kind, subjectID, token, expiresAt) = (at("kind"), at("subject_id"), at("token"), at("expires_at"))
            (issuedAt, fetchedAt, lastUsedAt) = (at("issued_at"), at("fetched_at"), at("last_used_at"))
            (failureCount, nextAttemptAt, lastErrorKind) = (at("failure_count"), at("next_attempt_at"), at("last_error_kind"))
            (lastErrorMessage, lastFailureAt, failureConfigDigest) = (at("last_error_message"), at("last_failure_at"), at("failure_config_digest"))
        }
    }

    static func entry(from row: Row) -> TokenEntry? {
        entry(from: row, columns: Columns(row.columnNames))
    }

    /// The entry of `row`, its columns where `columns` says; nil when its kind is unknown.
    static func entry(from row: Row, columns: Columns) -> TokenEntry? {
        func value<Value: DatabaseValueConvertible>(_ index: Int?) -> Value? {
            index.flatMap { row[$0] }
        }
        guard let kindText: String = value(columns.kind), let kind = TokenKind(rawValue: kindText),
              let subjectID: String = value(columns.subjectID) else { return nil }
        let key = TokenKey(uncheckedKind: kind, subjectID: subjectID)
        var token: StoredToken?
        if let tokenValue: String = value(columns.token), let expires: Double = value(columns.expiresAt) {
            token = StoredToken(
                key: key, value: tokenValue,
                expiresAt: Date(timeIntervalSince1970: expires),
                issuedAt: date(value(columns.issuedAt)),
                fetchedAt: date(value(columns.fetchedAt)) ?? Date(timeIntervalSince1970: expires),
                lastUsedAt: date(value(columns.lastUsedAt)))
        }
        var failure: RefreshFailureState?
        let failures: Int = value(columns.failureCount) ?? 0
        if failures > 0 {
            failure = RefreshFailureState(
                consecutiveFailures: failures,
                nextAttemptAt: date(value(columns.nextAttemptAt)) ?? .distantPast,
                lastErrorKind: value(columns.lastErrorKind) ?? "unknown",
                lastErrorMessage: value(columns.lastErrorMessage),
                lastFailureAt: date(value(columns.lastFailureAt)) ?? .distantPast,
                configurationDigest: value(columns.failureConfigDigest))
        }
        return TokenEntry(key: key, token: token, failure: failure)
    }

    private static func date(_ seconds: Double?) -> Date? {
        seconds.map(Date.init(timeIntervalSince1970:))
    }

    /// The upsert, optionally resetting the failure state; an older token never replaces a
    /// newer one (a slow writer loses to another process's fresher refresh).
    private static func upsertSQL(clearingFailure: Bool) -> String {
        let resetFailure = clearingFailure
            ? ", failure_count = 0, next_attempt_at = NULL, last_error_kind = NULL, last_error_message = NULL, last_failure_at = NULL, failure_config_digest = NULL"
            : ""
        return """
            INSERT INTO tokens (kind, subject_id, token, expires_at, issued_at, fetched_at, last_used_at)
            VALUES (?, ?, ?, ?, ?, ?, ?)
            ON CONFLICT (kind, subject_id) DO UPDATE SET
              token = excluded.token, expires_at = excluded.expires_at, issued_at = excluded.issued_at,
              fetched_at = excluded.fetched_at,
              last_used_at = coalesce(excluded.last_used_at, tokens.last_used_at)\(resetFailure)
            WHERE tokens.token IS NULL OR excluded.expires_at >= tokens.expires_at
            """
    }

    static let upsertKeepingFailureSQL = upsertSQL(clearingFailure: false)
    static let upsertClearingFailureSQL = upsertSQL(clearingFailure: true)

    static func upsert(_ token: StoredToken, clearFailure: Bool, _ db: Database, statements: WriterStatements) throws {
        // Every refresh runs this: prepared once and bound through the C API (see WriterStatements).
        try statements.run(clearFailure ? .upsertClearingFailure : .upsertKeepingFailure, db) { statement in
            statement.bind(1, token.key.kind.rawValue)
            statement.bind(2, token.key.subjectID)
            statement.bind(3, token.value)
            statement.bind(4, token.expiresAt.timeIntervalSince1970)
            statement.bind(5, token.issuedAt?.timeIntervalSince1970)
            statement.bind(6, token.fetchedAt.timeIntervalSince1970)
            statement.bind(7, token.lastUsedAt?.timeIntervalSince1970)
        }
    }

    static func recordFailure(_ failure: RefreshFailureState, for key: TokenKey, _ db: Database) throws {
        try db.cachedStatement(sql: """
            INSERT INTO tokens (kind, subject_id, failure_count, next_attempt_at, last_error_kind,
                                last_error_message, last_failure_at, failure_config_digest)
            VALUES (?, ?, ?, ?, ?, ?, ?, ?)
            ON CONFLICT (kind, subject_id) DO UPDATE SET
              failure_count = excluded.failure_count, next_attempt_at = excluded.next_attempt_at,
              last_error_kind = excluded.last_error_kind, last_error_message = excluded.last_error_message,
              last_failure_at = excluded.last_failure_at, failure_config_digest = excluded.failure_config_digest
            """).execute(arguments: [
                key.kind.rawValue, key.subjectID, max(1, failure.consecutiveFailures),
                failure.nextAttemptAt.timeIntervalSince1970, failure.lastErrorKind,
                failure.lastErrorMessage, failure.lastFailureAt.timeIntervalSince1970, failure.configurationDigest,
            ])
    }

    static func removeToken(for key: TokenKey, _ db: Database) throws {
        let arguments: StatementArguments = [key.kind.rawValue, key.subjectID]
        try db.cachedStatement(sql: """
            UPDATE tokens SET token = NULL, expires_at = NULL, issued_at = NULL, fetched_at = NULL
            WHERE kind = ? AND subject_id = ?
            """).execute(arguments: arguments)
        try db.cachedStatement(sql: "DELETE FROM tokens WHERE kind = ? AND subject_id = ? AND token IS NULL AND failure_count = 0")
            .execute(arguments: arguments)
    }

    static func clearFailure(for key: TokenKey, _ db: Database) throws {
        let arguments: StatementArguments = [key.kind.rawValue, key.subjectID]
        try db.cachedStatement(sql: """
            UPDATE tokens SET failure_count = 0, next_attempt_at = NULL, last_error_kind = NULL,
                              last_error_message = NULL, last_failure_at = NULL, failure_config_digest = NULL
            WHERE kind = ? AND subject_id = ?
            """).execute(arguments: arguments)
        try db.cachedStatement(sql: "DELETE FROM tokens WHERE kind = ? AND subject_id = ? AND token IS NULL")
            .execute(arguments: arguments)
    }
}
