// Sync layer: whether the store takes writes. The engine keeps serving from memory while it
// does not, and says so once when it stops and once when it works again.
import CoreMetrics
import Logging
import Synchronization

/// Tracks store write failures: counts each, and logs and reports the transitions between
/// working and degraded (not every failure: a full disk fails every write).
final class StoreHealth: Sendable {
    private let degraded = Mutex(false)
    private let events: EventBroadcaster<TokenSyncEvent>
    private let metrics: SyncMetrics
    private let logger: Logger

    init(events: EventBroadcaster<TokenSyncEvent>, metrics: SyncMetrics, logger: Logger) {
        self.events = events
        self.metrics = metrics
        self.logger = logger
    }

    // Each transition is logged and sent under the lock that changes the state: a flight's
    // failed write and the committer's good one can cross, and a report sent after the lock
    // could overtake the one it ends (the last word would be "degraded" of a store that works).
    // Sending only yields to the subscribers' streams; nothing calls back into this lock.

    func writeFailed(_ error: TokenStoreError) {
        metrics.storeWriteFailures.increment()
        degraded.withLock { degraded in
            guard !degraded else { return }
            degraded = true
            logger.error("token store write failed; serving from memory until it works again", metadata: [
                "error": .string(error.description),
            ])
            events.emit(.storeDegraded(error))
        }
    }

    func writeSucceeded() {
        degraded.withLock { degraded in
            guard degraded else { return }
            degraded = false
            logger.notice("token store writes work again")
            events.emit(.storeRecovered)
        }
    }
}
