// Test kit layer: the in-memory repository's shared storage (entries, leases, change-feed
// subscribers), its refresh leases (RefreshLeaseStore) and its administration (TokenStoreAdmin).

public import FleetTokenStore
public import Foundation
import Synchronization

extension InMemoryTokenRepository {
    /// What every view of one in-memory store shares.
    final class Storage: Sendable {
        struct Lease: Sendable {
            var holder: String
            var until: Date
        }

        struct Subscriber: Sendable {
            let view: UInt64
            let continuation: AsyncStream<TokenStoreChange>.Continuation
        }

        struct State: Sendable {
            var entries: [TokenKey: TokenEntry] = [:]
            var leases: [TokenKey: Lease] = [:]
            var subscribers: [UInt64: Subscriber] = [:]
            var nextID: UInt64 = 0

            /// Entries in key order (the SQLite store's listing order), after `after` if given.
            func sortedEntries(after: TokenKey?) -> [TokenEntry] {
                entries.values.filter { entry in after.map { entry.key > $0 } ?? true }.sorted { $0.key < $1.key }
            }
        }

        let state = Mutex(State())

        func newViewID() -> UInt64 {
            state.withLock { state in
                state.nextID += 1
                return state.nextID
            }
        }

        /// A stream of what views other than `view` write; finished at once when `open` is false.
        func subscribe(view: UInt64, open: Bool) -> AsyncStream<TokenStoreChange> {
            let (stream, continuation) = AsyncStream<TokenStoreChange>.makeStream()
            guard open else {
                continuation.finish()
                return stream
            }
            let id = state.withLock { state in
                state.nextID += 1
                state.subscribers[state.nextID] = Subscriber(view: view, continuation: continuation)
                return state.nextID
            }
            continuation.onTermination = { [weak self] _ in
                self?.state.withLock { _ = $0.subscribers.removeValue(forKey: id) }
            }
            return stream
        }

        /// Ends the streams of `view`.
        func finishStreams(of view: UInt64) {
            let ending = state.withLock { state in
                let ids = state.subscribers.filter { $0.value.view == view }.map(\.key)
                return ids.compactMap { state.subscribers.removeValue(forKey: $0)?.continuation }
            }
            ending.forEach { $0.finish() }
        }
    }

    /// A write in progress: a copy of the entries, and the changes of tokens made to it (what
    /// the SQLite schema's triggers log: a token written, replaced or removed).
    struct Transaction {
        var entries: [TokenKey: TokenEntry]
        var changes: [TokenStoreChange] = []

        mutating func set(_ key: TokenKey, _ entry: TokenEntry?) {
            let old = entries[key]?.token
            entries[key] = entry
            switch (old, entry?.token) {
            case (nil, nil): break
            case (_?, nil): changes.append(.removed(key))
            case (nil, _?): changes.append(.upserted(key))
            case (let old?, let new?):
                if old.value != new.value || old.expiresAt != new.expiresAt { changes.append(.upserted(key)) }
            }
        }
    }

    // MARK: - RefreshLeaseStore

    /// Takes the refresh lease of `key` for `holder` unless another holder has one past `now`;
    /// see `RefreshLeaseStore.acquireRefreshLease(for:holder:now:duration:)`.
    /// - Throws: `TokenStoreError.closed(path:)` after ``close()``.
    public func acquireRefreshLease(for key: TokenKey, holder: String, now: Date,
                                    duration: TimeInterval) async throws(TokenStoreError) -> RefreshLease {
        try claimLease(key, holder: holder, replacing: nil, now: now, duration: duration)
    }

    /// Takes the refresh lease of `key` for `holder` from `deadHolder` if that holder still has
    /// it (or the lease is free); see
    /// `RefreshLeaseStore.takeOverRefreshLease(for:from:holder:now:duration:)`.
    /// - Throws: `TokenStoreError.closed(path:)` after ``close()``.
    public func takeOverRefreshLease(for key: TokenKey, from deadHolder: String, holder: String, now: Date,
                                     duration: TimeInterval) async throws(TokenStoreError) -> RefreshLease {
        try claimLease(key, holder: holder, replacing: deadHolder, now: now, duration: duration)
    }

