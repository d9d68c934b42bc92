// Test kit layer: the in-memory repository as a RefreshLeaseStore and a TokenStoreAdmin,
// forwarding to InMemoryStoreState's lease and administration rules.

public import FleetTokenStore
public import Foundation

extension InMemoryTokenRepository {
    // MARK: - RefreshLeaseStore

    /// Takes the refresh lease of `key` for `holder` unless another holder has one past `now`;
    /// see `RefreshLeaseStore.acquireRefreshLease(for:holder:now:duration:)`.
    /// - Throws: `TokenStoreError.closed(path:)` after ``close()``.
    public func acquireRefreshLease(for key: TokenKey, holder: String, now: Date,
                                    duration: TimeInterval) async throws(TokenStoreError) -> RefreshLease {
        try write { $0.claimLease(key, holder: holder, replacing: nil, now: now, duration: duration) }
    }

    /// Takes the refresh lease of `key` for `holder` from `deadHolder` if that holder still has
    /// it (or the lease is free); see
    /// `RefreshLeaseStore.takeOverRefreshLease(for:from:holder:now:duration:)`.
    /// - Throws: `TokenStoreError.closed(path:)` after ``close()``.
    public func takeOverRefreshLease(for key: TokenKey, from deadHolder: String, holder: String, now: Date,
                                     duration: TimeInterval) async throws(TokenStoreError) -> RefreshLease {
        try write { $0.claimLease(key, holder: holder, replacing: deadHolder, now: now, duration: duration) }
    }

    /// Gives up `holder`'s leases on `keys`; others' leases stay.
    /// - Throws: `TokenStoreError.closed(path:)` after ``close()``.
    public func releaseRefreshLeases(for keys: [TokenKey], holder: String) async throws(TokenStoreError) {
        try write { $0.releaseLeases(keys, holder: holder) }
    }

    /// Deletes up to `limit` leases that expired before `cutoff`; returns how many.
    /// - Throws: `TokenStoreError.closed(path:)` after ``close()``.
    public func deleteExpiredRefreshLeases(before cutoff: Date, limit: Int) async throws(TokenStoreError) -> Int {
        try write { $0.deleteExpiredLeases(before: cutoff, limit: limit) }
    }

    // MARK: - TokenStoreAdmin

    /// Entries matching `filter` in key order, one page at a time.
    /// - Throws: `TokenStoreError.closed(path:)` after ``close()``.
    public func list(_ filter: TokenFilter, page: TokenPage = TokenPage()) async throws(TokenStoreError) -> [TokenEntry] {
        try read { $0.list(filter, page: page) }
    }

    /// How many entries a purge of `filter` with `scope` would remove.
    /// - Throws: `TokenStoreError.closed(path:)` after ``close()``.
    public func count(_ filter: TokenFilter, scope: PurgeScope) async throws(TokenStoreError) -> Int {
        try read { $0.count(filter, scope: scope) }
    }

    /// Removes what `scope` names from the entries matching `filter`; returns how many entries
    /// lost a token (`PurgeScope.tokens`) or went (`PurgeScope.tokensAndFailureState`).
    /// - Throws: `TokenStoreError.closed(path:)` after ``close()``; nothing was deleted then.
    public func purge(_ filter: TokenFilter, scope: PurgeScope = .tokens) async throws(TokenStoreError) -> Int {
        try write { $0.purge(filter, scope: scope) }
    }

    /// Counts by kind and status at `now` under `policy`, and the expiry range; schema version
    /// and size are 0.
    /// - Throws: `TokenStoreError.closed(path:)` after ``close()``.
    public func stats(at now: Date = Date(), policy: RefreshPolicy = RefreshPolicy()) async throws(TokenStoreError) -> TokenStoreStats {
        try read { $0.stats(at: now, policy: policy) }
    }

    /// Deletes the entries whose token expired before `date`; returns how many went.
    /// - Throws: `TokenStoreError.closed(path:)` after ``close()``.
    public func deleteExpired(before date: Date) async throws(TokenStoreError) -> Int {
        try write { $0.deleteExpired(before: date) }
    }

    /// Forgets the failure state of `key`; removes the entry when it holds no token.
    /// - Throws: `TokenStoreError.closed(path:)` after ``close()``.
    public func clearFailure(for key: TokenKey) async throws(TokenStoreError) {
        try write { $0.clearFailure(for: key) }
    }

    /// 0: an in-memory store has no schema.
    /// - Throws: `TokenStoreError.closed(path:)` after ``close()``.
    public func schemaVersion() async throws(TokenStoreError) -> Int {
        try checkOpen()
        return 0
    }

    /// A healthy report (no files, no schema, nothing to check), or one naming the closed view.
    public func check() async -> StoreCheckReport {
        let problems = (try? checkOpen()) == nil ? [TokenStoreError.closed(path: location).description] : []
        return StoreCheckReport(storePath: location, buildSchemaVersion: 0, schemaVersion: problems.isEmpty ? 0 : nil,
                                integrityProblems: problems.isEmpty ? [] : nil, backgroundIntegrityFinding: nil,
                                files: nil, problems: problems)
    }
}
