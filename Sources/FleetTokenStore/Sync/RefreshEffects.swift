// Sync layer: the I/O one refresh flight may do, as one protocol, so that what a step may do is
// visible in its type and a test can drive a flight with a recording implementation. The
// engine's implementation is EngineParts' (EngineParts+RefreshEffects.swift).
import Foundation

/// What a ``RefreshFlight`` may do besides deciding: read the clock and the key's state, the
/// store, the fetch slots, the cross-process lease, the provider, and report its outcome. Each
/// requirement is one step of I/O; the rules are ``RefreshDecision``'s and ``RefreshMachine``'s.
protocol RefreshEffects: Sendable {
    /// The policy the flight's decisions follow.
    var policy: RefreshPolicy { get }

    // MARK: Clock and memory

    /// The time now, local and provider-corrected.
    var moment: RefreshMoment { get }
    /// A number in 0...1 (backoff jitter).
    func jitter() -> Double
    /// Whether the engine is shutting down: a flight ends at its next step.
    var isShuttingDown: Bool { get }
    /// What memory holds of `key` now.
    func held(_ key: TokenKey) -> MemoryEntry?
    /// The flight of `key` reached `phase` (kept with the key's state).
    func flightReached(_ key: TokenKey, _ phase: RefreshDecision.State)
    /// A caller is handed `key`'s token: record the use.
    func markUsed(_ key: TokenKey)

    // MARK: The store

    /// Reads the stored entries of `keys` that memory holds nothing of into memory.
    func load(_ keys: [TokenKey]) async
    /// The key's stored entry as the engine may use it (nil when absent or unreadable).
    func readStoredEntry(_ key: TokenKey) async -> TokenEntry?
    /// Installs another process's `token` when the key's state lets it in; returns whether it did.
    @discardableResult
    func adoptIfNewer(_ token: StoredToken, failure: RefreshFailureState?) -> Bool

    // MARK: Fetch slots

    /// Waits for one of the engine's fetch slots; false when `served` became true meanwhile.
    func acquireFetchSlot(for key: TokenKey, unless served: () -> Bool) async -> Bool
    /// Gives a fetch slot back.
    func releaseFetchSlot()

    // MARK: The cross-process lease

    /// Asks for `key`'s lease; the entry read with it is as the engine may use it.
    func takeLease(_ key: TokenKey) async -> CrossProcessLease.Answer
    /// Takes `key`'s lease over from a dead holder of this machine, if it still holds it.
    func takeOverLease(_ key: TokenKey, from deadHolder: String) async -> CrossProcessLease.Answer
    /// Waits at most `seconds` for the change feed to mention `key`; returns whether it did.
    func waitForHolder(of key: TokenKey, seconds: TimeInterval) async -> Bool
    /// Releases `key`'s lease.
    func releaseLease(_ key: TokenKey) async

    // MARK: The provider

    /// Fetches `key`'s token (renewing its lease) and validates it against `previous`.
    func fetch(_ key: TokenKey, previous: StoredToken?) async -> FetchResult

    // MARK: Outcomes

    /// Installs, persists and reports the refreshed `token` (the lease goes with its commit);
    /// returns it as handed out.
    func accept(_ token: StoredToken, for key: TokenKey, markUsed: Bool) -> StoredToken
    /// Records `failure` in memory and the store, reports it, then releases the lease.
    func backOff(_ key: TokenKey, failure: RefreshFailureState, error: TokenProviderError) async
    /// Records in memory a failure another process stored (its backoff runs).
    func recordFailure(_ key: TokenKey, failure: RefreshFailureState, error: TokenProviderError)
    /// Schedules `key`'s next proactive refresh.
    func scheduleNextRefresh(_ key: TokenKey)
}

/// What a fetch came to.
enum FetchResult: Sendable, Equatable {
    /// The provider's token, validated.
    case fetched(StoredToken)
    /// The provider failed, or its token failed validation, under the provider configuration
    /// `configurationDigest` (read before the request).
    case failed(TokenProviderError, configurationDigest: String?)
    /// The engine shut down (or the flight was cancelled) while the fetch ran.
    case interrupted
}
