// Test kit layer: an in-memory repository. Tokens, failure state and refresh leases in a dictionary
// behind a Mutex, with the SQLite store's semantics and change feed, and views sharing one
// storage to stand in for processes sharing a store file. This file: storage, views, the
// change feed and the engine's reads and writes; leases and administration are in
// InMemoryTokenRepository+Admin.swift.

public import FleetTokenStore
public import Foundation
import Synchronization

/// A token store in memory, for tests of code built on the engine or on the repository
/// protocols: `TokenRepository`, `RefreshLeaseStore` and `TokenStoreAdmin`, with the
/// behaviour of `SQLiteTokenRepository` (the repository contract suite runs against both) and
/// no files.
///
/// Each value is a *view* of a storage. ``makeView()`` makes another view of the same storage,
/// as another process opening the same store file would have: what one view writes, the others
/// read at once, and their ``changes()`` streams report it (a view's own writes are not
/// reported to itself, as with the SQLite store). Use two views to test code that runs beside
/// another process, without processes.
///
/// ```swift
/// let store = InMemoryTokenRepository()
/// let otherProcess = store.makeView()
/// let engine = TokenSyncEngine(repository: store, fetcher: fetcher, logger: log.logger,
///                              clock: time.clock, now: time.wall)
/// try await otherProcess.upsert(token)          // engine adopts it from its change feed
/// ```
///
/// Like the SQLite schema, the store refuses a key whose subject id is empty or longer than
/// `TokenKey.maximumSubjectIDLength` bytes (which only unchecked test code can build): the
/// write fails whole with a `TokenStoreError`. An in-memory store has no schema:
/// ``schemaVersion()`` is 0.
public final class InMemoryTokenRepository: TokenRepository, RefreshLeaseStore, TokenStoreAdmin, Sendable {
    /// What errors and check reports name as the store's path.
    public let location: String

    let storage: Storage
    private let viewID: UInt64
    private let closed = Mutex(false)

    /// Creates an empty store with one view, this one.
    /// - Parameter location: What errors and check reports call the store; `memory` by default.
    public convenience init(location: String = "memory") {
        self.init(location: location, storage: Storage())
    }

    private init(location: String, storage: Storage) {
        self.location = location
        self.storage = storage
        self.viewID = storage.newViewID()
    }

    /// Another view of this store's tokens, failure state and leases, as another process
    /// sharing a store file would have: each view's ``changes()`` reports what the other views
    /// write. Closing one view leaves the others open.
    public func makeView() -> InMemoryTokenRepository {
        InMemoryTokenRepository(location: location, storage: storage)
    }

    /// Closes this view: its ``changes()`` streams end, and later calls through it throw
    /// `TokenStoreError.closed(path:)`. Other views and the stored data are unaffected.
    public func close() {
        closed.withLock { $0 = true }
        storage.finishStreams(of: viewID)
    }

    // MARK: - Engine reads

    /// The entry for `key`, or nil.
    /// - Throws: `TokenStoreError.closed(path:)` after ``close()``.
    public func entry(for key: TokenKey) async throws(TokenStoreError) -> TokenEntry? {
        try read { $0.entries[key] }
    }

    /// The entries for `keys` that exist.
    /// - Throws: `TokenStoreError.closed(path:)` after ``close()``.
    public func entries(for keys: [TokenKey]) async throws(TokenStoreError) -> [TokenKey: TokenEntry] {
        try read { state in
            var found: [TokenKey: TokenEntry] = [:]
            for key in keys { if let entry = state.entries[key] { found[key] = entry } }
            return found
        }
    }

    /// Keys dead since before `cutoff`, in key order after `after`, at most `limit` (see
    /// `TokenRepository.retiredKeys(before:after:limit:)`).
    /// - Throws: `TokenStoreError.closed(path:)` after ``close()``.
    public func retiredKeys(before cutoff: Date, after: TokenKey?, limit: Int) async throws(TokenStoreError) -> [TokenKey] {
        try read { state in
            Array(state.sortedEntries(after: after).filter { Self.isRetired($0, before: cutoff) }.prefix(max(0, limit)).map(\.key))
        }
    }

    /// Changes other views of this store wrote, as they commit; never this view's own. The
    /// stream ends when this view closes.
    public func changes() -> AsyncStream<TokenStoreChange> {
        storage.subscribe(view: viewID, open: !closed.withLock { $0 })
    }

    // MARK: - Engine writes

    /// Stores `token` unless the key's token expires later (see
    /// `TokenRepository.upsert(_:clearFailure:)`).
    /// - Throws: `TokenStoreError` for a key the store refuses, or after ``close()``; nothing
    ///   was written then.
    public func upsert(_ token: StoredToken, clearFailure: Bool = true) async throws(TokenStoreError) {
        try await upsert([token], clearFailure: clearFailure)
    }

