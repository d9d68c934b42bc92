// Test kit layer: InMemoryStoreState's administration rules (what TokenStoreAdmin asks of the
// in-memory repository): listing, counting, purging, statistics.

import FleetTokenStore
import Foundation

extension InMemoryStoreState {
    func list(_ filter: TokenFilter, page: TokenPage) -> [TokenEntry] {
        Array(sortedEntries(after: page.after).filter(filter.matches).prefix(max(0, page.limit)))
    }

    func count(_ filter: TokenFilter, scope: PurgeScope) -> Int {
        entries.values.filter { Self.purges($0, filter, scope) }.count
    }

    /// Schema version and size are 0: an in-memory store has neither.
    func stats(at now: Date, policy: RefreshPolicy) -> TokenStoreStats {
        var counts: [TokenKind: [TokenStatus: Int]] = [:]
        for entry in entries.values {
            counts[entry.key.kind, default: [:]][entry.status(at: now, policy: policy), default: 0] += 1
        }
        let expiries = entries.values.compactMap(\.token?.expiresAt)
        return TokenStoreStats(total: entries.count, counts: counts, schemaVersion: 0, fileSizeBytes: 0,
                               oldestExpiry: expiries.min(), newestExpiry: expiries.max())
    }

    /// Failing keys keep their failure state under ``PurgeScope/tokens``.
    mutating func purge(_ filter: TokenFilter, scope: PurgeScope) -> Int {
        let matching = entries.values.filter { Self.purges($0, filter, scope) }
        for var entry in matching {
            entry.token = nil
            set(entry.key, scope == .tokens && entry.failure != nil ? entry : nil)
        }
        return matching.count
    }

    mutating func deleteExpired(before date: Date) -> Int {
        let expired = entries.values.filter { ($0.token?.expiresAt).map { $0 < date } ?? false }
        for entry in expired { set(entry.key, nil) }
        return expired.count
    }

    /// The entry goes when it holds no token.
    mutating func clearFailure(for key: TokenKey) {
        guard var entry = entries[key] else { return }
        entry.failure = nil
        set(key, entry.token == nil ? nil : entry)
    }

    /// Whether a purge of `filter` with `scope` touches `entry`.
    private static func purges(_ entry: TokenEntry, _ filter: TokenFilter, _ scope: PurgeScope) -> Bool {
        filter.matches(entry) && (scope == .tokensAndFailureState || entry.token != nil)
    }
}
