// Model layer: a token as the store keeps it, and a key's refresh-failure state: what the engine
// needs to resume after a restart.

public import Foundation
import Synchronization

/// A token as the store keeps it: the value and the times the sync engine needs to resume.
///
/// `description` never includes the token value: it shows the fingerprint.
public struct StoredToken: Sendable, Equatable, CustomStringConvertible {
    /// The fields as plain values; equality is every field's.
    @usableFromInline
    struct Values: Sendable, Equatable {
        @usableFromInline var key: TokenKey
        @usableFromInline var value: String
        @usableFromInline var expiresAt: Date
        @usableFromInline var issuedAt: Date?
        @usableFromInline var fetchedAt: Date
        @usableFromInline var lastUsedAt: Date?
    }

    /// The fields, in one immutable box: copying a token (every hit hands one out) is one
    /// retain and dropping it one release, as for a plain `String`, where the fields inline
    /// cost a retain and release of each string and an outlined copy of the whole value
    /// (profiled with callgrind). A change replaces the box; tokens are rarely changed.
    @usableFromInline
    final class Fields: Sendable {
        @usableFromInline let values: Values
        /// The value's fingerprint once computed (``TokenFingerprint/digestPrefix(of:)`` with
        /// the top bit set), else 0: every token answer and sealed write of the token shows
        /// it, and hashing the value each time was a share of both (profiled).
        let fingerprintCache: Atomic<UInt64>

        init(_ values: Values, fingerprintCache: UInt64 = 0) {
            self.values = values
            self.fingerprintCache = Atomic(fingerprintCache)
        }
    }

    @usableFromInline var fields: Fields

    /// Replaces the box with one holding the values `edit` changed; the fingerprint found so far
    /// stays while the token value does.
    @usableFromInline
    mutating func change(_ edit: (inout Values) -> Void) {
        var values = fields.values
        edit(&values)
        let fingerprint = values.value == fields.values.value ? fields.fingerprintCache.load(ordering: .relaxed) : 0
        fields = Fields(values, fingerprintCache: fingerprint)
    }

    /// Which subject the token is for.
    @inlinable public var key: TokenKey {
        get { fields.values.key }
        set { change { $0.key = newValue } }
    }
    /// The raw token (a JWT). Never log it; use ``fingerprint``.
    @inlinable public var value: String {
        get { fields.values.value }
        set { change { $0.value = newValue } }
    }
    /// When the token stops being valid: the earlier of the provider's stated expiry and the JWT `exp`.
    @inlinable public var expiresAt: Date {
        get { fields.values.expiresAt }
        set { change { $0.expiresAt = newValue } }
    }
    /// The JWT `iat`, when the token has one.
    @inlinable public var issuedAt: Date? {
        get { fields.values.issuedAt }
        set { change { $0.issuedAt = newValue } }
    }
    /// When it was received from the provider, by the receiving host's wall clock. (The engine
    /// stamps a token without `iat` with the provider-corrected time instead: its lifetime is
    /// measured from this.) With `iat`, the two show after a restart how far ahead the
    /// provider's clock at least was.
    @inlinable public var fetchedAt: Date {
        get { fields.values.fetchedAt }
        set { change { $0.fetchedAt = newValue } }
    }
    /// When a caller last asked for it, if recorded.
    @inlinable public var lastUsedAt: Date? {
        get { fields.values.lastUsedAt }
        set { change { $0.lastUsedAt = newValue } }
    }

    /// Creates a stored token.
    public init(key: TokenKey, value: String, expiresAt: Date, issuedAt: Date? = nil,
                fetchedAt: Date, lastUsedAt: Date? = nil) {
        fields = Fields(Values(key: key, value: value, expiresAt: expiresAt, issuedAt: issuedAt, fetchedAt: fetchedAt,
                               lastUsedAt: lastUsedAt))
    }

    /// Tokens are equal when every field is.
    public static func == (lhs: StoredToken, rhs: StoredToken) -> Bool {
        lhs.fields === rhs.fields || lhs.fields.values == rhs.fields.values
    }

    /// The token's fingerprint, safe to show. Hashed once per value and kept with it.
    public var fingerprint: TokenFingerprint {
        let cached = fields.fingerprintCache.load(ordering: .relaxed)
        if cached != 0 { return TokenFingerprint(digestPrefix: cached & ~Self.computed) }
        // Two threads may both hash a new value; they store the same word.
        let prefix = TokenFingerprint.digestPrefix(of: value)
        fields.fingerprintCache.store(prefix | Self.computed, ordering: .relaxed)
        return TokenFingerprint(digestPrefix: prefix)
    }

    /// The flag that tells a computed fingerprint from none in ``Fields/fingerprintCache``.
    private static let computed: UInt64 = 1 << 63

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
