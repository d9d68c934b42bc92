// Sync layer: the error of a token request the engine could not serve.

public import Foundation

/// ``TokenSyncEngine/token(for:)`` could not hand out a token: there is none, or the one held is
/// too close to expiry, and getting a new one failed or is not due yet.
public struct TokenUnavailable: Error, Sendable, Equatable, CustomStringConvertible {
    /// Why no token could be had.
    public enum Reason: Sendable, Equatable {
        /// The provider's last answer (possibly from an earlier attempt, when in backoff).
        case provider(TokenProviderError)
        /// The store failed and no token is held in memory.
        case store(TokenStoreError)
        /// The engine is shutting down.
        case shuttingDown
    }

    /// The key asked for.
    public let key: TokenKey
    /// Why it failed.
    public let reason: Reason
    /// When the engine will try the provider again, if an attempt is scheduled.
    public let nextAttemptAt: Date?

    /// Creates the error.
    public init(key: TokenKey, reason: Reason, nextAttemptAt: Date?) {
        self.key = key
        self.reason = reason
        self.nextAttemptAt = nextAttemptAt
    }

    /// What happened and when it will be retried.
    public var description: String {
        let cause: String
        switch reason {
        case .provider(let error): cause = error.description
        case .store(let error): cause = error.description
        case .shuttingDown: cause = "the token engine is shutting down"
        }
        let retry = nextAttemptAt.map { "; next attempt at \($0.formatted(.iso8601))" } ?? ""
        return "no usable token for \(key): \(cause)\(retry)"
    }
}

/// Where a served token came from.
public enum TokenSource: String, Sendable, Equatable, Codable {
    /// Read from the store (kept from before a restart, or loaded on first use).
    case store
    /// Fetched from the provider by this process.
    case provider
    /// Written to the store by another process sharing it.
    case otherProcess = "other_process"
}

/// Something the engine did, for agents that report progress (``TokenSyncEngine/events()``).
/// Carries fingerprints, never token values.
public enum TokenSyncEvent: Sendable, Equatable {
    /// A new token is held (and, for `.provider`, committed to the store).
    case refreshed(key: TokenKey, fingerprint: TokenFingerprint, expiresAt: Date, source: TokenSource)
    /// A refresh failed; the next attempt is due at `nextAttemptAt`.
    case refreshFailed(key: TokenKey, error: TokenProviderError, consecutiveFailures: Int, nextAttemptAt: Date)
    /// Another process removed the key's token (e.g. `tokenctl purge`).
    case removedExternally(key: TokenKey)
    /// Writing to the store failed; tokens keep being served from memory.
    case storeDegraded(TokenStoreError)
    /// Writing to the store works again after a failure.
    case storeRecovered
}
