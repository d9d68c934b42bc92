// Test kit layer: an in-memory repository, with the SQLite store's semantics and change feed,
// and views sharing one InMemoryStorage to stand in for processes sharing a store file. This
// file: views, the change feed and the engine's reads and writes; leases and administration
// are forwarded in InMemoryTokenRepository+Admin.swift. The rules live in InMemoryStoreState.

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

    let storage: InMemoryStorage
    private let viewID: UInt64
    private let closed = Mutex(false)

    /// Creates an empty store with one view, this one.
    /// - Parameter location: What errors and check reports call the store; `memory` by default.
    public convenience init(location: String = "memory") {
        self.init(location: location, storage: InMemoryStorage())
    }

    private init(location: String, storage: InMemoryStorage) {
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
        storage.feed.finishStreams(of: viewID)
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
        try read { $0.retiredKeys(before: cutoff, after: after, limit: limit) }
    }

    /// The earliest death at or after `notBefore` (see `TokenRepository.earliestDeath(notBefore:)`).
    /// - Throws: `TokenStoreError.closed(path:)` after ``close()``.
    public func earliestDeath(notBefore: Date?) async throws(TokenStoreError) -> Date? {
        try read { $0.earliestDeath(notBefore: notBefore) }
    }

    /// Changes other views of this store wrote, as they commit; never this view's own. The
    /// stream ends when this view closes.
    public func changes() -> AsyncStream<TokenStoreChange> {
        storage.feed.subscribe(view: viewID, open: !closed.withLock { $0 })
    }

    /// Returns at once: views deliver their changes as they commit, with nothing to poll.
    public func runBackgroundWork() async {}

    /// Returns at once, as ``runBackgroundWork()`` does.
    public func followChanges() async {}

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
        try write { (state: inout InMemoryStoreState) throws(TokenStoreError) in
            try state.upsert(tokens, clearFailure: clearFailure, location: location)
        }
    }

    /// Removes the token of `key`, keeping its failure state; the entry goes when it has none.
    /// - Throws: `TokenStoreError.closed(path:)` after ``close()``.
    public func removeToken(for key: TokenKey) async throws(TokenStoreError) {
        try write { $0.removeToken(for: key) }
    }

    /// Records a failed refresh of `key`, creating its entry when needed.
    /// - Throws: `TokenStoreError` for a key the store refuses, or after ``close()``.
    public func recordFailure(_ failure: RefreshFailureState, for key: TokenKey) async throws(TokenStoreError) {
        try write { (state: inout InMemoryStoreState) throws(TokenStoreError) in
            try state.recordFailure(failure, for: key, location: location)
        }
    }

    /// Deletes the entries of `keys` still dead since before `cutoff`; returns how many went.
    /// - Throws: `TokenStoreError.closed(path:)` after ``close()``.
    public func deleteRetired(_ keys: [TokenKey], before cutoff: Date) async throws(TokenStoreError) -> Int {
        try write { $0.deleteRetired(keys, before: cutoff) }
    }

    // MARK: - Plumbing

    func read<T: Sendable>(_ body: (InMemoryStoreState) throws(TokenStoreError) -> T) throws(TokenStoreError) -> T {
        try checkOpen()
        return try storage.state.withLock { (state: inout InMemoryStoreState) throws(TokenStoreError) -> T in try body(state) }
    }

    /// Runs `body` on a copy of the state and keeps the result only when it returns: all or
    /// nothing. The changes it made go to the other views' streams.
    func write<T: Sendable>(_ body: (inout InMemoryStoreState) throws(TokenStoreError) -> T) throws(TokenStoreError) -> T {
        try checkOpen()
        let (result, changes, listeners) = try storage.state.withLock { (state: inout InMemoryStoreState) throws(TokenStoreError) in
            var transaction = state
            transaction.beginWrite()
            let result = try body(&transaction)
            state = transaction
            return (result, transaction.changes, storage.feed.listeners(excluding: viewID))
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
