// Storage layer: what the sync engine needs from a store (reads, writes, failure state, the
// retention sweep, the change feed). Leases are `RefreshLeaseStore`; tokenctl's operations are
// `TokenStoreAdmin`.
public import Foundation

/// Persistent storage of tokens and their refresh state, keyed by ``TokenKey``: what
/// ``TokenSyncEngine`` reads and writes.
///
/// ``SQLiteTokenRepository`` is the implementation; the protocol lets the engine and tests
/// depend on behaviour, not on SQLite (the `FleetTokenStoreTesting` product has an in-memory
/// one). The engine also needs a ``RefreshLeaseStore`` for single flight across processes;
/// administration (listing, purging, statistics, checks) is ``TokenStoreAdmin``. Every method
/// is safe to call concurrently.
public protocol TokenRepository: Sendable {
    /// The entry for `key`, or nil when the store holds nothing for it.
    /// - Throws: ``TokenStoreError`` when the store cannot be read.
    func entry(for key: TokenKey) async throws(TokenStoreError) -> TokenEntry?

    /// The entries for `keys` (missing keys are absent from the result), in one read.
    /// - Throws: ``TokenStoreError`` when the store cannot be read.
    func entries(for keys: [TokenKey]) async throws(TokenStoreError) -> [TokenKey: TokenEntry]

    /// Stores `token` in one transaction, replacing the key's previous token unless that one
    /// expires later (a newer token another process wrote wins over a slow writer's older one;
    /// the write then changes nothing, failure state included). Clears the key's failure state
    /// when `clearFailure` is true (a successful refresh).
    /// - Throws: ``TokenStoreError``; on failure nothing was written.
    func upsert(_ token: StoredToken, clearFailure: Bool) async throws(TokenStoreError)

    /// Stores many tokens in one transaction (group commit for refresh bursts), each as
    /// `upsert(_:clearFailure:)` of one token would: all or nothing.
    /// - Throws: ``TokenStoreError``; on failure nothing was written.
    func upsert(_ tokens: [StoredToken], clearFailure: Bool) async throws(TokenStoreError)

    /// Removes the token of `key` (one Fleet Engine rejected) but keeps its failure state, so
    /// the backoff still holds; the entry goes when it has no failure state either.
    /// - Throws: ``TokenStoreError``; on failure nothing was changed.
    func removeToken(for key: TokenKey) async throws(TokenStoreError)

    /// Records a failed refresh of `key` (an entry is created if the key has no token yet),
    /// replacing its previous failure state. At least one failure is counted.
    /// - Throws: ``TokenStoreError``; on failure nothing was written.
    func recordFailure(_ failure: RefreshFailureState, for key: TokenKey) async throws(TokenStoreError)

    /// Keys whose entries have been dead since before `cutoff` (a token that expired before
    /// it, or none, and no failure or planned retry after it), in (kind, subject id) order
    /// after `after`, at most `limit`. The retention sweep's candidates.
    /// - Throws: ``TokenStoreError`` when the store cannot be read.
    func retiredKeys(before cutoff: Date, after: TokenKey?, limit: Int) async throws(TokenStoreError) -> [TokenKey]

    /// Deletes the entries of `keys` that are still dead since before `cutoff` (one refreshed
    /// since it was listed stays), in one transaction; returns how many went.
    /// - Throws: ``TokenStoreError``; on failure nothing was deleted.
    func deleteRetired(_ keys: [TokenKey], before cutoff: Date) async throws(TokenStoreError) -> Int

    /// The earliest time an entry died or dies (its token's expiry, or its last failure or
    /// planned retry when later: what ``retiredKeys(before:after:limit:)`` compares with its
    /// cutoff) among the entries that died at `notBefore` or later (every entry when nil); nil
    /// when there is none. With the retention period added: when the sweep can next delete one.
    /// - Throws: ``TokenStoreError`` when the store cannot be read.
    func earliestDeath(notBefore: Date?) async throws(TokenStoreError) -> Date?

    /// Changes to tokens made by other processes (or other views) sharing the store,
    /// delivered within about a second of their commit while ``runBackgroundWork()`` runs;
    /// not the changes made through this repository itself. Every change committed after this
    /// returns is reported, itemized or within a ``TokenStoreChange/unknown`` (the feed began
    /// watching later, lost its connection, or the reader fell far behind in a burst). The
    /// stream ends when the repository closes.
    func changes() -> AsyncStream<TokenStoreChange>

    /// The repository's long-running work (say, polling for other processes' changes), until
    /// the calling task is cancelled or the repository closes; returns at once when there is
    /// none. ``TokenSyncEngine`` runs it as a child task of its `run()`. No default: a wrapper
    /// around another repository must forward it, or its change feed would fall silent.
    func runBackgroundWork() async

    /// Only the work that makes ``changes()`` report, until the calling task is cancelled or
    /// the repository closes; returns at once when the feed needs none. For a caller that needs
    /// the feed for a short while without the rest of ``runBackgroundWork()``: an engine used
    /// without `run()` that waits for another process's refresh. No default, for the reason
    /// ``runBackgroundWork()`` has none.
    func followChanges() async
}

extension TokenRepository {
    /// No candidates: a repository without this has no retention sweep.
    public func retiredKeys(before cutoff: Date, after: TokenKey?, limit: Int) async throws(TokenStoreError) -> [TokenKey] { [] }

    /// Deletes nothing: a repository without this has no retention sweep.
    public func deleteRetired(_ keys: [TokenKey], before cutoff: Date) async throws(TokenStoreError) -> Int { 0 }

    /// None: a repository without this is swept at the longest interval only.
    public func earliestDeath(notBefore: Date?) async throws(TokenStoreError) -> Date? { nil }

    /// Stores `token`, clearing the key's failure state (a successful refresh); see
    /// `upsert(_:clearFailure:)` of one token.
    /// - Throws: ``TokenStoreError``; on failure nothing was written.
    public func upsert(_ token: StoredToken) async throws(TokenStoreError) {
        try await upsert(token, clearFailure: true)
    }

    /// Stores `tokens` in one transaction, clearing their failure state; see
    /// `upsert(_:clearFailure:)` of many.
    /// - Throws: ``TokenStoreError``; on failure nothing was written.
    public func upsert(_ tokens: [StoredToken]) async throws(TokenStoreError) {
        try await upsert(tokens, clearFailure: true)
    }
}

/// A change to the stored tokens, as seen by ``TokenRepository/changes()``.
public enum TokenStoreChange: Sendable, Equatable {
    /// The key's token was written (a refresh here or elsewhere).
    case upserted(TokenKey)
    /// The key's token was removed (a purge, an expiry clean-up).
    case removed(TokenKey)
    /// Changes were made that cannot be itemized (too many, or older than the change log):
    /// re-read whatever you hold.
    case unknown
}
