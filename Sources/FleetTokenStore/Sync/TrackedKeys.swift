// Sync layer: the tracked keys as one value with a generation, readable without waiting for
// the engine's actor (for edges that follow tracking, such as the file sink).

/// The keys an engine keeps fresh proactively (``TokenSyncEngine/track(_:)``) at one moment,
/// with a number that changes whenever they do: a reader that remembers ``generation`` needs to
/// look at ``keys`` again only after it changed.
public struct TrackedKeys: Sendable, Equatable {
    /// The tracked keys.
    public let keys: Set<TokenKey>
    /// Starts at 0 and grows by one with each ``TokenSyncEngine/track(_:)`` or
    /// ``TokenSyncEngine/untrack(_:)`` that changed ``keys``.
    public let generation: UInt64

    /// No keys, generation 0.
    package init() {
        keys = []
        generation = 0
    }

    init(keys: Set<TokenKey>, generation: UInt64) {
        self.keys = keys
        self.generation = generation
    }
}
