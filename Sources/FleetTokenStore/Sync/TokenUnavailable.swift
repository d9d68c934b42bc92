// Sync layer: the error of a token request the engine could not serve.

public import Foundation

/// ``TokenSyncEngine/token(for:)`` could not hand out a token: there is none, or the one held is
/// too close to expiry, and getting a new one failed or is not due yet.
public struct TokenUnavailable: Error, Sendable, Equatable, CustomStringConvertible {
    /// Why no token could be had: check ``code`` (`reason.code == .provider`), then the error
    /// it carries. More codes may come: match them with `==`, keep a `default`.
    public struct Reason: Sendable, Equatable, CustomStringConvertible {
        /// Where the failure came from.
        public struct Code: Hashable, Sendable, CustomStringConvertible {
            fileprivate enum Value: String, Sendable { case provider, store, shuttingDown }

            fileprivate let value: Value

            /// The token provider: ``Reason/providerError`` says what it answered.
            public static let provider = Code(value: .provider)
            /// The store: ``Reason/storeError`` says what failed.
            public static let store = Code(value: .store)
            /// The engine is shutting down.
            public static let shuttingDown = Code(value: .shuttingDown)

            /// The code's name, e.g. `provider`.
            public var description: String { value.rawValue }
        }

        /// Where the failure came from.
        public let code: Code
        /// The provider's last answer (``Code/provider``), possibly from an earlier attempt
        /// when in backoff.
        public let providerError: TokenProviderError?
        /// What the store said (``Code/store``).
        public let storeError: TokenStoreError?

        private init(_ code: Code, providerError: TokenProviderError? = nil, storeError: TokenStoreError? = nil) {
            self.code = code
            self.providerError = providerError
            self.storeError = storeError
        }

        /// The provider's last answer (possibly from an earlier attempt, when in backoff).
        package static func provider(_ error: TokenProviderError) -> Self { Self(.provider, providerError: error) }
        /// The store failed and no token is held in memory.
        package static func store(_ error: TokenStoreError) -> Self { Self(.store, storeError: error) }
        /// The engine is shutting down.
        package static let shuttingDown = Self(.shuttingDown)

        /// The cause, for an operator: the provider's or store's message, or the shutdown.
        public var description: String {
            switch code.value {
            case .provider: providerError?.description ?? "token provider failed"
            case .store: storeError?.description ?? "token store failed"
            case .shuttingDown: "the token engine is shutting down"
            }
        }
    }

    /// The key asked for.
    public let key: TokenKey
    /// Why it failed.
    public let reason: Reason
    /// When the engine will try the provider again, if an attempt is scheduled.
    public let nextAttemptAt: Date?

    /// Creates the error.
    package init(key: TokenKey, reason: Reason, nextAttemptAt: Date?) {
        self.key = key
        self.reason = reason
        self.nextAttemptAt = nextAttemptAt
    }

    /// What happened and when it will be retried.
    public var description: String {
        let retry = nextAttemptAt.map { "; next attempt at \($0.formatted(.iso8601))" } ?? ""
        return "no usable token for \(key): \(reason)\(retry)"
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
    /// A new token is held (and, for `.provider`, committed to the store): when it arrives,
    /// memory already holds this token, or what replaced it since (a newer token, an
    /// invalidation, an idle eviction).
    case refreshed(key: TokenKey, fingerprint: TokenFingerprint, expiresAt: Date, source: TokenSource)
    /// A refresh failed; the next attempt is due at `nextAttemptAt`.
    case refreshFailed(key: TokenKey, error: TokenProviderError, consecutiveFailures: Int, nextAttemptAt: Date)
    /// Another process removed the key's token (e.g. `tokenctl purge`).
    case removedExternally(key: TokenKey)
    /// Writing to the store failed; tokens keep being served from memory. It and
    /// ``storeRecovered`` alternate, in the order the store's state changed, so the last of
    /// them a subscriber saw tells the state now.
    case storeDegraded(TokenStoreError)
    /// Writing to the store works again after a failure.
    case storeRecovered
}
