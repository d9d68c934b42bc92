// Test kit layer: InMemoryStorage, what every view of one in-memory store shares (as processes
// share a store file): the stored state behind a lock, and the change feed.

import FleetTokenStore
import Synchronization

final class InMemoryStorage: Sendable {
    let state = Mutex(InMemoryStoreState())
    let feed = InMemoryChangeFeed()
    private let lastViewID = Mutex<UInt64>(0)

    func newViewID() -> UInt64 {
        lastViewID.withLock { id in
            id += 1
            return id
        }
    }
}