    /// Gives up `holder`'s leases on `keys`; others' leases stay.
    /// - Throws: `TokenStoreError.closed(path:)` after ``close()``.
    public func releaseRefreshLeases(for keys: [TokenKey], holder: String) async throws(TokenStoreError) {
        try checkOpen()
        storage.state.withLock { state in
            for key in keys where state.leases[key]?.holder == holder { state.leases[key] = nil }
        }
    }

    private func claimLease(_ key: TokenKey, holder: String, replacing: String?, now: Date,
                            duration: TimeInterval) throws(TokenStoreError) -> RefreshLease {
        try checkOpen()
        return storage.state.withLock { state in
            let current = state.entries[key]
            if let lease = state.leases[key], lease.holder != holder, lease.holder != replacing, lease.until > now {
                return .heldElsewhere(holder: lease.holder, until: lease.until, current: current)
            }
            state.leases[key] = Storage.Lease(holder: holder, until: now.addingTimeInterval(duration))
            return .acquired(current: current)
        }
    }

    // MARK: - TokenStoreAdmin

    /// Entries matching `filter` in key order, one page at a time.
    /// - Throws: `TokenStoreError.closed(path:)` after ``close()``.
    public func list(_ filter: TokenFilter, page: TokenPage = TokenPage()) async throws(TokenStoreError) -> [TokenEntry] {
        try read { state in Array(state.sortedEntries(after: page.after).filter(filter.matches).prefix(max(0, page.limit))) }
    }

    /// How many entries a purge of `filter` with `scope` would remove.
    /// - Throws: `TokenStoreError.closed(path:)` after ``close()``.
    public func count(_ filter: TokenFilter, scope: PurgeScope) async throws(TokenStoreError) -> Int {
        try read { state in state.entries.values.filter { Self.purges($0, filter, scope) }.count }
    }

    /// Removes what `scope` names from the entries matching `filter`; returns how many entries
    /// lost a token (`PurgeScope.tokens`) or went (`PurgeScope.tokensAndFailureState`).
    /// - Throws: `TokenStoreError.closed(path:)` after ``close()``; nothing was deleted then.
    public func purge(_ filter: TokenFilter, scope: PurgeScope = .tokens) async throws(TokenStoreError) -> Int {
        try write { transaction in
            let matching = transaction.entries.values.filter { Self.purges($0, filter, scope) }
            for var entry in matching {
                entry.token = nil
                transaction.set(entry.key, scope == .tokens && entry.failure != nil ? entry : nil)
            }
            return matching.count
        }
    }

    /// Counts by kind and status at `now` under `policy`, and the expiry range; schema version
    /// and size are 0.
    /// - Throws: `TokenStoreError.closed(path:)` after ``close()``.
    public func stats(at now: Date = Date(), policy: RefreshPolicy = RefreshPolicy()) async throws(TokenStoreError) -> TokenStoreStats {
        try read { state in
            var counts: [TokenKind: [TokenStatus: Int]] = [:]
            for entry in state.entries.values {
                counts[entry.key.kind, default: [:]][entry.status(at: now, policy: policy), default: 0] += 1
            }
            let expiries = state.entries.values.compactMap(\.token?.expiresAt)
            return TokenStoreStats(total: state.entries.count, counts: counts, schemaVersion: 0, fileSizeBytes: 0,
                                   oldestExpiry: expiries.min(), newestExpiry: expiries.max())
        }
    }

    /// Deletes the entries whose token expired before `date`; returns how many went.
    /// - Throws: `TokenStoreError.closed(path:)` after ``close()``.
    public func deleteExpired(before date: Date) async throws(TokenStoreError) -> Int {
        try write { transaction in
            let expired = transaction.entries.values.filter { ($0.token?.expiresAt).map { $0 < date } ?? false }
            for entry in expired { transaction.set(entry.key, nil) }
            return expired.count
        }
    }

    /// Forgets the failure state of `key`; removes the entry when it holds no token.
    /// - Throws: `TokenStoreError.closed(path:)` after ``close()``.
    public func clearFailure(for key: TokenKey) async throws(TokenStoreError) {
        try write { transaction in
            guard var entry = transaction.entries[key] else { return }
            entry.failure = nil
            transaction.set(key, entry.token == nil ? nil : entry)
        }
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

    /// Whether a purge of `filter` with `scope` touches `entry`.
    private static func purges(_ entry: TokenEntry, _ filter: TokenFilter, _ scope: PurgeScope) -> Bool {
        filter.matches(entry) && (scope == .tokensAndFailureState || entry.token != nil)
    }
}
