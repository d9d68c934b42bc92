// FleetTokenPostgres: PostgresTokenRepository as a TokenSealingStore: which keys sealed the
// stored values (the `value_key_id` column of the schema's V0002), and the value-only rewrites
// of sealing and rekey.
public import FleetTokenStore
import PostgresNIO

extension PostgresTokenRepository: TokenSealingStore {
    /// The database URL without its password.
    public var storeName: String { storeDescription }

    /// The key ids of the stored values, in one statement of one index probe per id.
    /// - Throws: `TokenStoreError` when the database cannot be read.
    public func valueKeyIDs() async throws(TokenStoreError) -> Set<String> {
        Set(try await runner.rows("""
            WITH RECURSIVE ids(id) AS (
                SELECT min(value_key_id) FROM tokens WHERE token IS NOT NULL
                UNION ALL
                SELECT (SELECT min(value_key_id) FROM tokens WHERE token IS NOT NULL AND value_key_id > ids.id)
                FROM ids WHERE ids.id IS NOT NULL)
            SELECT id FROM ids WHERE id IS NOT NULL
            """) { try $0.decode(String.self) })
    }

    /// How many tokens are under each key id.
    /// - Throws: `TokenStoreError` when the database cannot be read.
    public func valueKeyCounts() async throws(TokenStoreError) -> [String: Int] {
        let found = try await runner.rows("SELECT value_key_id, count(*) FROM tokens WHERE token IS NOT NULL GROUP BY 1") { row in
            let (id, n) = try row.decode((String, Int64).self)
            return (id, Int(n))
        }
        return Dictionary(found, uniquingKeysWith: +)
    }

    /// Keys whose value is (or is not) under `valueKeyID`, in key order after `after`.
    /// - Throws: `TokenStoreError` when the database cannot be read.
    public func tokenKeys(valueKeyID: String, matching: Bool, after: TokenKey?, limit: Int) async throws(TokenStoreError) -> [TokenKey] {
        var bindings = PostgresBindings()
        bindings.append(valueKeyID)
        var sql = "SELECT kind, subject_id FROM tokens WHERE token IS NOT NULL AND value_key_id \(matching ? "=" : "<>") $1"
        if let after {
            bindings.append(after.kind.rawValue)
            bindings.append(after.subjectID)
            sql += " AND (kind, subject_id) > ($2, $3)"
        }
        bindings.append(Int64(max(0, limit)))
        sql += " ORDER BY kind, subject_id LIMIT $\(after == nil ? 2 : 4)"
        return try await runner.keys(sql, bindings)
    }

    /// Replaces values still as read, in one statement.
    /// - Throws: `TokenStoreError`; on failure nothing was changed.
    public func replaceValues(_ replacements: [TokenValueReplacement]) async throws(TokenStoreError) -> Set<TokenKey> {
        guard !replacements.isEmpty else { return [] }
        let (kinds, subjects) = PostgresTokenSQL.keyArrays(replacements.map(\.key))
        var bindings = PostgresBindings()
        bindings.append(kinds)
        bindings.append(subjects)
        bindings.append(replacements.map(\.old))
        bindings.append(replacements.map(\.new))
        return Set(try await runner.keys("""
            UPDATE tokens AS t SET token = r.new
            FROM unnest($1::text[], $2::text[], $3::text[], $4::text[]) AS r(kind, subject_id, old, new)
            WHERE t.kind = r.kind AND t.subject_id = r.subject_id AND t.token = r.old
            RETURNING t.kind, t.subject_id
            """, bindings))
    }

    /// Removes `key`'s token while its value is still `value`, in one statement: the row goes
    /// without failure state, its token is cleared with it (as `removeToken(for:)` does).
    /// - Throws: `TokenStoreError`; on failure nothing was changed.
    public func removeToken(for key: TokenKey, ifValue value: String) async throws(TokenStoreError) -> Bool {
        var bindings = PostgresTokenSQL.keyBindings(key)
        bindings.append(value)
        // The two statements touch disjoint rows (failure_count zero or not).
        let removed = try await runner.rows("""
            WITH gone AS (
                DELETE FROM tokens WHERE kind = $1 AND subject_id = $2 AND token = $3 AND failure_count = 0 RETURNING 1),
            cleared AS (
                UPDATE tokens SET token = NULL, expires_at = NULL, issued_at = NULL, fetched_at = NULL
                WHERE kind = $1 AND subject_id = $2 AND token = $3 AND failure_count > 0 RETURNING 1)
            SELECT 1 FROM gone UNION ALL SELECT 1 FROM cleared
            """, bindings) { _ in 1 as Int? }
        return !removed.isEmpty
    }

    /// Nothing: PostgreSQL keeps a replaced row version until vacuuming reuses its space, which
    /// only the server's administrator controls (`VACUUM FULL tokens` rewrites the table).
    public func discardReplacedValues() async throws(TokenStoreError) {}

    /// False, always: ``discardReplacedValues()`` has nothing to do here, so no clean-up is
    /// ever owed and none is recorded (no statement runs). Replaced row versions are the
    /// server's vacuuming's to clear.
    /// - Throws: Nothing; typed as the requirement is.
    public func replacedValuesAwaitDiscard() async throws(TokenStoreError) -> Bool { false }
}
