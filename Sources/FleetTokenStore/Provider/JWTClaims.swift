// Provider layer: the claims of a JWT the engine needs, decoded once, without the signature.

package import Foundation

/// The claims of a JWT the engine needs, decoded without checking the signature (the client is
/// not the audience; Fleet Engine checks it). Parsing is strict about shape and tolerant of
/// extra claims.
package struct JWTClaims: Sendable, Equatable {
    /// `exp`.
    package var expiresAt: Date?
    /// `iat`.
    package var issuedAt: Date?
    /// `iss`.
    package var issuer: String?
    /// `sub`.
    package var subject: String?
    /// `aud` (the first one when it is an array).
    package var audience: String?
    /// The string members of the private `authorization` claim, e.g. `vehicleid`; nil when the
    /// token has no `authorization` claim.
    package var authorization: [String: String]?
    /// The header's `alg`.
    package var algorithm: String?
    /// The header's `kid`.
    package var keyID: String?

    /// Creates claims.
    package init(expiresAt: Date? = nil, issuedAt: Date? = nil, issuer: String? = nil, subject: String? = nil,
                audience: String? = nil, authorization: [String: String]? = nil,
                algorithm: String? = nil, keyID: String? = nil) {
        self.expiresAt = expiresAt
        self.issuedAt = issuedAt
        self.issuer = issuer
        self.subject = subject
        self.audience = audience
        self.authorization = authorization
        self.algorithm = algorithm
        self.keyID = keyID
    }

    /// Largest token accepted, in bytes: far above a Fleet Engine JWT (~1 KB).
    package static let maximumTokenLength = 64 * 1024

    /// True when `token` has the JWT shape: three non-empty dot-separated segments.
    package static func hasJWTShape(_ token: String) -> Bool {
        var segments = 0
        var current = 0
        for byte in token.utf8 {
            if byte == UInt8(ascii: ".") {
                if current == 0 { return false }
                segments += 1
                current = 0
            } else {
                current += 1
            }
        }
        return segments == 2 && current > 0
    }

    /// Decodes the header and payload of a compact JWT.
    /// - Throws: ``TokenValidationError/malformed(detail:)`` for a bad shape or base64url,
    ///   ``TokenValidationError/undecodablePayload`` when the payload is not a JSON object.
    package static func decode(_ token: String) throws(TokenValidationError) -> JWTClaims {
        guard token.utf8.count <= maximumTokenLength else { throw .malformed(detail: "longer than \(maximumTokenLength) bytes") }
        let segments = token.split(separator: ".", omittingEmptySubsequences: false)
        guard segments.count == 3 else { throw .malformed(detail: "\(segments.count) segments, a JWT has 3") }
        guard segments.allSatisfy({ !$0.isEmpty }) else { throw .malformed(detail: "an empty segment") }
        guard let headerData = base64URLDecode(segments[0]) else { throw .malformed(detail: "header is not base64url") }
        guard let payloadData = base64URLDecode(segments[1]) else { throw .malformed(detail: "payload is not base64url") }
        guard base64URLDecode(segments[2]) != nil else { throw .malformed(detail: "signature is not base64url") }
        guard let header = JSONValue.parse(headerData)?.objectValue else {
            throw .malformed(detail: "header is not a JSON object")
        }
        guard let payload = JSONValue.parse(payloadData)?.objectValue else {
            throw .undecodablePayload
        }
        var claims = JWTClaims()
        claims.algorithm = header["alg"]?.stringValue
        claims.keyID = header["kid"]?.stringValue
        claims.expiresAt = try date(payload["exp"], claim: "exp")
        claims.issuedAt = try date(payload["iat"], claim: "iat")
        claims.issuer = payload["iss"]?.stringValue
        claims.subject = payload["sub"]?.stringValue
        switch payload["aud"] {
        case .string(let audience): claims.audience = audience
        case .array(let audiences): claims.audience = audiences.first?.stringValue
        default: break
        }
        if let authorization = payload["authorization"] {
            guard let members = authorization.objectValue else {
                throw .malformed(detail: "the authorization claim is not an object")
            }
            claims.authorization = members.compactMapValues(\.stringValue)
        }
        return claims
    }

    private static func date(_ value: JSONValue?, claim: String) throws(TokenValidationError) -> Date? {
        guard let value, value != .null else { return nil }
        guard let seconds = value.numberValue else { throw .malformed(detail: "\(claim) is not a number") }
        guard seconds.isFinite, seconds >= 0, seconds < 1e11 else { throw .malformed(detail: "\(claim) is out of range") }
        return Date(timeIntervalSince1970: seconds)
    }

    /// Decodes unpadded (or padded) base64url; nil for any character outside the alphabet.
    static func base64URLDecode(_ text: Substring) -> Data? {
        var base64 = ""
        base64.reserveCapacity(text.utf8.count + 3)
        for scalar in text.unicodeScalars {
            switch scalar {
            case "A"..."Z", "a"..."z", "0"..."9": base64.unicodeScalars.append(scalar)
            case "-": base64 += "+"
            case "_": base64 += "/"
            case "=": continue
            default: return nil
            }
        }
        guard base64.count % 4 != 1 else { return nil }
        while base64.count % 4 != 0 { base64 += "=" }
        return Data(base64Encoded: base64)
    }
}
