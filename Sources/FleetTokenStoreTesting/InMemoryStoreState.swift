// Test kit layer: InMemoryStoreState, the in-memory repository's stored data and its rules as a
// value type: entries and refresh leases, each write as the SQLite store would do it, and the
// token changes a write makes (what the SQLite schema's triggers log).

import FleetTokenStore
import Foundation

/// Tokens, failure state and leases of one in-memory store. A write runs on a copy and is kept
/// only when it returns (all or nothing); ``changes`` then lists what it did to tokens.
struct InMemoryStoreState: Sendable {
    struct Lease: Sendable {
        var holder: String
        var until: Date
    }

    private(set) var entries: [TokenKey: TokenEntry] = [:]
    private var leases: [TokenKey: Lease] = [:]
    /// Token changes since the last ``beginWrite()``: a token written, replaced or removed.
    private(set) var changes: [TokenStoreChange] = []

    mutating func beginWrite() { changes = [] }

    /// Sets (or, with nil, deletes) the entry of `key`, noting the change to its token.
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

    /// Entries in key order (the SQLite store's listing order), after `after` if given.
    func sortedEntries(after: TokenKey?) -> [TokenEntry] {
        entries.values.filter { entry in after.map { entry.key > $0 } ?? true }.sorted { $0.key < $1.key }
    }

    // MARK: - Engine

    func retiredKeys(before cutoff: Date, after: TokenKey?, limit: Int) -> [TokenKey] {
        Array(sortedEntries(after: after).filter { Self.isRetired($0, before: cutoff) }.prefix(max(0, limit)).map(\.key))
    }

    /// Each token stored unless the key's token expires later; `location` names the store in
    /// the error for a refused key.
    mutating func upsert(_ tokens: [StoredToken], clearFailure: Bool, location: String) throws(TokenStoreError) {
        for token in tokens { try Self.checkKey(token.key, location: location) }
        for token in tokens {
            let existing = entries[token.key]
            if let held = existing?.token, token.expiresAt < held.expiresAt { continue }
            var stored = token
            stored.lastUsedAt = token.lastUsedAt ?? existing?.token?.lastUsedAt
            set(token.key, TokenEntry(key: token.key, token: stored, failure: clearFailure ? nil : existing?.failure))
        }
    }

    /// The entry goes when it keeps no failure state.
    mutating func removeToken(for key: TokenKey) {
        guard var entry = entries[key] else { return }
        entry.token = nil
        set(key, entry.failure == nil ? nil : entry)
    }

    mutating func recordFailure(_ failure: RefreshFailureState, for key: TokenKey, location: String) throws(TokenStoreError) {
        try Self.checkKey(key, location: location)
        var recorded = failure
        recorded.consecutiveFailures = max(1, failure.consecutiveFailures)
        var entry = entries[key] ?? TokenEntry(key: key, token: nil, failure: nil)
        entry.failure = recorded
        set(key, entry)
    }

    mutating func deleteRetired(_ keys: [TokenKey], before cutoff: Date) -> Int {
        var deleted = 0
        for key in keys {
            guard let entry = entries[key], Self.isRetired(entry, before: cutoff) else { continue }
            set(key, nil)
            deleted += 1
        }
        return deleted
    }

    // MARK: - Leases

    /// Reads `key`'s entry and gives its lease to `holder` unless a holder other than `holder`
    /// and `replacing` has it past `now`.
    mutating func claimLease(_ key: TokenKey, holder: String, replacing: String?, now: Date,
                             duration: TimeInterval) -> RefreshLease {
        let current = entries[key]
        if let lease = leases[key], lease.holder != holder, lease.holder != replacing, lease.until > now {
            return .heldElsewhere(holder: lease.holder, until: lease.until, current: current)
        }
        leases[key] = Lease(holder: holder, until: now.addingTimeInterval(duration))
        return .acquired(current: current)
    }

    /// Others' leases stay.
    mutating func releaseLeases(_ keys: [TokenKey], holder: String) {
        for key in keys where leases[key]?.holder == holder { leases[key] = nil }
    }

    /// Deletes up to `limit` leases that expired before `cutoff`; returns how many.
    mutating func deleteExpiredLeases(before cutoff: Date, limit: Int) -> Int {
        let expired = leases.filter { $0.value.until < cutoff }.keys.prefix(max(0, limit))
        for key in expired { leases[key] = nil }
        return expired.count
    }

    /// The earliest death at or after `notBefore` (every entry's when nil), nil when none.
    func earliestDeath(notBefore: Date?) -> Date? {
        entries.values.map(Self.diedAt).filter { died in notBefore.map { died >= $0 } ?? true }.min()
    }

    // MARK: - Rules

    /// When an entry died: its token's expiry, or its last failure or planned retry when later.
    static func diedAt(_ entry: TokenEntry) -> Date {
        let expiry = entry.token?.expiresAt ?? Date(timeIntervalSince1970: 0)
        guard let failure = entry.failure else { return expiry }
        return max(expiry, failure.lastFailureAt, failure.nextAttemptAt)
    }

    /// Dead since before `cutoff`: no token or one expired before it, and no failure or planned
    /// retry after it.
    static func isRetired(_ entry: TokenEntry, before cutoff: Date) -> Bool {
        let expiry = entry.token?.expiresAt ?? Date(timeIntervalSince1970: 0)
        guard expiry < cutoff else { return false }
        guard let failure = entry.failure else { return true }
        return failure.lastFailureAt < cutoff && failure.nextAttemptAt < cutoff
    }

    /// Refuses what the SQLite schema's constraints refuse: an empty or over-long subject id.
    private static func checkKey(_ key: TokenKey, location: String) throws(TokenStoreError) {
        guard key.subjectID.isEmpty || key.subjectID.utf8.count > TokenKey.maximumSubjectIDLength else { return }
        throw .sqlite(path: location, code: 19, message: "CHECK constraint failed: a subject id is 1 to \(TokenKey.maximumSubjectIDLength) bytes long")
    }
}
