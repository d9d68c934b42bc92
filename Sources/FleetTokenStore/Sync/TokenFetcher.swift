// Provider layer: the fetcher protocol the engine gets tokens through, what a provider answered,
// and why it gave no token.

public import Foundation

/// Gets a token for a key from the customer's token provider (an HTTPS endpoint, a development
/// issuer, a test double). The engine validates whatever it returns.
///
/// Implementations must be safe to call concurrently for different keys; the engine never
/// runs two fetches for one key at once.
public protocol TokenFetcher: Sendable {
    /// Fetches a token for `key`.
    /// - Throws: ``TokenProviderError`` describing why the provider gave no token; its
    ///   ``TokenProviderError/isRetryable`` and ``TokenProviderError/retryAfter`` drive backoff.
    func fetchToken(for key: TokenKey) async throws(TokenProviderError) -> FetchedToken
}

/// What a provider answered: the token and what it said about its expiry.
public struct FetchedToken: Sendable, Equatable {
    /// The raw token, normally a JWT.
    public var value: String
    /// The expiry the provider stated (its `TOKEN_EXPIRATION` field, already converted to an
    /// absolute time), if any. The engine uses the earlier of this and the JWT `exp`.
    public var statedExpiry: Date?
    /// The provider's clock at answer time (its HTTP `Date` header), used to detect clock skew.
    public var providerDate: Date?

    /// Creates a fetched token.
    public init(value: String, statedExpiry: Date? = nil, providerDate: Date? = nil) {
        self.value = value
        self.statedExpiry = statedExpiry
        self.providerDate = providerDate
    }
}

extension FetchedToken: CustomStringConvertible, CustomReflectable {
    /// Redacted: the token's fingerprint and the stated expiry.
    public var description: String {
        "fetched token \(TokenFingerprint(of: value))" + (statedExpiry.map { " expiring \($0.formatted(.iso8601))" } ?? "")
    }

    /// A mirror without the token value.
    public var customMirror: Mirror {
        Mirror(self, children: ["fingerprint": TokenFingerprint(of: value), "statedExpiry": statedExpiry as Any,
                                "providerDate": providerDate as Any])
    }
}

/// Why a fetch produced no usable token. Messages never include a token value.
public enum TokenProviderError: Error, Sendable, Equatable, CustomStringConvertible {
    /// The provider could not be reached (connection refused, DNS, TLS).
    case unreachable(detail: String)
    /// The provider did not answer in time.
    case timeout(seconds: Double)
    /// The provider answered with a non-2xx HTTP status, maybe with a `Retry-After`.
    case httpStatus(code: Int, retryAfter: TimeInterval?)
    /// The body was not a JSON object.
    case notJSON(detail: String)
    /// The JSON lacked the token or expiration field (the Fleet Engine samples' `missingData`).
    case missingData(field: String)
    /// The body was larger than the limit.
    case bodyTooLarge(limitBytes: Int)
    /// The token failed validation (shape, expiry, lifetime, subject).
    case invalidToken(TokenValidationError)
    /// A provider-specific failure.
    case other(detail: String)
    /// The TLS handshake failed on a certificate: the provider's is not trusted (or names
    /// another host), or the provider refused ours.
    case tlsCertificate(detail: String)

    /// A short, stable name for logs, metrics labels and the store's `last_error_kind`.
    public var kind: String {
        switch self {
        case .unreachable: "unreachable"
        case .timeout: "timeout"
        case .httpStatus: "httpStatus"
        case .notJSON: "notJSON"
        case .missingData: "missingData"
        case .bodyTooLarge: "bodyTooLarge"
        case .invalidToken(let reason): reason.kind
        case .other: "other"
        case .tlsCertificate: "tlsCertificate"
        }
    }

    /// False for answers that retrying soon will not change: 4xx other than 408 and 429,
    /// and tokens that fail validation. Those back off from the longer non-retryable base.
    public var isRetryable: Bool {
        switch self {
        case .httpStatus(let code, _): !(400..<500).contains(code) || code == 408 || code == 429
        case .invalidToken(.noProgress): true
        case .invalidToken, .missingData, .notJSON, .tlsCertificate: false
        case .unreachable, .timeout, .bodyTooLarge, .other: true
        }
    }

    /// How long the provider asked us to wait (`Retry-After`), if it did.
    public var retryAfter: TimeInterval? {
        if case .httpStatus(_, let retryAfter) = self { return retryAfter }
        return nil
    }

    /// What happened, for an operator.
    public var description: String {
        switch self {
        case .unreachable(let detail): "token provider unreachable: \(detail)"
        case .timeout(let seconds): "token provider did not answer within \(seconds) s"
        case .httpStatus(let code, let retryAfter):
            "token provider answered HTTP \(code)" + (retryAfter.map { " (Retry-After \(Int(min(max($0, 0), 1e9))) s)" } ?? "")
        case .notJSON(let detail): "token provider's answer is not a JSON object (\(detail))"
        case .missingData(let field): "token provider's answer lacks the \"\(field)\" field (missingData): check --token-key / --expiration-key"
        case .bodyTooLarge(let limit): "token provider's answer is larger than \(limit) bytes"
        case .invalidToken(let reason): "token provider returned an unusable token: \(reason)"
        case .other(let detail): "token provider failed: \(detail)"
        case .tlsCertificate(let detail):
            "TLS certificate problem with the token provider (\(detail)): trust the CA that signed its certificate (token-agent --ca-file or --extra-ca-file), or check the client certificate (--client-cert, --client-key)"
        }
    }
}
