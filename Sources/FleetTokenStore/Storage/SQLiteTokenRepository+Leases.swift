// Storage layer: SQLiteTokenRepository as a RefreshLeaseStore: the `refresh_leases` table, each
// request one `BEGIN IMMEDIATE` transaction that also reads the key's entry. Which holder is
// dead is decided by the engine (RefreshLeaseHolder, in Sync/), never here.
public import Foundation
import GRDB

extension SQLiteTokenRepository: RefreshLeaseStore {
    /// Takes the refresh lease of `key` for `holder` unless another holder has an unexpired
    /// one; see ``RefreshLeaseStore/acquireRefreshLease(for:holder:now:duration:)``.
    /// - Throws: ``TokenStoreError``; on failure no lease was taken.
    public func acquireRefreshLease(for key: TokenKey, holder: String, now: Date,
                                    duration: TimeInterval) async throws(TokenStoreError) -> RefreshLease {
        try await runner.write { db in
            try Self.claim(key, holder: holder, replacing: nil, now: now, duration: duration, db)
        }
    }

    /// Takes the refresh lease of `key` for `holder` from `deadHolder` if that holder still has
    /// it; see ``RefreshLeaseStore/takeOverRefreshLease(for:from:holder:now:duration:)``.
    /// - Throws: ``TokenStoreError``; on failure no lease was taken.
    public func takeOverRefreshLease(for key: TokenKey, from deadHolder: String, holder: String, now: Date,
                                     duration: TimeInterval) async throws(TokenStoreError) -> RefreshLease {
        try await runner.write { db in
            try Self.claim(key, holder: holder, replacing: deadHolder, now: now, duration: duration, db)
        }
    }

    /// Gives up `holder`'s leases on `keys`.
    /// - Throws: ``TokenStoreError``; on failure the leases run until they expire.
    public func releaseRefreshLeases(for keys: [TokenKey], holder: String) async throws(TokenStoreError) {
        guard !keys.isEmpty else { return }
        try await runner.write { db in
            let statement = try db.cachedStatement(sql: "DELETE FROM refresh_leases WHERE kind = ? AND subject_id = ? AND holder = ?")
            for key in keys { try statement.execute(arguments: [key.kind.rawValue, key.subjectID, holder]) }
        }
    }

    /// Deletes up to `limit` leases that expired before `cutoff`; see
    /// ``RefreshLeaseStore/deleteExpiredRefreshLeases(before:limit:)``.
    /// - Throws: ``TokenStoreError``; on failure nothing was deleted.
    public func deleteExpiredRefreshLeases(before cutoff: Date, limit: Int) async throws(TokenStoreError) -> Int {
        try await runner.write { db in
            try db.cachedStatement(sql: """
                DELETE FROM refresh_leases WHERE expires_at < ?1 AND (kind, subject_id) IN
                  (SELECT kind, subject_id FROM refresh_leases WHERE expires_at < ?1 LIMIT ?2)
                """).execute(arguments: [cutoff.timeIntervalSince1970, limit])
            return db.changesCount
        }
    }

    /// Inside a write transaction: reads `key`'s entry and lease, and gives the lease to
    /// `holder` unless a holder other than `holder` and `replacing` has it past `now`.
    private static func claim(_ key: TokenKey, holder: String, replacing: String?, now: Date,
                              duration: TimeInterval, _ db: Database) throws -> RefreshLease {
        let arguments: StatementArguments = [key.kind.rawValue, key.subjectID]
        let current = try Row.fetchOne(db.cachedStatement(sql: "SELECT * FROM tokens WHERE kind = ? AND subject_id = ?"),
                                       arguments: arguments).flatMap(TokenRow.entry(from:))
        if let lease = try Row.fetchOne(db.cachedStatement(sql: "SELECT holder, expires_at FROM refresh_leases WHERE kind = ? AND subject_id = ?"),
                                        arguments: arguments) {
            let other: String = lease["holder"]
            let until = Date(timeIntervalSince1970: lease["expires_at"])
            if other != holder && other != replacing && until > now {
                return .heldElsewhere(holder: other, until: until, current: current)
            }
        }
        try db.cachedStatement(sql: """
            INSERT INTO refresh_leases (kind, subject_id, holder, acquired_at, expires_at) VALUES (?, ?, ?, ?, ?)
            ON CONFLICT (kind, subject_id) DO UPDATE SET holder = excluded.holder,
              acquired_at = excluded.acquired_at, expires_at = excluded.expires_at
            """).execute(arguments: [key.kind.rawValue, key.subjectID, holder, now.timeIntervalSince1970,
                                     now.addingTimeInterval(duration).timeIntervalSince1970])
        return .acquired(current: current)
    }
}
