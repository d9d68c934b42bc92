// Storage layer: SQLiteTokenRepository as a TokenRepository: the engine's reads and writes of
// the `tokens` table (entries by key, upserts alone or as a group commit, failure state and the
// retention sweep). The change feed's part of the protocol is in SQLiteTokenRepository.swift.
import GRDB
public import Foundation

extension SQLiteTokenRepository: TokenRepository {
    /// Batches up to this size may be written on the caller's thread.
    static let largestInlineBatch = 64

    // MARK: - Engine reads

    /// The entry for `key`, or nil.
    /// - Throws: ``TokenStoreError`` when the store cannot be read.
    public func entry(for key: TokenKey) async throws(TokenStoreError) -> TokenEntry? {
        try await runner.read { db in
            try Row.fetchOne(db.cachedStatement(sql: "SELECT * FROM tokens WHERE kind = ? AND subject_id = ?"),
                             arguments: [key.kind.rawValue, key.subjectID])
                .flatMap(TokenRow.entry(from:))
        }
    }

    /// The entries for `keys`, in one read (batches of 500 keys per statement).
    /// - Throws: ``TokenStoreError`` when the store cannot be read.
    public func entries(for keys: [TokenKey]) async throws(TokenStoreError) -> [TokenKey: TokenEntry] {
        guard !keys.isEmpty else { return [:] }
        return try await runner.read { db in
            // Sized once: grown row by row, 100,000 entries were rehashed 17 times at start-up.
            var found: [TokenKey: TokenEntry] = Dictionary(minimumCapacity: keys.count)
            var start = keys.startIndex
            while start < keys.endIndex {
                let chunk = keys[start..<min(start + 500, keys.endIndex)]
                start = chunk.endIndex
                var arguments: [DatabaseValue] = []
                for key in chunk { arguments += [key.kind.rawValue.databaseValue, key.subjectID.databaseValue] }
                // Read through a cursor (no copy of each row), the columns found once.
                let statement = try db.makeStatement(sql: TokenRow.entriesSQL(keys: chunk.count))
                let columns = TokenRow.Columns(statement.columnNames)
                let rows = try Row.fetchCursor(statement, arguments: StatementArguments(arguments))
                while let row = try rows.next() {
                    if let entry = TokenRow.entry(from: row, columns: columns) { found[entry.key] = entry }
                }
            }
            return found
        }
    }

    /// Keys dead since before `cutoff` (see ``TokenRepository/retiredKeys(before:after:limit:)``).
    /// - Throws: ``TokenStoreError`` when the store cannot be read.
    public func retiredKeys(before cutoff: Date, after: TokenKey?, limit: Int) async throws(TokenStoreError) -> [TokenKey] {
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

    /// When the earliest entry that died at `notBefore` or later died (see
    /// ``TokenRepository/earliestDeath(notBefore:)``): one aggregate over the table, run once
    /// per retention check.
    /// - Throws: ``TokenStoreError`` when the store cannot be read.
    public func earliestDeath(notBefore: Date?) async throws(TokenStoreError) -> Date? {
        let died = TokenConditions.diedAt(greatest: "max")
        let sql = "SELECT min(\(died)) FROM tokens" + (notBefore == nil ? "" : " WHERE \(died) >= ?")
        let arguments: StatementArguments = notBefore.map { [$0.timeIntervalSince1970] } ?? []
        return try await runner.read { db in
            try Double.fetchOne(db, sql: sql, arguments: arguments).map(Date.init(timeIntervalSince1970:))
        }
    }

    // MARK: - Engine writes

    /// Stores `token` in one transaction, replacing the key's previous token unless that one
    /// expires later.
    /// - Throws: ``TokenStoreError``; on failure nothing was written.
    public func upsert(_ token: StoredToken, clearFailure: Bool = true) async throws(TokenStoreError) {
        let statements = runner.statements
        try await runner.write { db in try TokenRow.upsert(token, clearFailure: clearFailure, db, statements: statements) }
    }

    /// Stores `tokens` in one transaction (group commit): all or nothing.
    /// - Throws: ``TokenStoreError``; on failure nothing was written.
    public func upsert(_ tokens: [StoredToken], clearFailure: Bool = true) async throws(TokenStoreError) {
        guard !tokens.isEmpty else { return }
        let statements = runner.statements
        try await runner.write(inline: tokens.count <= Self.largestInlineBatch) { db in
            for token in tokens { try TokenRow.upsert(token, clearFailure: clearFailure, db, statements: statements) }
        }
    }

    /// Removes the token of `key`, keeping its failure state.
    /// - Throws: ``TokenStoreError``; on failure nothing was changed.
    public func removeToken(for key: TokenKey) async throws(TokenStoreError) {
        try await runner.write { db in try TokenRow.removeToken(for: key, db) }
    }

    /// Records a failed refresh of `key`.
    /// - Throws: ``TokenStoreError``; on failure nothing was written.
    public func recordFailure(_ failure: RefreshFailureState, for key: TokenKey) async throws(TokenStoreError) {
        try await runner.write { db in try TokenRow.recordFailure(failure, for: key, db) }
    }

    /// Deletes the entries of `keys` still dead since before `cutoff`, in one transaction.
    /// - Throws: ``TokenStoreError``; on failure nothing was deleted.
    public func deleteRetired(_ keys: [TokenKey], before cutoff: Date) async throws(TokenStoreError) -> Int {
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
