// Provider layer: the checks every fetched token passes before it is stored or handed out.

package import Foundation

/// Checks every fetched token, whatever the transport, before it can be stored or handed out.
///
/// A JWT must have three base64url segments and a JSON payload; its expiry is the earlier of
/// the provider's stated expiry and `exp`; it must carry `iat`, and `exp` may be at most
/// ``RefreshPolicy/maximumLifetime`` (plus tolerance) after it; it must leave more than the floor
/// of life; and it must carry the `authorization` claim, whose member for the key's kind names
/// the requested subject or is `*`. With ``RefreshPolicy/allowOpaqueTokens`` a JWT may lack
/// `iat` or `authorization` (the checks that need them are skipped), and a token that is not a
/// JWT passes when the provider stated an expiry.
package struct TokenValidator: Sendable {
    /// The rules applied.
    package let policy: RefreshPolicy

    /// Creates a validator for `policy`.
    package init(policy: RefreshPolicy) {
        self.policy = policy
    }

    /// Validates `fetched` as a token for `key` at `now` (the provider-corrected time) and
    /// returns it ready to store.
    /// - Throws: ``TokenValidationError``.
    package func validate(_ fetched: FetchedToken, for key: TokenKey, now: Date) throws(TokenValidationError) -> StoredToken {
        try validate(ProviderAnswer(fetched), for: key, now: now, previous: nil)
    }

    /// Validates a decoded answer; with `previous` (the token held), a token that expires no
    /// later than it is refused as ``TokenValidationError/noProgress(expiresAt:)``: a provider
    /// that caches tokens must not cause a refresh loop.
    func validate(_ answer: ProviderAnswer, for key: TokenKey, now: Date,
                  previous: StoredToken?) throws(TokenValidationError) -> StoredToken {
        let value = answer.fetched.value
        var expiry = answer.fetched.statedExpiry
        var issuedAt: Date?
        if let decoded = answer.claims {
            let claims = try decoded.get()
            issuedAt = claims.issuedAt
            if let exp = claims.expiresAt { expiry = min(expiry ?? exp, exp) }
            if issuedAt == nil && !policy.allowOpaqueTokens { throw .missingIssuedAt }
            try checkSubject(claims.authorization, key: key)
        } else {
            guard policy.allowOpaqueTokens else { throw .opaqueNotAllowed }
            guard !value.isEmpty, value.utf8.count <= JWTClaims.maximumTokenLength,
                  !value.unicodeScalars.contains(where: { $0.properties.isWhitespace || $0.properties.generalCategory == .control })
            else { throw .malformed(detail: "empty, too long, or contains whitespace") }
        }
        guard let expiresAt = expiry else { throw .missingExpiry }
        if let issuedAt {
            if issuedAt.timeIntervalSince(now) > policy.lifetimeTolerance { throw .issuedInFuture(issuedAt: issuedAt) }
            let lifetime = expiresAt.timeIntervalSince(issuedAt)
            if lifetime <= 0 { throw .expired(expiresAt: expiresAt) }
            if lifetime > policy.maximumLifetime + policy.lifetimeTolerance {
                throw .lifetimeTooLong(seconds: lifetime, limit: policy.maximumLifetime)
            }
        }
        let token = StoredToken(key: key, value: value, expiresAt: expiresAt, issuedAt: issuedAt, fetchedAt: now)
        // The floor is the refresh machine's rule: a token it would not hand out is not stored.
        if !RefreshMachine(policy: policy).isAboveFloor(token, at: now) { throw .expired(expiresAt: expiresAt) }
        if let previous, expiresAt <= previous.expiresAt { throw .noProgress(expiresAt: previous.expiresAt) }
        return token
    }

    private func checkSubject(_ authorization: [String: String]?, key: TokenKey) throws(TokenValidationError) {
        let claim = key.kind.authorizationClaim
        guard let authorization else {
            if policy.allowOpaqueTokens { return }
            throw .missingAuthorization(claim: claim)
        }
        let found = authorization[claim]
        guard found == key.subjectID || found == "*" else {
            throw .subjectMismatch(expected: key.subjectID, claim: claim, found: found ?? "(absent)")
        }
    }
}

/// A provider's answer with its JWT decoded once, on the way from the fetcher to validation:
/// the engine learns the provider's clock from the same claims the validator checks.
struct ProviderAnswer: Sendable {
    let fetched: FetchedToken
    /// The decoded claims, or why they could not be decoded; nil when the value is not JWT-shaped
    /// (an opaque token).
    let claims: Result<JWTClaims, TokenValidationError>?

    init(_ fetched: FetchedToken) {
        self.fetched = fetched
        // A transport that already decoded the claims (to cross-check the stated expiry) hands
        // them over; otherwise they are decoded here, once.
        claims = fetched.decodedClaims ?? FetchedToken.decodeClaims(of: fetched.value)
    }

    /// The JWT's `iat`, when it has one.
    var issuedAt: Date? { try? claims?.get().issuedAt }
}
