public import Foundation

/// Why a fetched token was rejected. A rejected token is never stored or handed out.
public enum TokenValidationError: Error, Sendable, Equatable, CustomStringConvertible {
    /// Not three base64url segments.
    case malformed(detail: String)
    /// The payload is not a JSON object.
    case undecodablePayload
    /// No `exp` claim and no expiry stated by the provider.
    case missingExpiry
    /// The token is already expired (or has less than the floor left) when received.
    case expired(expiresAt: Date)
    /// `exp` is more than the allowed lifetime after `iat` (Fleet Engine rejects over one hour).
    case lifetimeTooLong(seconds: TimeInterval, limit: TimeInterval)
    /// `iat` is in the future beyond the tolerance.
    case issuedInFuture(issuedAt: Date)
    /// The `authorization` claim names another subject.
    case subjectMismatch(expected: String, claim: String, found: String)
    /// A token that is not a JWT, and opaque tokens are not allowed.
    case opaqueNotAllowed
    /// The provider returned a token that expires no later than the one already held.
    case noProgress(expiresAt: Date)
    /// A JWT without `iat` (absent or null): its lifetime cannot be checked, and refreshing
    /// by it could wait for weeks. Allowed only with ``RefreshPolicy/allowOpaqueTokens``.
    case missingIssuedAt
    /// A JWT without the private `authorization` claim that names what Fleet Engine lets it act
    /// on (`claim`, e.g. `vehicleid`). Allowed only with ``RefreshPolicy/allowOpaqueTokens``.
    case missingAuthorization(claim: String)

    /// A short, stable name for logs, metrics and the store.
    public var kind: String {
        switch self {
        case .malformed: "malformed"
        case .undecodablePayload: "undecodablePayload"
        case .missingExpiry: "missingExpiry"
        case .expired: "expired"
        case .lifetimeTooLong: "lifetimeTooLong"
        case .issuedInFuture: "issuedInFuture"
        case .subjectMismatch: "subjectMismatch"
        case .opaqueNotAllowed: "opaqueNotAllowed"
        case .noProgress: "noProgress"
        case .missingIssuedAt: "missingIssuedAt"
        case .missingAuthorization: "missingAuthorization"
        }
    }

    /// What is wrong, for an operator.
    public var description: String {
        switch self {
        case .malformed(let detail): "not a JWT (\(detail))"
        case .undecodablePayload: "the JWT payload is not a JSON object"
        case .missingExpiry: "neither the JWT nor the provider gives an expiry"
        case .expired(let at): "it expired at \(at.formatted(.iso8601)) (or is too close to expiry to use)"
        case .lifetimeTooLong(let seconds, let limit):
            "exp is \(Int(seconds)) s after iat, more than the \(Int(limit)) s Fleet Engine accepts"
        case .issuedInFuture(let at): "iat \(at.formatted(.iso8601)) is in the future: check the provider's clock"
        case .subjectMismatch(let expected, let claim, let found):
            "its authorization.\(claim) is \"\(found)\", not the requested \"\(expected)\""
        case .opaqueNotAllowed: "it is not a JWT and opaque tokens are not enabled"
        case .noProgress(let at): "it expires no later than the token already held (\(at.formatted(.iso8601))): the provider is caching"
        case .missingIssuedAt:
            "the JWT has no iat claim, so its lifetime cannot be checked: fix the provider, or allow opaque tokens to accept it"
        case .missingAuthorization(let claim):
            "the JWT has no authorization claim (expected authorization.\(claim)): fix the provider, or allow opaque tokens to accept it"
        }
    }
}
