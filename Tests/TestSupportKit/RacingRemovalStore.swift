// Shared by the test targets: a store that lets a test act between a read and the removal that
// follows it (EncryptedTokenRepository removes a value that does not open), as another process
// writing at that moment would. Everything is forwarded to a real store; only the timing is the
// test's.

import FleetTokenStore
import Foundation
import Synchronization

/// Forwards the calls the encryption layer makes to `base` (a real SQLite or PostgreSQL store);
/// before each token removal it runs `beforeRemoval`, which writes through another connection,
/// so the removal meets a row changed since it was read.
public final class RacingRemovalStore: TokenRepository, RefreshLeaseStore, TokenSealingStore, Sendable {
    /// The store every call goes to.
    public let base: any TokenRepository & RefreshLeaseStore & TokenSealingStore
    private let beforeRemoval: @Sendable (TokenKey) async throws -> Void
    private let removalCount = Mutex(0)

    /// Forwards to `base`, running `beforeRemoval` with the key before each removal.
    public init(base: any TokenRepository & RefreshLeaseStore & TokenSealingStore,
                beforeRemoval: @escaping @Sendable (TokenKey) async throws -> Void) {
        self.base = base
        self.beforeRemoval = beforeRemoval
    }

    /// How many removals were asked for (by key or by value).
    public var removals: Int { removalCount.withLock { $0 } }

    private func racing(_ key: TokenKey) async {
        removalCount.withLock { $0 += 1 }
        do { try await beforeRemoval(key) } catch { preconditionFailure("the racing write failed: \(error)") }
    }

    /// Runs the racing write, then removes as `base` does.
    public func removeToken(for key: TokenKey) async throws(TokenStoreError) {
        await racing(key)
        try await base.removeToken(for: key)
    }

    /// Runs the racing write, then removes as `base` does.
    public func removeToken(for key: TokenKey, ifValue value: String) async throws(TokenStoreError) -> Bool {
        await racing(key)
        return try await base.removeToken(for: key, ifValue: value)
    }

    // MARK: - Forwarded as they are

    /// Forwarded to ``base``.
    public func entry(for key: TokenKey) async throws(TokenStoreError) -> TokenEntry? { try await base.entry(for: key) }
    /// Forwarded to ``base``.
    public func entries(for keys: [TokenKey]) async throws(TokenStoreError) -> [TokenKey: TokenEntry] { try await base.entries(for: keys) }
    /// Forwarded to ``base``.
    public func upsert(_ token: StoredToken, clearFailure: Bool) async throws(TokenStoreError) { try await base.upsert(token, clearFailure: clearFailure) }
    /// Forwarded to ``base``.
    public func upsert(_ tokens: [StoredToken], clearFailure: Bool) async throws(TokenStoreError) { try await base.upsert(tokens, clearFailure: clearFailure) }
    /// Forwarded to ``base``.
    public func recordFailure(_ failure: RefreshFailureState, for key: TokenKey) async throws(TokenStoreError) {
        try await base.recordFailure(failure, for: key)
    }
    /// Forwarded to ``base``.
    public func retiredKeys(before cutoff: Date, after: TokenKey?, limit: Int) async throws(TokenStoreError) -> [TokenKey] {
        try await base.retiredKeys(before: cutoff, after: after, limit: limit)
    }
    /// Forwarded to ``base``.
    public func deleteRetired(_ keys: [TokenKey], before cutoff: Date) async throws(TokenStoreError) -> Int {
        try await base.deleteRetired(keys, before: cutoff)
    }
    /// Forwarded to ``base``.
    public func changes() -> AsyncStream<TokenStoreChange> { base.changes() }
    /// Forwarded to ``base``.
    public func runBackgroundWork() async { await base.runBackgroundWork() }
    /// Forwarded to ``base``.
    public func followChanges() async { await base.followChanges() }

    /// Forwarded to ``base``.
    public func acquireRefreshLease(for key: TokenKey, holder: String, now: Date, duration: TimeInterval) async throws(TokenStoreError) -> RefreshLease {
        try await base.acquireRefreshLease(for: key, holder: holder, now: now, duration: duration)
    }
    /// Forwarded to ``base``.
    public func takeOverRefreshLease(for key: TokenKey, from deadHolder: String, holder: String, now: Date,
                                     duration: TimeInterval) async throws(TokenStoreError) -> RefreshLease {
        try await base.takeOverRefreshLease(for: key, from: deadHolder, holder: holder, now: now, duration: duration)
    }
    /// Forwarded to ``base``.
    public func releaseRefreshLeases(for keys: [TokenKey], holder: String) async throws(TokenStoreError) {
        try await base.releaseRefreshLeases(for: keys, holder: holder)
    }
    /// Forwarded to ``base``.
    public func deleteExpiredRefreshLeases(before cutoff: Date, limit: Int) async throws(TokenStoreError) -> Int {
        try await base.deleteExpiredRefreshLeases(before: cutoff, limit: limit)
    }

    /// Forwarded to ``base``.
    public var storeName: String { base.storeName }
    /// Forwarded to ``base``.
    public func valueKeyIDs() async throws(TokenStoreError) -> Set<String> { try await base.valueKeyIDs() }
    /// Forwarded to ``base``.
    public func valueKeyCounts() async throws(TokenStoreError) -> [String: Int] { try await base.valueKeyCounts() }
    /// Forwarded to ``base``.
    public func tokenKeys(valueKeyID: String, matching: Bool, after: TokenKey?, limit: Int) async throws(TokenStoreError) -> [TokenKey] {
        try await base.tokenKeys(valueKeyID: valueKeyID, matching: matching, after: after, limit: limit)
    }
    /// Forwarded to ``base``.
    public func replaceValues(_ replacements: [TokenValueReplacement]) async throws(TokenStoreError) -> Set<TokenKey> {
        try await base.replaceValues(replacements)
    }
    /// Forwarded to ``base``.
    public func discardReplacedValues() async throws(TokenStoreError) { try await base.discardReplacedValues() }
    /// Forwarded to ``base``.
    public func replacedValuesAwaitDiscard() async throws(TokenStoreError) -> Bool { try await base.replacedValuesAwaitDiscard() }
}
