// Service layer: whether the store takes writes, as the engine's events last said, for the
// token API's readiness check.

import FleetTokenStore
import Synchronization

/// The store's last write problem, as the engine's `storeDegraded` and `storeRecovered` events
/// said: what `/readyz` reports. The engine decides when the store is degraded (its own
/// `StoreHealth`); this only remembers the last word, for the API.
final class StoreWriteState: Sendable {
    private let state = Mutex<String?>(nil)

    /// A store that takes writes.
    init() {}

    /// The last write failure, or nil when writes work.
    var problem: String? { state.withLock { $0 } }

    /// Records the engine's store events.
    func record(_ event: TokenSyncEvent) {
        switch event {
        case .storeDegraded(let error): state.withLock { $0 = error.description }
        case .storeRecovered: state.withLock { $0 = nil }
        default: break
        }
    }
}
