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

    /// A digest of everything that shapes the fetcher's requests (URL, method, body, headers and
    /// their files' contents, trust and client certificates, proxy), never the values in clear;
    /// nil when the fetcher has none. The engine stores it with each failure: a failure recorded
    /// under another digest holds no backoff, so a fixed configuration is tried at once. Read
    /// before each fetch and when stored failures are loaded: keep it cheap.
    var configurationDigest: String? { get }
}

extension TokenFetcher {
    /// None: failures hold their backoff whatever the configuration (test doubles, embedders'
    /// fetchers that do not describe theirs).
    public var configurationDigest: String? { nil }
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
    /// The JWT's claims when a transport already decoded them (nil: not decoded; a nil inside:
    /// not JWT-shaped), so the engine decodes each token once.
    package var decodedClaims: Result<JWTClaims, TokenValidationError>??

    /// Creates a fetched token.
    public init(value: String, statedExpiry: Date? = nil, providerDate: Date? = nil) {
        self.value = value
        self.statedExpiry = statedExpiry
        self.providerDate = providerDate
    }

    /// Two fetched tokens are equal when their value, stated expiry and provider date are:
    /// whether the claims were decoded yet does not matter.
    public static func == (lhs: FetchedToken, rhs: FetchedToken) -> Bool {
        lhs.value == rhs.value && lhs.statedExpiry == rhs.statedExpiry && lhs.providerDate == rhs.providerDate
    }

