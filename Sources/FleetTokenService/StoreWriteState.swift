// Service layer: whether the store takes writes, as the engine's events last said, for the
// token API's readiness check.

public import FleetTokenStore
import Synchronization

/// Whether the store can be written, as the engine's events last said. Shared by the API's
/// readiness check and the service that follows the events.
public final class StoreHealth: Sendable {
    private let state = Mutex<String?>(nil)

    /// A healthy store.
    public init() {}

    /// The last write failure, or nil when writes work.
    public var problem: String? { state.withLock { $0 } }

    /// Records the engine's store events.
    public func record(_ event: TokenSyncEvent) {
        switch event {
        case .storeDegraded(let error): state.withLock { $0 = error.description }
        case .storeRecovered: state.withLock { $0 = nil }
        default: break
        }
    }
}
