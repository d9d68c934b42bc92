// Storage layer: SQLiteTokenRepository as a TokenSealingStore: which keys sealed the stored
// values (the `value_key_id` column of V0003), the value-only rewrites of sealing and rekey, and
// the clean-up of their old copies, owed in the file's header until it has run (DiscardOwedRecord).
import Foundation
import GRDB
import Logging

extension SQLiteTokenRepository: TokenSealingStore {
    /// The store file's path.
    public var storeName: String { path }

    /// The key ids of the stored values: one index probe per id (`tokens_by_value_key`).
    /// - Throws: ``TokenStoreError`` when the store cannot be read.
    public func valueKeyIDs() async throws(TokenStoreError) -> Set<String> {
        try await runner.read { db in
            var ids: Set<String> = []
            var last = ""
            let statement = try db.cachedStatement(sql: """
                SELECT min(value_key_id) FROM tokens WHERE token IS NOT NULL AND value_key_id > ?
                """)
            while let next = try String.fetchOne(statement, arguments: [last]) {
                ids.insert(next)
                last = next
            }
            return ids
        }
    }

    /// How many tokens are under each key id.
    /// - Throws: ``TokenStoreError`` when the store cannot be read.
    public func valueKeyCounts() async throws(TokenStoreError) -> [String: Int] {
        try await runner.read { db in
            var counts: [String: Int] = [:]
            for row in try Row.fetchAll(db, sql: """
                SELECT value_key_id AS id, count(*) AS n FROM tokens WHERE token IS NOT NULL GROUP BY 1
                """) {
                counts[row["id"]] = row["n"]
            }
            return counts
        }
    }

    /// Keys whose value is (or is not) under `valueKeyID`, in key order after `after`.
    /// - Throws: ``TokenStoreError`` when the store cannot be read.
    public func tokenKeys(valueKeyID: String, matching: Bool, after: TokenKey?, limit: Int) async throws(TokenStoreError) -> [TokenKey] {
        var sql = "SELECT kind, subject_id FROM tokens WHERE token IS NOT NULL AND value_key_id \(matching ? "=" : "<>") ?"
        var arguments: [any DatabaseValueConvertible] = [valueKeyID]
        if let after {
            sql += " AND (kind, subject_id) > (?, ?)"
            arguments += [after.kind.rawValue, after.subjectID]
        }
        sql += " ORDER BY kind, subject_id LIMIT ?"
        arguments.append(max(0, limit))
        let bound = StatementArguments(arguments.map(\.databaseValue))
        let query = sql
        return try await runner.read { db in
            try Row.fetchAll(db, sql: query, arguments: bound).compactMap { row in
                TokenKind(rawValue: row["kind"]).map { TokenKey(uncheckedKind: $0, subjectID: row["subject_id"]) }
            }
        }
    }

    /// Replaces values still as read, in one transaction, which also records that the old
    /// values' copies (free space, write-ahead log) await ``discardReplacedValues()``.
    /// - Throws: ``TokenStoreError``; on failure nothing was changed, the record included.
    public func replaceValues(_ replacements: [TokenValueReplacement]) async throws(TokenStoreError) -> Set<TokenKey> {
        guard !replacements.isEmpty else { return [] }
        return try await runner.write(inline: false) { db in
            let statement = try db.cachedStatement(sql: "UPDATE tokens SET token = ? WHERE kind = ? AND subject_id = ? AND token = ?")
            var replaced: Set<TokenKey> = []
            for replacement in replacements {
                try statement.execute(arguments: [replacement.new, replacement.key.kind.rawValue, replacement.key.subjectID, replacement.old])
                if db.changesCount > 0 { replaced.insert(replacement.key) }
            }
            // Committed with the values or not at all: no crash can leave them replaced and
            // their clean-up forgotten.
            if !replaced.isEmpty { try DiscardOwedRecord.noteReplacement(db) }
            return replaced
        }
    }

    /// Whether a clean-up of replaced values is owed: one read of the file header's
    /// `user_version` (see ``replaceValues(_:)``), whatever the store's size.
    /// - Throws: ``TokenStoreError`` when the store cannot be read.
    public func replacedValuesAwaitDiscard() async throws(TokenStoreError) -> Bool {
        try await runner.read { db in try DiscardOwedRecord.read(db).isOwed }
    }

    /// Removes `key`'s token while its value is still `value`, in one transaction: cleared in
    /// place, and the row deleted when no failure state is left (as `removeToken(for:)` does).
    /// - Throws: ``TokenStoreError``; on failure nothing was changed.
    public func removeToken(for key: TokenKey, ifValue value: String) async throws(TokenStoreError) -> Bool {
        try await runner.write { db in
            let arguments: StatementArguments = [key.kind.rawValue, key.subjectID, value]
            try db.cachedStatement(sql: """
                UPDATE tokens SET token = NULL, expires_at = NULL, issued_at = NULL, fetched_at = NULL
                WHERE kind = ? AND subject_id = ? AND token = ?
                """).execute(arguments: arguments)
            guard db.changesCount > 0 else { return false }
            try db.cachedStatement(sql: "DELETE FROM tokens WHERE kind = ? AND subject_id = ? AND token IS NULL AND failure_count = 0")
                .execute(arguments: [key.kind.rawValue, key.subjectID])
            return true
        }
    }

    /// Rewrites the store file without the free space that held replaced values (VACUUM),
    /// then empties the write-ahead log, which still holds them, as far as other processes'
    /// open reads allow, and clears the record that this was owed. A log that another
    /// process's read kept from being emptied stays owed: the next call empties it without a
    /// second rewrite. A replacement another process committed meanwhile keeps its record.
    /// - Throws: ``TokenStoreError`` when the store cannot be rewritten (a `VACUUM` needs free
    ///   space on the store's disk of about the store's size); the clean-up stays owed.
    public func discardReplacedValues() async throws(TokenStoreError) {
        let owed = try await runner.read { db in try DiscardOwedRecord.read(db) }
        var left = owed
        if !owed.fileRewritten {
            do {
                try await pool.vacuum()
            } catch {
                throw TokenStoreError(error, path: path, busyTimeout: configuration.busyTimeout)
            }
            if owed.isOwed, try await runner.write({ db in try DiscardOwedRecord.replace(owed, with: owed.rewritten, db) }) {
                left = owed.rewritten
            }
        }
        do {
            try await pool.writeWithoutTransaction { db in _ = try db.checkpoint(.truncate) }
        } catch {
            let outlook = left.isOwed ? "the next start (or rekey) empties it" : "it is overwritten as it is reused"
            logger.warning("could not empty the token store's write-ahead log while other processes read it; \(outlook)",
                           metadata: ["store": .string(path), "error": "\(error)"])
            return
        }
        guard left.isOwed else { return }
        let cleared = left
        if try await runner.write({ db in try DiscardOwedRecord.replace(cleared, with: .nothingOwed, db) }), owed.fileRewritten {
            logger.notice("emptied the token store's write-ahead log, which another process's read had kept from an earlier clean-up",
                          metadata: ["store": .string(path)])
        }
    }
}
