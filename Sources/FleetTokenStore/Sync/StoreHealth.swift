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

    func writeFailed(_ error: TokenStoreError) {
        metrics.storeWriteFailures.increment()
        guard !degraded.withLock({ was in defer { was = true }; return was }) else { return }
        logger.error("token store write failed; serving from memory until it works again", metadata: [
            "error": .string(error.description),
        ])
        events.emit(.storeDegraded(error))
    }

    func writeSucceeded() {
        guard degraded.withLock({ was in defer { was = false }; return was }) else { return }
        logger.notice("token store writes work again")
        events.emit(.storeRecovered)
    }
}
