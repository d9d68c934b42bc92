// FleetTokenPostgres: PostgresTokenRepository as a RefreshLeaseStore: the `refresh_leases`
// table, a claim in one statement that two hosts cannot both win. Which holder is dead is
// decided by the engine (RefreshLeaseHolder), never here.
public import FleetTokenStore
public import Foundation
import PostgresNIO

extension PostgresTokenRepository: RefreshLeaseStore {
    /// Takes (or renews) `key`'s lease for `holder` unless another holder has it past `now`.
    /// - Throws: `TokenStoreError`; on failure no lease was taken.
    public func acquireRefreshLease(for key: TokenKey, holder: String, now: Date,
                                    duration: TimeInterval) async throws(TokenStoreError) -> RefreshLease {
        try await claim(key, holder: holder, replacing: nil, now: now, duration: duration)
    }

    /// Takes `key`'s lease from `deadHolder` when it still has it (or the lease is free).
    /// - Throws: `TokenStoreError`; on failure no lease was taken.
    public func takeOverRefreshLease(for key: TokenKey, from deadHolder: String, holder: String, now: Date,
                                     duration: TimeInterval) async throws(TokenStoreError) -> RefreshLease {
        try await claim(key, holder: holder, replacing: deadHolder, now: now, duration: duration)
    }

    /// Gives up `holder`'s leases on `keys`, in one statement.
    /// - Throws: `TokenStoreError`; on failure the leases run until they expire.
    public func releaseRefreshLeases(for keys: [TokenKey], holder: String) async throws(TokenStoreError) {
        guard !keys.isEmpty else { return }
        let (kinds, subjects) = PostgresTokenSQL.keyArrays(Set(keys))
        var bindings = PostgresBindings()
        bindings.append(holder)
        bindings.append(kinds)
        bindings.append(subjects)
        try await runner.execute("""
            DELETE FROM refresh_leases WHERE holder = $1
              AND (kind, subject_id) IN (SELECT * FROM unnest($2::text[], $3::text[]))
            """, bindings)
    }

    /// Deletes up to `limit` leases that expired before `cutoff`, in one statement. The outer
    /// condition repeats the expiry: a claim committed while the delete waited for its row is
    /// re-checked against it (read committed) and kept, where the key alone would delete it.
    /// - Throws: `TokenStoreError`; on failure nothing was deleted.
    public func deleteExpiredRefreshLeases(before cutoff: Date, limit: Int) async throws(TokenStoreError) -> Int {
        var bindings = PostgresBindings()
        bindings.append(cutoff.timeIntervalSince1970)
        bindings.append(limit)
        return try await runner.count("""
            WITH gone AS (DELETE FROM refresh_leases WHERE expires_at < $1 AND (kind, subject_id) IN
                            (SELECT kind, subject_id FROM refresh_leases WHERE expires_at < $1 LIMIT $2)
                          RETURNING 1)
            SELECT count(*) FROM gone
            """, bindings)
    }

    /// The claim in one statement: the insert or update happens only when the lease is free,
    /// expired, already `holder`'s or `replacing`'s, so two hosts asking at once cannot both
    /// win (the second's conflict check waits for the first's row). When it did not happen,
    /// a second statement reads who has the lease.
    private func claim(_ key: TokenKey, holder: String, replacing: String?, now: Date,
                       duration: TimeInterval) async throws(TokenStoreError) -> RefreshLease {
        var bindings = PostgresTokenSQL.keyBindings(key)
        bindings.append(holder)
        bindings.append(now.timeIntervalSince1970)
        bindings.append(now.addingTimeInterval(duration).timeIntervalSince1970)
        bindings.append(replacing ?? holder)
        let claimBindings = bindings, keyBindings = PostgresTokenSQL.keyBindings(key), logger = self.logger
        let answer: (claimed: Bool, holder: String?, until: Double?, entry: TokenEntry?) = try await runner.perform { connection in
            let claimed = try await connection.query(PostgresQuery(unsafeSQL: """
                INSERT INTO refresh_leases AS lease (kind, subject_id, holder, acquired_at, expires_at)
                VALUES ($1, $2, $3, $4, $5)
                ON CONFLICT (kind, subject_id) DO UPDATE SET holder = excluded.holder,
                  acquired_at = excluded.acquired_at, expires_at = excluded.expires_at
                WHERE lease.holder = $3 OR lease.holder = $6 OR lease.expires_at <= $4
                RETURNING holder
                """, binds: claimBindings), logger: logger).collect()
            var other: (String, Double)?
            if claimed.isEmpty {
                for try await lease in try await connection.query(PostgresQuery(unsafeSQL: """
                    SELECT holder, expires_at FROM refresh_leases WHERE kind = $1 AND subject_id = $2
                    """, binds: keyBindings), logger: logger).decode((String, Double).self) {
                    other = lease
                }
            }
            var entry: TokenEntry?
            for try await row in try await connection.query(PostgresQuery(unsafeSQL: """
                SELECT \(PostgresTokenSQL.entryColumns) FROM tokens WHERE kind = $1 AND subject_id = $2
                """, binds: keyBindings), logger: logger) {
                entry = try PostgresTokenSQL.entry(from: row)
            }
            return (!claimed.isEmpty, other?.0, other?.1, entry)
        }
        if answer.claimed { return .acquired(current: answer.entry) }
        guard let other = answer.holder, let until = answer.until else {
            // Released between the two statements: the lease is free, claim it again.
            return try await claim(key, holder: holder, replacing: replacing, now: now, duration: duration)
        }
        return .heldElsewhere(holder: other, until: Date(timeIntervalSince1970: until), current: answer.entry)
    }
}