    /// Stores `tokens`, each as the single upsert would: all or nothing.
    /// - Throws: `TokenStoreError` for a key the store refuses, or after ``close()``; nothing
    ///   was written then.
    public func upsert(_ tokens: [StoredToken], clearFailure: Bool = true) async throws(TokenStoreError) {
        try write { (transaction: inout Transaction) throws(TokenStoreError) in
            for token in tokens { try checkKey(token.key) }
            for token in tokens {
                let existing = transaction.entries[token.key]
                if let held = existing?.token, token.expiresAt < held.expiresAt { continue }
                var stored = token
                stored.lastUsedAt = token.lastUsedAt ?? existing?.token?.lastUsedAt
                transaction.set(token.key, TokenEntry(key: token.key, token: stored,
                                                      failure: clearFailure ? nil : existing?.failure))
            }
        }
    }

    /// Removes the token of `key`, keeping its failure state; the entry goes when it has none.
    /// - Throws: `TokenStoreError.closed(path:)` after ``close()``.
    public func removeToken(for key: TokenKey) async throws(TokenStoreError) {
        try write { transaction in
            guard var entry = transaction.entries[key] else { return }
            entry.token = nil
            transaction.set(key, entry.failure == nil ? nil : entry)
        }
    }

    /// Records a failed refresh of `key`, creating its entry when needed.
    /// - Throws: `TokenStoreError` for a key the store refuses, or after ``close()``.
    public func recordFailure(_ failure: RefreshFailureState, for key: TokenKey) async throws(TokenStoreError) {
        try write { (transaction: inout Transaction) throws(TokenStoreError) in
            try checkKey(key)
            var recorded = failure
            recorded.consecutiveFailures = max(1, failure.consecutiveFailures)
            var entry = transaction.entries[key] ?? TokenEntry(key: key, token: nil, failure: nil)
            entry.failure = recorded
            transaction.set(key, entry)
        }
    }

    /// Deletes the entries of `keys` still dead since before `cutoff`; returns how many went.
    /// - Throws: `TokenStoreError.closed(path:)` after ``close()``.
    public func deleteRetired(_ keys: [TokenKey], before cutoff: Date) async throws(TokenStoreError) -> Int {
        try write { transaction in
            var deleted = 0
            for key in keys {
                guard let entry = transaction.entries[key], Self.isRetired(entry, before: cutoff) else { continue }
                transaction.set(key, nil)
                deleted += 1
            }
            return deleted
        }
    }

    // MARK: - Plumbing

    /// Dead since before `cutoff`: no token or one expired before it, and no failure or planned
    /// retry after it.
    static func isRetired(_ entry: TokenEntry, before cutoff: Date) -> Bool {
        let expiry = entry.token?.expiresAt ?? Date(timeIntervalSince1970: 0)
        guard expiry < cutoff else { return false }
        guard let failure = entry.failure else { return true }
        return failure.lastFailureAt < cutoff && failure.nextAttemptAt < cutoff
    }

    /// Refuses what the SQLite schema's constraints refuse: an empty or over-long subject id.
    private func checkKey(_ key: TokenKey) throws(TokenStoreError) {
        guard key.subjectID.isEmpty || key.subjectID.utf8.count > TokenKey.maximumSubjectIDLength else { return }
        throw .sqlite(path: location, code: 19, message: "CHECK constraint failed: a subject id is 1 to \(TokenKey.maximumSubjectIDLength) bytes long")
    }

    func read<T: Sendable>(_ body: (Storage.State) throws(TokenStoreError) -> T) throws(TokenStoreError) -> T {
        try checkOpen()
        return try storage.state.withLock { (state: inout Storage.State) throws(TokenStoreError) -> T in try body(state) }
    }

    /// Runs `body` on a copy of the entries and keeps the result only when it returns: all or
    /// nothing. The changes it made go to the other views' streams.
    func write<T: Sendable>(_ body: (inout Transaction) throws(TokenStoreError) -> T) throws(TokenStoreError) -> T {
        try checkOpen()
        let (result, changes, listeners) = try storage.state.withLock { (state: inout Storage.State) throws(TokenStoreError) in
            var transaction = Transaction(entries: state.entries)
            let result = try body(&transaction)
            state.entries = transaction.entries
            let listeners = state.subscribers.values.filter { $0.view != viewID }.map(\.continuation)
            return (result, transaction.changes, listeners)
        }
        for change in changes {
            for listener in listeners { listener.yield(change) }
        }
        return result
    }

    func checkOpen() throws(TokenStoreError) {
        if closed.withLock({ $0 }) { throw .closed(path: location) }
    }
}
