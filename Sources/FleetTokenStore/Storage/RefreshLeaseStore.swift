// Storage layer: the cross-process refresh lease as stored state (acquire, release, take over
// from a named holder). Whether a holder is dead is the sync engine's decision, not the store's.
public import Foundation

/// Where refresh leases live: the single-flight record that lets processes (and, with a shared
/// database, hosts) sharing a store fetch each key once.
///
/// A lease names its holder and runs until a time the holder chose; a holder renews it while
/// its fetch runs and releases it when the result is stored. The store only keeps the record
/// and answers each request atomically. Judging a holder (for example, that the process a
/// lease names has died) is the caller's business: it then asks for a
/// ``takeOverRefreshLease(for:from:holder:now:duration:)``, which succeeds only if that holder
/// still has the lease. Every method is safe to call concurrently.
public protocol RefreshLeaseStore: Sendable {
    /// Takes (or renews) the refresh lease of `key` for `holder` until `now + duration`, unless
    /// another holder has one that runs past `now`; in one transaction that also reads the
    /// key's entry.
    /// - Returns: ``RefreshLease/acquired(current:)`` with the entry, or
    ///   ``RefreshLease/heldElsewhere(holder:until:current:)`` naming the other holder.
    /// - Throws: ``TokenStoreError``; on failure no lease was taken.
    func acquireRefreshLease(for key: TokenKey, holder: String, now: Date,
                             duration: TimeInterval) async throws(TokenStoreError) -> RefreshLease

    /// Takes the refresh lease of `key` for `holder` from `deadHolder`, a holder the caller has
    /// judged gone, whatever time its lease still has: a compare-and-set in one transaction
    /// that also reads the key's entry. It succeeds only while `deadHolder` still holds the
    /// lease (or when the lease is free, as ``acquireRefreshLease(for:holder:now:duration:)``
    /// would); when someone else took the lease since it was judged, that holder is reported.
    /// - Returns: ``RefreshLease/acquired(current:)`` with the entry, or
    ///   ``RefreshLease/heldElsewhere(holder:until:current:)`` naming the holder now in place.
    /// - Throws: ``TokenStoreError``; on failure no lease was taken.
    func takeOverRefreshLease(for key: TokenKey, from deadHolder: String, holder: String, now: Date,
                              duration: TimeInterval) async throws(TokenStoreError) -> RefreshLease

    /// Gives up `holder`'s leases on `keys` (others' leases are left alone).
    /// - Throws: ``TokenStoreError``; on failure the leases run until they expire.
    func releaseRefreshLeases(for keys: [TokenKey], holder: String) async throws(TokenStoreError)

    /// Deletes up to `limit` leases that expired before `cutoff`, and returns how many it
    /// deleted: leases whose holders were killed (or lost power) while fetching, for keys
    /// nobody has asked for since. A claim already treats such a lease as free; the retention
    /// sweep calls this so that the rows do not stay for good, one for each key in flight at
    /// each crash.
    /// - Throws: ``TokenStoreError``; on failure nothing was deleted.
    func deleteExpiredRefreshLeases(before cutoff: Date, limit: Int) async throws(TokenStoreError) -> Int
}

extension RefreshLeaseStore {
    /// Deletes nothing: for a store whose expired leases need no sweeping (they are not kept
    /// in rows, or something else deletes them). A store that keeps them in rows implements it,
    /// and a store that wraps another forwards it (else the wrapped store's rows stay).
    public func deleteExpiredRefreshLeases(before cutoff: Date, limit: Int) async throws(TokenStoreError) -> Int { 0 }
}

/// The outcome of asking for a key's refresh lease.
public enum RefreshLease: Sendable, Equatable {
    /// The caller holds the lease; `current` is the key's entry read in the same transaction.
    case acquired(current: TokenEntry?)
    /// Another holder is refreshing the key until `until`; wait for its result.
    case heldElsewhere(holder: String, until: Date, current: TokenEntry?)
}
