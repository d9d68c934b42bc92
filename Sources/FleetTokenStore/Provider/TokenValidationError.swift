// Provider layer: why the validator rejected a fetched token. A struct with a code, so that a
// new rule can add a code without breaking users' exhaustive switches.
package import Foundation

/// Why a fetched token was rejected. A rejected token is never stored or handed out.
///
/// Check ``code`` against the static values of ``Code`` (`error.code == .expired`); the details
/// of each code are optional properties, set for the codes that have them. Build one with the
/// static functions, e.g. `.expired(expiresAt:)`. Never carries a token value.
package struct TokenValidationError: Error, Sendable, Equatable, CustomStringConvertible {
    /// What rule the token broke. More codes may come: match them with `==`, keep a `default`.
    package struct Code: Hashable, Sendable, CustomStringConvertible {
        fileprivate enum Value: String, Sendable {
            case malformed, undecodablePayload, missingExpiry, expired, lifetimeTooLong, issuedInFuture
            case subjectMismatch, opaqueNotAllowed, noProgress, missingIssuedAt, missingAuthorization
        }

        fileprivate let value: Value

        /// Not three base64url segments.
        package static let malformed = Code(value: .malformed)
        /// The payload is not a JSON object.
        package static let undecodablePayload = Code(value: .undecodablePayload)
        /// No `exp` claim and no expiry stated by the provider.
        package static let missingExpiry = Code(value: .missingExpiry)
        /// Already expired, or with less than the floor left, when received.
        package static let expired = Code(value: .expired)
        /// `exp` is further after `iat` than the allowed lifetime.
        package static let lifetimeTooLong = Code(value: .lifetimeTooLong)
        /// `iat` is in the future beyond the tolerance.
        package static let issuedInFuture = Code(value: .issuedInFuture)
        /// The `authorization` claim names another subject.
        package static let subjectMismatch = Code(value: .subjectMismatch)
        /// Not a JWT, and opaque tokens are not allowed.
        package static let opaqueNotAllowed = Code(value: .opaqueNotAllowed)
        /// The token expires no later than the one already held.
        package static let noProgress = Code(value: .noProgress)
        /// A JWT without `iat`.
        package static let missingIssuedAt = Code(value: .missingIssuedAt)
        /// A JWT without the `authorization` claim.
        package static let missingAuthorization = Code(value: .missingAuthorization)

        /// The code's stable name, the same as ``TokenValidationError/kind``.
        package var description: String { value.rawValue }
    }

    /// What rule the token broke.
    package let code: Code
    /// What is wrong with the token's shape (``Code/malformed``); never the token itself.
    package let detail: String?
    /// The token's expiry (``Code/expired``), or that of the token already held
    /// (``Code/noProgress``).
    package let expiresAt: Date?
    /// `exp − iat` in seconds (``Code/lifetimeTooLong``).
    package let lifetime: TimeInterval?
    /// The longest lifetime accepted, in seconds (``Code/lifetimeTooLong``).
    package let lifetimeLimit: TimeInterval?
    /// The token's `iat` (``Code/issuedInFuture``).
    package let issuedAt: Date?
    /// The subject id asked for (``Code/subjectMismatch``).
    package let expectedSubject: String?
    /// The member of the `authorization` claim that names the subject, e.g. `vehicleid`
    /// (``Code/subjectMismatch``, ``Code/missingAuthorization``).
    package let claim: String?
    /// The subject id the token names instead (``Code/subjectMismatch``).
    package let foundSubject: String?

    private init(_ code: Code, detail: String? = nil, expiresAt: Date? = nil, lifetime: TimeInterval? = nil,
                 lifetimeLimit: TimeInterval? = nil, issuedAt: Date? = nil, expectedSubject: String? = nil,
                 claim: String? = nil, foundSubject: String? = nil) {
        self.code = code
        self.detail = detail
        self.expiresAt = expiresAt
        self.lifetime = lifetime
        self.lifetimeLimit = lifetimeLimit
        self.issuedAt = issuedAt
        self.expectedSubject = expectedSubject
        self.claim = claim
        self.foundSubject = foundSubject
    }

    /// Not three base64url segments; `detail` says which part failed.
    package static func malformed(detail: String) -> Self { Self(.malformed, detail: detail) }
    /// The payload is not a JSON object.
    package static let undecodablePayload = Self(.undecodablePayload)
    /// No `exp` claim and no expiry stated by the provider.
    package static let missingExpiry = Self(.missingExpiry)
    /// The token is already expired (or has less than the floor left) when received.
    package static func expired(expiresAt: Date) -> Self { Self(.expired, expiresAt: expiresAt) }
    /// `exp` is more than the allowed lifetime after `iat` (Fleet Engine rejects over one hour).
    package static func lifetimeTooLong(seconds: TimeInterval, limit: TimeInterval) -> Self {
        Self(.lifetimeTooLong, lifetime: seconds, lifetimeLimit: limit)
    }
    /// `iat` is in the future beyond the tolerance.
    package static func issuedInFuture(issuedAt: Date) -> Self { Self(.issuedInFuture, issuedAt: issuedAt) }
    /// The `authorization` claim names another subject.
    package static func subjectMismatch(expected: String, claim: String, found: String) -> Self {
        Self(.subjectMismatch, expectedSubject: expected, claim: claim, foundSubject: found)
    }
    /// A token that is not a JWT, and opaque tokens are not allowed.
    package static let opaqueNotAllowed = Self(.opaqueNotAllowed)
    /// The provider returned a token that expires no later than the one already held.
    package static func noProgress(expiresAt: Date) -> Self { Self(.noProgress, expiresAt: expiresAt) }
    /// A JWT without `iat` (absent or null): its lifetime cannot be checked, and refreshing
    /// by it could wait for weeks. Allowed only with ``RefreshPolicy/allowOpaqueTokens``.
    package static let missingIssuedAt = Self(.missingIssuedAt)
    /// A JWT without the private `authorization` claim that names what Fleet Engine lets it act
    /// on (`claim`, e.g. `vehicleid`). Allowed only with ``RefreshPolicy/allowOpaqueTokens``.
    package static func missingAuthorization(claim: String) -> Self { Self(.missingAuthorization, claim: claim) }

    /// A short, stable name for logs, metrics and the store.
    package var kind: String { code.description }

    /// What is wrong, for an operator.
    package var description: String {
        switch code.value {
        case .malformed: "not a JWT (\(detail ?? ""))"
        case .undecodablePayload: "the JWT payload is not a JSON object"
        case .missingExpiry: "neither the JWT nor the provider gives an expiry"
        case .expired: "it expired at \(Self.iso(expiresAt)) (or is too close to expiry to use)"
        case .lifetimeTooLong:
            "exp is \(Self.seconds(lifetime)) s after iat, more than the \(Self.seconds(lifetimeLimit)) s Fleet Engine accepts"
        case .issuedInFuture: "iat \(Self.iso(issuedAt)) is in the future: check the provider's clock"
        case .subjectMismatch:
            "its authorization.\(claim ?? "") is \"\(foundSubject ?? "")\", not the requested \"\(expectedSubject ?? "")\""
        case .opaqueNotAllowed: "it is not a JWT and opaque tokens are not enabled"
        case .noProgress: "it expires no later than the token already held (\(Self.iso(expiresAt))): the provider is caching"
        case .missingIssuedAt:
            "the JWT has no iat claim, so its lifetime cannot be checked: fix the provider, or allow opaque tokens to accept it"
        case .missingAuthorization:
            "the JWT has no authorization claim (expected authorization.\(claim ?? "")): fix the provider, or allow opaque tokens to accept it"
        }
    }

    private static func iso(_ date: Date?) -> String { date?.formatted(.iso8601) ?? "?" }

    /// Whole seconds; a value beyond `Int`'s range (a provider's absurd `exp`) is printed as it
    /// is rather than trapping in the conversion.
    private static func seconds(_ value: Double?) -> String {
        guard let value else { return "?" }
        return Int(exactly: value.rounded(.towardZero)).map(String.init) ?? String(value)
    }
}
