// FleetTokenPostgres: PostgresTokenRepository as a TokenRepository: the engine's reads and
// writes of the `tokens` table, each one statement (the change feed's part of the protocol is
// in PostgresTokenRepository.swift).
public import FleetTokenStore
public import Foundation
import PostgresNIO

extension PostgresTokenRepository: TokenRepository {
    // MARK: - Engine reads

    /// The entry for `key`, or nil.
    /// - Throws: `TokenStoreError` when the database cannot be read.
    public func entry(for key: TokenKey) async throws(TokenStoreError) -> TokenEntry? {
        try await runner.rows("SELECT \(PostgresTokenSQL.entryColumns) FROM tokens WHERE kind = $1 AND subject_id = $2",
                              PostgresTokenSQL.keyBindings(key), PostgresTokenSQL.entry(from:)).first
    }

    /// The entries for `keys`, in one statement.
    /// - Throws: `TokenStoreError` when the database cannot be read.
    public func entries(for keys: [TokenKey]) async throws(TokenStoreError) -> [TokenKey: TokenEntry] {
        guard !keys.isEmpty else { return [:] }
        let (kinds, subjects) = PostgresTokenSQL.keyArrays(Set(keys))
        var bindings = PostgresBindings()
        bindings.append(kinds)
        bindings.append(subjects)
        let found = try await runner.rows("""
            SELECT \(PostgresTokenSQL.entryColumns) FROM tokens
            WHERE (kind, subject_id) IN (SELECT * FROM unnest($1::text[], $2::text[]))
            """, bindings, PostgresTokenSQL.entry(from:))
        return Dictionary(found.map { ($0.key, $0) }, uniquingKeysWith: { first, _ in first })
    }

    /// Keys dead since before `cutoff` (see `TokenRepository/retiredKeys(before:after:limit:)`).
    /// - Throws: `TokenStoreError` when the database cannot be read.
    public func retiredKeys(before cutoff: Date, after: TokenKey?, limit: Int) async throws(TokenStoreError) -> [TokenKey] {
        var condition = PostgresTokenSQL.retiredCondition(before: cutoff)
        if let after { condition.append("(kind, subject_id) > (?, ?)", [after.kind.rawValue, after.subjectID]) }
        let limitParameter = condition.bind(Int64(max(0, limit)))
        let sql = "SELECT kind, subject_id FROM tokens \(condition.whereClause) ORDER BY kind, subject_id LIMIT \(limitParameter)"
        return try await runner.keys(sql, condition.bindings)
    }

    /// When the earliest entry that died at `notBefore` or later died (see
    /// `TokenRepository/earliestDeath(notBefore:)`): one aggregate over the table.
    /// - Throws: `TokenStoreError` when the database cannot be read.
    public func earliestDeath(notBefore: Date?) async throws(TokenStoreError) -> Date? {
        let died = TokenConditions.diedAt(greatest: "greatest")
        var bindings = PostgresBindings()
        var sql = "SELECT min(\(died)) FROM tokens"
        if let notBefore {
            bindings.append(notBefore.timeIntervalSince1970)
            sql += " WHERE \(died) >= $1"
        }
        return try await runner.rows(sql, bindings) { row in try row.decode(Double?.self) }.first.map(Date.init(timeIntervalSince1970:))
    }

    // MARK: - Engine writes

    /// Stores `token` in one statement, replacing the key's previous token unless that one
    /// expires later.
    /// - Throws: `TokenStoreError`; on failure nothing was written.
    public func upsert(_ token: StoredToken, clearFailure: Bool) async throws(TokenStoreError) {
        let logger = self.logger
        try await runner.perform { connection in
            if clearFailure {
                _ = try await connection.execute(UpsertClearingFailure(token: token), logger: logger).reduce(()) { _, _ in }
            } else {
                _ = try await connection.execute(UpsertKeepingFailure(token: token), logger: logger).reduce(()) { _, _ in }
            }
        }
    }

