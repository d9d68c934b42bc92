// Storage layer: SQLiteTokenTable, the engine's reads and writes of the `tokens` table (what
// SQLiteTokenRepository's TokenRepository conformance forwards to).
import Foundation
import GRDB

/// The `tokens` table as the engine uses it: entries by key, upserts (alone or as a group
/// commit), failure state and the retention sweep.
struct SQLiteTokenTable: Sendable {
    let runner: SQLiteTransactionRunner
    /// Batches up to this size may be written on the caller's thread.
    static let largestInlineBatch = 64

    // MARK: - Reads

    func entry(for key: TokenKey) async throws(TokenStoreError) -> TokenEntry? {
        try await runner.read { db in
            try Row.fetchOne(db.cachedStatement(sql: "SELECT * FROM tokens WHERE kind = ? AND subject_id = ?"),
                             arguments: [key.kind.rawValue, key.subjectID])
                .flatMap(TokenRow.entry(from:))
        }
    }

    /// One read, 500 keys per statement.
    func entries(for keys: [TokenKey]) async throws(TokenStoreError) -> [TokenKey: TokenEntry] {
        guard !keys.isEmpty else { return [:] }
        return try await runner.read { db in
            var found: [TokenKey: TokenEntry] = [:]
            var start = keys.startIndex
            while start < keys.endIndex {
                let chunk = keys[start..<min(start + 500, keys.endIndex)]
                start = chunk.endIndex
                let placeholders = Array(repeating: "(?, ?)", count: chunk.count).joined(separator: ", ")
                var arguments: [DatabaseValue] = []
                for key in chunk { arguments += [key.kind.rawValue.databaseValue, key.subjectID.databaseValue] }
                let rows = try Row.fetchAll(db, sql: """
                    SELECT * FROM tokens WHERE (kind, subject_id) IN (VALUES \(placeholders))
                    """, arguments: StatementArguments(arguments))
                for row in rows {
                    if let entry = TokenRow.entry(from: row) { found[entry.key] = entry }
                }
            }
            return found
        }
    }

    func retiredKeys(before cutoff: Date, after: TokenKey?, limit: Int) async throws(TokenStoreError) -> [TokenKey] {
        var condition = TokenRow.retiredCondition(before: cutoff)
        if let after { condition.append("(kind, subject_id) > (?, ?)", [after.kind.rawValue, after.subjectID]) }
        let sql = "SELECT kind, subject_id FROM tokens \(condition.whereClause) ORDER BY kind, subject_id LIMIT ?"
        let arguments = condition.arguments + [max(0, limit).databaseValue]
        return try await runner.read { db in
            try Row.fetchAll(db, sql: sql, arguments: StatementArguments(arguments)).compactMap { row in
                TokenKind(rawValue: row["kind"]).map { TokenKey(uncheckedKind: $0, subjectID: row["subject_id"]) }
            }
        }
    }

    /// The earliest death at or after `notBefore` (see ``TokenRepository/earliestDeath(notBefore:)``):
    /// one aggregate over the table, run once per retention check.
    func earliestDeath(notBefore: Date?) async throws(TokenStoreError) -> Date? {
        let died = TokenConditions.diedAt(greatest: "max")
        let sql = "SELECT min(\(died)) FROM tokens" + (notBefore == nil ? "" : " WHERE \(died) >= ?")
        let arguments: StatementArguments = notBefore.map { [$0.timeIntervalSince1970] } ?? []
        return try await runner.read { db in
            try Double.fetchOne(db, sql: sql, arguments: arguments).map(Date.init(timeIntervalSince1970:))
        }
    }

    // MARK: - Writes

    func upsert(_ token: StoredToken, clearFailure: Bool) async throws(TokenStoreError) {
        let statements = runner.statements
        try await runner.write { db in try TokenRow.upsert(token, clearFailure: clearFailure, db, statements: statements) }
    }

    func upsert(_ tokens: [StoredToken], clearFailure: Bool) async throws(TokenStoreError) {
        guard !tokens.isEmpty else { return }
        let statements = runner.statements
        try await runner.write(inline: tokens.count <= Self.largestInlineBatch) { db in
            for token in tokens { try TokenRow.upsert(token, clearFailure: clearFailure, db, statements: statements) }
        }
    }

    func removeToken(for key: TokenKey) async throws(TokenStoreError) {
        try await runner.write { db in try TokenRow.removeToken(for: key, db) }
    }

    func recordFailure(_ failure: RefreshFailureState, for key: TokenKey) async throws(TokenStoreError) {
        try await runner.write { db in try TokenRow.recordFailure(failure, for: key, db) }
    }

    func deleteRetired(_ keys: [TokenKey], before cutoff: Date) async throws(TokenStoreError) -> Int {
        guard !keys.isEmpty else { return 0 }
        let condition = TokenRow.retiredCondition(before: cutoff)
        let sql = "DELETE FROM tokens \(condition.whereClause) AND kind = ? AND subject_id = ?"
        let arguments = condition.arguments
        return try await runner.write(inline: keys.count <= Self.largestInlineBatch) { db in
            let statement = try db.cachedStatement(sql: sql)
            var deleted = 0
            for key in keys {
                try statement.execute(arguments: StatementArguments(arguments + [key.kind.rawValue.databaseValue, key.subjectID.databaseValue]))
                deleted += db.changesCount
            }
            return deleted
        }
    }
}