    /// `value`'s claims, decoded; nil when it is not JWT-shaped (an opaque token).
    package static func decodeClaims(of value: String) -> Result<JWTClaims, TokenValidationError>? {
        guard JWTClaims.hasJWTShape(value) || value.contains(".") else { return nil }
        do throws(TokenValidationError) { return .success(try JWTClaims.decode(value)) } catch { return .failure(error) }
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
///
/// Check ``code`` against the static values of ``Code`` (`error.code == .httpStatus`); the
/// details of each code are optional properties, set for the codes that have them. Build one
/// with the static functions, e.g. `throw .timeout(seconds: 5)`. A fetcher may throw any of
/// them; ``isRetryable`` and ``retryAfter`` drive the engine's backoff.
public struct TokenProviderError: Error, Sendable, Equatable, CustomStringConvertible {
    /// What went wrong. More codes may come: match them with `==`, keep a `default`.
    public struct Code: Hashable, Sendable, CustomStringConvertible {
        fileprivate enum Value: String, Sendable {
            case unreachable, timeout, httpStatus, notJSON, missingData, bodyTooLarge, invalidToken, other, tlsCertificate
        }

        fileprivate let value: Value

        /// The provider could not be reached (connection refused, DNS, proxy).
        public static let unreachable = Code(value: .unreachable)
        /// The provider did not answer in time.
        public static let timeout = Code(value: .timeout)
        /// The provider answered with a non-2xx HTTP status.
        public static let httpStatus = Code(value: .httpStatus)
        /// The body was not a JSON object.
        public static let notJSON = Code(value: .notJSON)
        /// The JSON lacked the token or expiration field.
        public static let missingData = Code(value: .missingData)
        /// The body was larger than the limit.
        public static let bodyTooLarge = Code(value: .bodyTooLarge)
        /// The token failed validation: ``TokenProviderError/kind`` names the check it failed.
        public static let invalidToken = Code(value: .invalidToken)
        /// A provider-specific failure.
        public static let other = Code(value: .other)
        /// The TLS handshake failed on a certificate.
        public static let tlsCertificate = Code(value: .tlsCertificate)

        /// The code's stable name, e.g. `httpStatus`.
        public var description: String { value.rawValue }
    }

    /// What went wrong.
    public let code: Code
    /// What the transport, parser or fetcher said (``Code/unreachable``, ``Code/notJSON``,
    /// ``Code/other``, ``Code/tlsCertificate``).
    public let detail: String?
    /// How long the fetch waited, in seconds (``Code/timeout``).
    public let timeoutSeconds: Double?
    /// The HTTP status the provider answered (``Code/httpStatus``).
    public let statusCode: Int?
    /// How long the provider asked us to wait (`Retry-After`), if it did (``Code/httpStatus``).
    public let retryAfter: TimeInterval?
    /// The field the answer lacks (``Code/missingData``).
    public let field: String?
    /// The body size limit, in bytes (``Code/bodyTooLarge``).
    public let limitBytes: Int?
    /// Why the token was rejected (``Code/invalidToken``).
    package let validationError: TokenValidationError?

    private init(_ code: Code, detail: String? = nil, timeoutSeconds: Double? = nil, statusCode: Int? = nil,
                 retryAfter: TimeInterval? = nil, field: String? = nil, limitBytes: Int? = nil,
                 validationError: TokenValidationError? = nil) {
        self.code = code
        self.detail = detail
        self.timeoutSeconds = timeoutSeconds
        self.statusCode = statusCode
        self.retryAfter = retryAfter
        self.field = field
        self.limitBytes = limitBytes
        self.validationError = validationError
    }

    /// The provider could not be reached (connection refused, DNS, proxy).
    public static func unreachable(detail: String) -> Self { Self(.unreachable, detail: detail) }
    /// The provider did not answer within `seconds`.
    public static func timeout(seconds: Double) -> Self { Self(.timeout, timeoutSeconds: seconds) }
    /// The provider answered with a non-2xx HTTP status, maybe with a `Retry-After`.
    public static func httpStatus(code: Int, retryAfter: TimeInterval?) -> Self {
        Self(.httpStatus, statusCode: code, retryAfter: retryAfter)
    }
    /// The body was not a JSON object.
    public static func notJSON(detail: String) -> Self { Self(.notJSON, detail: detail) }
    /// The JSON lacked the token or expiration field (the Fleet Engine samples' `missingData`).
    public static func missingData(field: String) -> Self { Self(.missingData, field: field) }
    /// The body was larger than the limit.
    public static func bodyTooLarge(limitBytes: Int) -> Self { Self(.bodyTooLarge, limitBytes: limitBytes) }
    /// The token failed validation (shape, expiry, lifetime, subject).
    package static func invalidToken(_ reason: TokenValidationError) -> Self { Self(.invalidToken, validationError: reason) }
    /// A provider-specific failure.
    public static func other(detail: String) -> Self { Self(.other, detail: detail) }
    /// The TLS handshake failed on a certificate: the provider's is not trusted (or names
    /// another host), or the provider refused ours.
    public static func tlsCertificate(detail: String) -> Self { Self(.tlsCertificate, detail: detail) }

    /// A short, stable name for logs, metrics labels and the store's `last_error_kind`: the
    /// code's name, or for ``Code/invalidToken`` the validation error's kind.
    public var kind: String { validationError?.kind ?? code.description }

    /// False for answers that retrying soon will not change: 4xx other than 408 and 429,
    /// and tokens that fail validation. Those back off from the longer non-retryable base.
    public var isRetryable: Bool {
        switch code.value {
        case .httpStatus:
            let status = statusCode ?? 0
            return !(400..<500).contains(status) || status == 408 || status == 429
        case .invalidToken: return validationError?.code == .noProgress
        case .missingData, .notJSON, .tlsCertificate: return false
        case .unreachable, .timeout, .bodyTooLarge, .other: return true
        }
    }

    /// What happened, for an operator.
    public var description: String {
        switch code.value {
        case .unreachable: "token provider unreachable: \(detail ?? "")"
        case .timeout: "token provider did not answer within \(timeoutSeconds ?? 0) s"
        case .httpStatus:
            "token provider answered HTTP \(statusCode ?? 0)" + (retryAfter.map { " (Retry-After \(Int(min(max($0, 0), 1e9))) s)" } ?? "")
        case .notJSON: "token provider's answer is not a JSON object (\(detail ?? ""))"
        case .missingData:
            "token provider's answer lacks the \"\(field ?? "")\" field (missingData): check the configured token and expiration field names"
        case .bodyTooLarge: "token provider's answer is larger than \(limitBytes ?? 0) bytes"
        case .invalidToken: "token provider returned an unusable token: \(validationError?.description ?? "")"
        case .other: "token provider failed: \(detail ?? "")"
        case .tlsCertificate:
            "TLS certificate problem with the token provider (\(detail ?? "")): trust the CA that signed the provider's certificate, or check the client certificate and its key"
        }
    }
}
