// Encryption layer: a repository that seals token values before they reach the store it wraps
// and opens them when loaded; the engine's memory holds plaintext, so the hit path is unchanged.

public import Foundation
public import Logging

/// A ``TokenRepository`` that seals every token value with its keyring's primary key before
/// the wrapped store sees it, and opens values as they are loaded.
///
/// A stored value that does not open (altered, moved to another row, sealed with a key the
/// keyring lacks, or not sealed at all) is never handed out: it reads as missing, is logged as
/// an error naming the key and key id, and the engine fetches a new token. One that fails with
/// a key the keyring holds (altered or moved) is also removed, so the refetched token replaces
/// it: that value only, while the store still holds it (a token another process stored since
/// the read stays); the others were likely written by another process sharing the store, and stay.
/// Open a store with ``TokenValueResealer/prepare(keyring:)`` first: it refuses a store that
/// needs keys the keyring lacks, and seals an older store's plaintext values.
///
/// It is the engine's ``RefreshLeaseStore`` too: a lease request also reads the key's entry,
/// whose token it opens like any other read.
///
/// ```swift
/// let keyring = try TokenKeyring.load(files: ["/etc/token-agent/key"], environment: [:])!
/// let store = try SQLiteTokenRepository(path: path, logger: logger)
/// try await TokenValueResealer(store: store, logger: logger).prepare(keyring: keyring)
/// let sealed = EncryptedTokenRepository(base: store, keyring: keyring, logger: logger)
/// let engine = TokenSyncEngine(repository: sealed, fetcher: fetcher, logger: logger)
/// ```
public struct EncryptedTokenRepository: TokenRepository, RefreshLeaseStore {
    /// The store the sealed values go to, and its leases.
    public let base: any TokenRepository & RefreshLeaseStore & TokenSealingStore
    /// The keys values are sealed and opened with.
    public let keyring: TokenKeyring
    private let logger: Logger

    /// Wraps `base`, sealing with `keyring`'s primary key and opening with any of its keys.
    /// - Parameters:
    ///   - base: The store that holds the sealed values.
    ///   - keyring: Seals with its primary key, opens with any of its keys.
    ///   - logger: Receives the errors of values that do not open (never a value).
    public init(base: any TokenRepository & RefreshLeaseStore & TokenSealingStore, keyring: TokenKeyring, logger: Logger) {
        self.base = base
        self.keyring = keyring
        self.logger = logger
    }

    /// The entry for `key`, its token opened; a token that does not open is absent.
    /// - Throws: ``TokenStoreError`` when the store cannot be read.
    public func entry(for key: TokenKey) async throws(TokenStoreError) -> TokenEntry? {
        guard let entry = try await base.entry(for: key) else { return nil }
        return await opened(entry)
    }

    /// The entries for `keys`, their tokens opened; a token that does not open is absent.
    /// - Throws: ``TokenStoreError`` when the store cannot be read.
    public func entries(for keys: [TokenKey]) async throws(TokenStoreError) -> [TokenKey: TokenEntry] {
        var found = try await base.entries(for: keys)
        for (key, entry) in found where entry.token != nil {
            found[key] = await opened(entry)
        }
        return found
    }

    /// Stores `token` with its value sealed; see `TokenRepository.upsert(_:clearFailure:)`.
    /// - Throws: ``TokenStoreError``; on failure nothing was written.
    public func upsert(_ token: StoredToken, clearFailure: Bool) async throws(TokenStoreError) {
        try await base.upsert(sealed(token), clearFailure: clearFailure)
    }

    /// Stores `tokens` with their values sealed, in one transaction.
    /// - Throws: ``TokenStoreError``; on failure nothing was written.
    public func upsert(_ tokens: [StoredToken], clearFailure: Bool) async throws(TokenStoreError) {
        try await base.upsert(tokens.map(sealed), clearFailure: clearFailure)
    }

    /// Removes `key`'s token, keeping its failure state.
    /// - Throws: ``TokenStoreError``; on failure nothing was changed.
    public func removeToken(for key: TokenKey) async throws(TokenStoreError) {
        try await base.removeToken(for: key)
    }

    /// Records a failed refresh of `key`.
    /// - Throws: ``TokenStoreError``; on failure nothing was written.
    public func recordFailure(_ failure: RefreshFailureState, for key: TokenKey) async throws(TokenStoreError) {
        try await base.recordFailure(failure, for: key)
    }

    /// The wrapped store's retention candidates.
    /// - Throws: ``TokenStoreError`` when the store cannot be read.
    public func retiredKeys(before cutoff: Date, after: TokenKey?, limit: Int) async throws(TokenStoreError) -> [TokenKey] {
        try await base.retiredKeys(before: cutoff, after: after, limit: limit)
    }

    /// The wrapped store's earliest death at or after `notBefore`.
    /// - Throws: ``TokenStoreError`` when the store cannot be read.
    public func earliestDeath(notBefore: Date?) async throws(TokenStoreError) -> Date? {
        try await base.earliestDeath(notBefore: notBefore)
    }

