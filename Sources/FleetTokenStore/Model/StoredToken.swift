// Model layer: a token as the store keeps it, and a key's refresh-failure state: what the engine
// needs to resume after a restart.

public import Foundation

/// A token as the store keeps it: the value and the times the sync engine needs to resume.
///
/// `description` never includes the token value: it shows the fingerprint.
public struct StoredToken: Sendable, Equatable, CustomStringConvertible {
    /// Which subject the token is for.
    public var key: TokenKey
    /// The raw token (a JWT). Never log it; use ``fingerprint``.
    public var value: String
    /// When the token stops being valid: the earlier of the provider's stated expiry and the JWT `exp`.
    public var expiresAt: Date
    /// The JWT `iat`, when the token has one.
    public var issuedAt: Date?
    /// When it was received from the provider, by the receiving host's wall clock. (The engine
    /// stamps a token without `iat` with the provider-corrected time instead: its lifetime is
    /// measured from this.) With `iat`, the two show after a restart how far ahead the
    /// provider's clock at least was.
    public var fetchedAt: Date
    /// When a caller last asked for it, if recorded.
    public var lastUsedAt: Date?

    /// Creates a stored token.
    public init(key: TokenKey, value: String, expiresAt: Date, issuedAt: Date? = nil,
                fetchedAt: Date, lastUsedAt: Date? = nil) {
        self.key = key
        self.value = value
        self.expiresAt = expiresAt
        self.issuedAt = issuedAt
        self.fetchedAt = fetchedAt
        self.lastUsedAt = lastUsedAt
    }

    /// The token's fingerprint, safe to show.
    public var fingerprint: TokenFingerprint { TokenFingerprint(of: value) }

    /// Seconds from issue (or fetch, without `iat`) to expiry; the base of the refresh rules.
    public var lifetime: TimeInterval {
        max(0, expiresAt.timeIntervalSince(issuedAt ?? fetchedAt))
    }

    /// A redacted description: key, fingerprint and expiry.
    public var description: String {
        "\(key) token \(fingerprint) expiring \(expiresAt.formatted(.iso8601))"
    }
}

extension StoredToken: CustomReflectable {
    /// A mirror without the token value (so `dump` and debuggers print the fingerprint).
    public var customMirror: Mirror {
        Mirror(self, children: [
            "key": key, "fingerprint": fingerprint, "expiresAt": expiresAt, "issuedAt": issuedAt as Any,
            "fetchedAt": fetchedAt, "lastUsedAt": lastUsedAt as Any,
        ])
    }
}

/// Why refreshing a key failed, and when to try again: persisted so that restarts and crash
/// loops honour the backoff.
public struct RefreshFailureState: Sendable, Equatable {
    /// Failures in a row since the last success.
    public var consecutiveFailures: Int
    /// No fetch for this key before this time.
    public var nextAttemptAt: Date
    /// A short machine-readable kind, e.g. `httpStatus`, `timeout`, `subjectMismatch`.
    public var lastErrorKind: String
    /// The operator-readable message of the last error (never contains a token).
    public var lastErrorMessage: String?
    /// When the last failure happened.
    public var lastFailureAt: Date
    /// The digest of the provider configuration the failing attempt used
    /// (``TokenFetcher/configurationDigest``), nil when the fetcher gives none. A failure of
    /// another configuration holds no backoff: a fixed configuration is tried at once.
    public var configurationDigest: String?

    /// Creates a failure state.
    public init(consecutiveFailures: Int, nextAttemptAt: Date, lastErrorKind: String,
                lastErrorMessage: String? = nil, lastFailureAt: Date, configurationDigest: String? = nil) {
        self.consecutiveFailures = consecutiveFailures
        self.nextAttemptAt = nextAttemptAt
        self.lastErrorKind = lastErrorKind
        self.lastErrorMessage = lastErrorMessage
        self.lastFailureAt = lastFailureAt
        self.configurationDigest = configurationDigest
    }
}

/// Everything the store holds for one key: a token, a failure state, or both.
public struct TokenEntry: Sendable, Equatable {
    /// The key.
    public var key: TokenKey
    /// The current token, if one was ever fetched and not purged.
    public var token: StoredToken?
    /// The refresh failure state, if the last refresh failed.
    public var failure: RefreshFailureState?
    /// The store holds a token value this process cannot read (sealed with a key it lacks, or
    /// not sealed in an encrypted store): ``token`` is nil, yet nothing was removed, so an
    /// engine keeps the token it holds instead of treating this as a purge. Not part of
    /// equality: it says how the entry was read, not what it holds.
    var tokenUnreadable = false

    /// Entries are equal when key, token and failure state are.
    public static func == (lhs: TokenEntry, rhs: TokenEntry) -> Bool {
        lhs.key == rhs.key && lhs.token == rhs.token && lhs.failure == rhs.failure
    }

    /// Creates an entry.
    public init(key: TokenKey, token: StoredToken?, failure: RefreshFailureState?) {
        self.key = key
        self.token = token
        self.failure = failure
    }

    /// The entry's status at `now` under `policy`'s soft point (without jitter).
    public func status(at now: Date, policy: RefreshPolicy = RefreshPolicy()) -> TokenStatus {
        TokenStatus(token: token, failure: failure, at: now, policy: policy)
    }
}
