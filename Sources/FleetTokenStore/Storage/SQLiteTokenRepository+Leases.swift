// Storage layer: SQLiteTokenRepository as a RefreshLeaseStore, forwarding to SQLiteLeaseTable
// (the `refresh_leases` table).
public import Foundation

extension SQLiteTokenRepository {
    /// Takes the refresh lease of `key` for `holder` unless another holder has an unexpired
    /// one; see ``RefreshLeaseStore/acquireRefreshLease(for:holder:now:duration:)``.
    /// - Throws: ``TokenStoreError``; on failure no lease was taken.
    public func acquireRefreshLease(for key: TokenKey, holder: String, now: Date,
                                    duration: TimeInterval) async throws(TokenStoreError) -> RefreshLease {
        try await leaseTable.acquire(key, holder: holder, now: now, duration: duration)
    }

    /// Takes the refresh lease of `key` for `holder` from `deadHolder` if that holder still has
    /// it; see ``RefreshLeaseStore/takeOverRefreshLease(for:from:holder:now:duration:)``.
    /// - Throws: ``TokenStoreError``; on failure no lease was taken.
    public func takeOverRefreshLease(for key: TokenKey, from deadHolder: String, holder: String, now: Date,
                                     duration: TimeInterval) async throws(TokenStoreError) -> RefreshLease {
        try await leaseTable.takeOver(key, from: deadHolder, holder: holder, now: now, duration: duration)
    }

    /// Gives up `holder`'s leases on `keys`.
    /// - Throws: ``TokenStoreError``; on failure the leases run until they expire.
    public func releaseRefreshLeases(for keys: [TokenKey], holder: String) async throws(TokenStoreError) {
        try await leaseTable.release(keys, holder: holder)
    }
}
