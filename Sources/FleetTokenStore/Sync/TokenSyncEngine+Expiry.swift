// Sync layer: the earliest expiry among the tracked subjects' tokens, for the
// fleet_tokens_earliest_expiry_timestamp_seconds gauge (one number, however many subjects).

public import Foundation
import Synchronization

extension TokenSyncEngine {
    /// The earliest expiry among the tracked subjects' tokens (``track(_:)``), on this host's
    /// clock (the token's `exp` less the offset to the provider's clock the engine applies).
    ///
    /// A tracked subject that holds no token (not fetched yet, or its token expired and was
    /// dropped) counts as expiring at the Unix epoch: it is the case an operator must hear of,
    /// not one to leave out. Nil when nothing is tracked. No I/O; the memory lock is taken per
    /// few hundred subjects, so the hot path never waits for a whole scan.
    package func earliestTrackedExpiry() -> Date? {
        let keys = tracked.keys
        guard !keys.isEmpty else { return nil }
        return memory.earliestExpiry(of: keys)
    }

    /// Sets the gauge `fleet_tokens_earliest_expiry_timestamp_seconds` to
    /// ``earliestTrackedExpiry()`` (removes it when nothing is tracked) and returns that value.
    ///
    /// swift-metrics has no gauge read at collection time, so the value is recorded when this is
    /// called: call it right before each scrape is rendered (as token-agent's `/metrics` does),
    /// or every few seconds with a push-based backend. It costs one hash lookup per tracked
    /// subject.
    @discardableResult
    public func recordEarliestTrackedExpiry() -> Date? {
        let expiry = earliestTrackedExpiry()
        metrics.earliestExpiry.record(expiry)
        return expiry
    }
}

extension TokenMemory {
    /// The earliest local-clock expiry of the tokens held for `keys`; the Unix epoch as soon as
    /// one of them holds none. Locks per chunk of keys, not for the whole set.
    func earliestExpiry(of keys: Set<TokenKey>) -> Date {
        let none = Date(timeIntervalSince1970: 0)
        var earliest = Date.distantFuture
        var start = keys.startIndex
        while start != keys.endIndex {
            let end = keys.index(start, offsetBy: 256, limitedBy: keys.endIndex) ?? keys.endIndex
            let chunk = keys[start..<end]
            let found: Date? = state.withLock { state in
                var chunkEarliest = Date.distantFuture
                for key in chunk {
                    guard let token = state.slots[key]?.keyState.held?.token else { return nil }
                    chunkEarliest = min(chunkEarliest, token.expiresAt.addingTimeInterval(-state.clockOffset))
                }
                return chunkEarliest
            }
            guard let found else { return none }
            earliest = min(earliest, found)
            start = end
        }
        return earliest
    }
}