    /// Stores `tokens` in one statement (group commit): all or nothing. Of two tokens of one
    /// key, the one expiring later is written.
    /// - Throws: `TokenStoreError`; on failure nothing was written.
    public func upsert(_ tokens: [StoredToken], clearFailure: Bool) async throws(TokenStoreError) {
        guard !tokens.isEmpty else { return }
        if tokens.count == 1 { return try await upsert(tokens[0], clearFailure: clearFailure) }
        // One row per key: a statement may not change a row twice.
        var latest: [TokenKey: StoredToken] = [:]
        for token in tokens where (latest[token.key]?.expiresAt ?? .distantPast) <= token.expiresAt {
            latest[token.key] = token
        }
        var kinds: [String] = [], subjects: [String] = [], values: [String] = []
        var expiries: [Double] = [], issued: [Double] = [], fetched: [Double] = [], used: [Double] = []
        // Rows are locked in the arrays' order: one order on every process (kind, then subject),
        // not the dictionary's (seeded per process), so replicas flushing the same keys at once
        // (after an outage, say) wait for each other instead of deadlocking.
        let ordered = latest.values.sorted { ($0.key.kind.rawValue, $0.key.subjectID) < ($1.key.kind.rawValue, $1.key.subjectID) }
        for token in ordered {
            kinds.append(token.key.kind.rawValue)
            subjects.append(token.key.subjectID)
            values.append(token.value)
            expiries.append(token.expiresAt.timeIntervalSince1970)
            issued.append(token.issuedAt?.timeIntervalSince1970 ?? .nan)
            fetched.append(token.fetchedAt.timeIntervalSince1970)
            used.append(token.lastUsedAt?.timeIntervalSince1970 ?? .nan)
        }
        var bindings = PostgresBindings(capacity: 7)
        bindings.append(kinds)
        bindings.append(subjects)
        bindings.append(values)
        bindings.append(expiries)
        bindings.append(issued)
        bindings.append(fetched)
        bindings.append(used)
        try await runner.execute(PostgresTokenSQL.batchUpsertSQL(clearingFailure: clearFailure), bindings)
    }

    /// Removes the token of `key`, keeping its failure state (the entry goes when it has none).
    /// - Throws: `TokenStoreError`; on failure nothing was changed.
    public func removeToken(for key: TokenKey) async throws(TokenStoreError) {
        // The two statements touch disjoint rows (failure_count zero or not): one statement.
        try await runner.execute("""
            WITH gone AS (DELETE FROM tokens WHERE kind = $1 AND subject_id = $2 AND failure_count = 0 RETURNING 1)
            UPDATE tokens SET token = NULL, expires_at = NULL, issued_at = NULL, fetched_at = NULL
            WHERE kind = $1 AND subject_id = $2 AND failure_count > 0
            """, PostgresTokenSQL.keyBindings(key))
    }

    /// Records a failed refresh of `key`.
    /// - Throws: `TokenStoreError`; on failure nothing was written.
    public func recordFailure(_ failure: RefreshFailureState, for key: TokenKey) async throws(TokenStoreError) {
        var bindings = PostgresTokenSQL.keyBindings(key)
        bindings.append(Int32(clamping: max(1, failure.consecutiveFailures)))
        bindings.append(failure.nextAttemptAt.timeIntervalSince1970)
        bindings.append(failure.lastErrorKind)
        bindings.append(failure.lastErrorMessage)
        bindings.append(failure.lastFailureAt.timeIntervalSince1970)
        bindings.append(failure.configurationDigest)
        try await runner.execute("""
            INSERT INTO tokens (kind, subject_id, failure_count, next_attempt_at, last_error_kind,
                                last_error_message, last_failure_at, failure_config_digest)
            VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
            ON CONFLICT (kind, subject_id) DO UPDATE SET
              failure_count = excluded.failure_count, next_attempt_at = excluded.next_attempt_at,
              last_error_kind = excluded.last_error_kind, last_error_message = excluded.last_error_message,
              last_failure_at = excluded.last_failure_at, failure_config_digest = excluded.failure_config_digest
            """, bindings)
    }

    /// Deletes the entries of `keys` still dead since before `cutoff`, in one statement.
    /// - Throws: `TokenStoreError`; on failure nothing was deleted.
    public func deleteRetired(_ keys: [TokenKey], before cutoff: Date) async throws(TokenStoreError) -> Int {
        guard !keys.isEmpty else { return 0 }
        var condition = PostgresTokenSQL.retiredCondition(before: cutoff)
        let (kinds, subjects) = PostgresTokenSQL.keyArrays(Set(keys))
        let kindsParameter = condition.bind(kinds), subjectsParameter = condition.bind(subjects)
        return try await runner.count("""
            WITH gone AS (DELETE FROM tokens \(condition.whereClause)
                          AND (kind, subject_id) IN (SELECT * FROM unnest(\(kindsParameter)::text[], \(subjectsParameter)::text[]))
                          RETURNING 1)
            SELECT count(*) FROM gone
            """, condition.bindings)
    }
}