    /// Deletes retired entries from the wrapped store.
    /// - Throws: ``TokenStoreError``; on failure nothing was deleted.
    public func deleteRetired(_ keys: [TokenKey], before cutoff: Date) async throws(TokenStoreError) -> Int {
        try await base.deleteRetired(keys, before: cutoff)
    }

    /// The wrapped store's change feed.
    public func changes() -> AsyncStream<TokenStoreChange> { base.changes() }

    /// The wrapped store's background work.
    public func runBackgroundWork() async { await base.runBackgroundWork() }

    /// The wrapped store's change-feed work.
    public func followChanges() async { await base.followChanges() }

    // MARK: - Leases

    /// Takes `key`'s refresh lease in the wrapped store; the entry read with it is opened.
    /// - Throws: ``TokenStoreError``; on failure no lease was taken.
    public func acquireRefreshLease(for key: TokenKey, holder: String, now: Date,
                                    duration: TimeInterval) async throws(TokenStoreError) -> RefreshLease {
        await opened(try await base.acquireRefreshLease(for: key, holder: holder, now: now, duration: duration))
    }

    /// Takes `key`'s refresh lease over from `deadHolder` in the wrapped store; the entry read
    /// with it is opened.
    /// - Throws: ``TokenStoreError``; on failure no lease was taken.
    public func takeOverRefreshLease(for key: TokenKey, from deadHolder: String, holder: String, now: Date,
                                     duration: TimeInterval) async throws(TokenStoreError) -> RefreshLease {
        await opened(try await base.takeOverRefreshLease(for: key, from: deadHolder, holder: holder, now: now, duration: duration))
    }

    /// Gives up `holder`'s leases on `keys` in the wrapped store.
    /// - Throws: ``TokenStoreError``; on failure the leases run until they expire.
    public func releaseRefreshLeases(for keys: [TokenKey], holder: String) async throws(TokenStoreError) {
        try await base.releaseRefreshLeases(for: keys, holder: holder)
    }

    /// Deletes the base store's leases that expired before `cutoff` (no values involved).
    /// - Throws: ``TokenStoreError``; on failure nothing was deleted.
    public func deleteExpiredRefreshLeases(before cutoff: Date, limit: Int) async throws(TokenStoreError) -> Int {
        try await base.deleteExpiredRefreshLeases(before: cutoff, limit: limit)
    }

    private func opened(_ lease: RefreshLease) async -> RefreshLease {
        switch lease {
        case .acquired(let current?): .acquired(current: await opened(current))
        case .heldElsewhere(let holder, let until, let current?): .heldElsewhere(holder: holder, until: until, current: await opened(current))
        default: lease
        }
    }

    // MARK: - Sealing and opening

    private func sealed(_ token: StoredToken) -> StoredToken {
        var sealed = token
        sealed.value = SealedTokenValue.seal(token.value, for: token.key, with: keyring.primary, fingerprint: token.fingerprint)
        return sealed
    }

    /// `entry` with its token opened, or without it (marked unreadable) when it does not open.
    private func opened(_ entry: TokenEntry) async -> TokenEntry {
        guard let token = entry.token else { return entry }
        var result = entry
        switch SealedTokenValue.open(token.value, for: entry.key, with: keyring) {
        case .opened(let value, _):
            result.token?.value = value
            return result
        case .missingKey(let keyID):
            // Another process seals with a key this one lacks: its value is not ours to remove.
            logger.error("stored token is sealed with a key this process does not hold: treated as missing, fetched anew", metadata: [
                "key": "\(entry.key)", "key_id": .string(keyID),
                "hint": "give every process sharing the store the same key files",
            ])
        case .failed(let keyID):
            logger.error("stored token does not open (altered, or copied from another row): treated as missing, removed and fetched anew", metadata: [
                "key": "\(entry.key)", "key_id": .string(keyID),
            ])
            await remove(entry.key, ifValue: token.value)
        case .plaintext:
            // Likely written by a process sharing the store without the key: not ours to remove.
            logger.error("stored token is not sealed although this process seals them (written by a process without the key?): treated as missing, fetched anew", metadata: [
                "key": "\(entry.key)", "key_id": .string(plaintextKeyID),
                "hint": "give every process sharing the store the same key files",
            ])
        }
        result.token = nil
        result.tokenUnreadable = true
        return result
    }

    /// Removes `key`'s token only while it is still `value`, the one that did not open: a valid
    /// token another process stored since the read must not be purged for everyone.
    private func remove(_ key: TokenKey, ifValue value: String) async {
        do { _ = try await base.removeToken(for: key, ifValue: value) } catch {
            logger.warning("could not remove a stored token that does not open; the next write replaces it", metadata: [
                "key": "\(key)", "error": "\(error)",
            ])
        }
    }
}
