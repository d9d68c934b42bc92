// Test kit layer: a builder of Fleet Engine-shaped JWTs for every token kind, and of malformed
// ones, for scripted providers and validation tests. Unsigned: the client never checks signatures.

public import FleetTokenStore
public import Foundation

/// Builds Fleet Engine-shaped JWTs: an RS256 header, the service account's `iss`/`sub`, the
/// Fleet Engine audience, `iat`/`exp`, and the `authorization` claim of the kind (`vehicleid`,
/// `tripid`, `deliveryvehicleid`, `taskid`).
///
/// The signature is 256 random bytes, so a token is about as long as a real one (900 bytes) and
/// two tokens never share a signature; nothing checks it. ``raw(header:payload:signature:)``
/// builds any header and payload text, for malformed cases.
///
/// ```swift
/// let token = TestJWT.make(for: try .trip("trip-1"), issuedAt: time.now, lifetime: 3600)
/// ```
public enum TestJWT {
    /// The `kid` in every built token's header.
    public static let keyID = "0123456789abcdef0123456789abcdef01234567"
    /// The service account in every built token's `iss` and `sub`.
    public static let serviceAccount = "fleet-engine-sa@test-project.iam.gserviceaccount.com"
    /// The audience in every built token's `aud`.
    public static let audience = "https://fleetengine.googleapis.com/"

    /// A token for `key`, issued at `issuedAt`, expiring `lifetime` seconds later.
    /// - Parameters:
    ///   - key: The subject, and the kind whose claim names it.
    ///   - issuedAt: The `iat` claim.
    ///   - lifetime: Seconds from `iat` to `exp`.
    ///   - authorizationSubject: The id in the `authorization` claim, when it should differ
    ///     from the key's (a wrong subject, or `*`).
    ///   - includeAuthorization: False leaves the `authorization` claim out.
    ///   - extraClaims: JSON text appended to the payload object, starting with a comma
    ///     (`,"scope":"x"`).
    public static func make(for key: TokenKey, issuedAt: Date, lifetime: TimeInterval = 3600,
                            authorizationSubject: String? = nil, includeAuthorization: Bool = true,
                            extraClaims: String = "") -> String {
        make(kind: key.kind, subject: authorizationSubject ?? key.subjectID, issuedAt: issuedAt, lifetime: lifetime,
             includeAuthorization: includeAuthorization, extraClaims: extraClaims)
    }

    /// A token whose `authorization` claim names `subject` under `kind`'s claim, for any
    /// subject text (a provider that answers for whatever id a request names).
    /// - Parameters:
    ///   - kind: The kind whose claim (`vehicleid`, `tripid`, …) names the subject.
    ///   - subject: The id in the `authorization` claim.
    ///   - issuedAt: The `iat` claim.
    ///   - lifetime: Seconds from `iat` to `exp`.
    ///   - includeAuthorization: False leaves the `authorization` claim out.
    ///   - extraClaims: JSON text appended to the payload object, starting with a comma.
    public static func make(kind: TokenKind, subject: String, issuedAt: Date, lifetime: TimeInterval = 3600,
                            includeAuthorization: Bool = true, extraClaims: String = "") -> String {
        let header = #"{"alg":"RS256","typ":"JWT","kid":"\#(keyID)"}"#
        let iat = Int(issuedAt.timeIntervalSince1970)
        let exp = Int(issuedAt.addingTimeInterval(lifetime).timeIntervalSince1970)
        let authorization = includeAuthorization ? #","authorization":{"\#(kind.authorizationClaim)":\#(jsonString(subject))}"# : ""
        let payload = #"{"iss":"\#(serviceAccount)","sub":"\#(serviceAccount)","aud":"\#(audience)","iat":\#(iat),"exp":\#(exp)\#(authorization)\#(extraClaims)}"#
        let signature = Data((0..<256).map { _ in UInt8.random(in: 0...255) })
        return [Data(header.utf8), Data(payload.utf8), signature].map(base64URL).joined(separator: ".")
    }

    /// A token of arbitrary header and payload text (which need not be JSON) and signature part.
    public static func raw(header: String = #"{"alg":"RS256"}"#, payload: String, signature: String = "c2lnbmF0dXJl") -> String {
        base64URL(Data(header.utf8)) + "." + base64URL(Data(payload.utf8)) + "." + signature
    }

    /// `data` in base64url without padding, as JWT parts are encoded.
    public static func base64URL(_ data: Data) -> String {
        data.base64EncodedString().replacingOccurrences(of: "+", with: "-")
            .replacingOccurrences(of: "/", with: "_").replacingOccurrences(of: "=", with: "")
    }

    /// `text` as a JSON string literal: ids may hold quotes and backslashes.
    private static func jsonString(_ text: String) -> String {
        let encoder = JSONEncoder()
        encoder.outputFormatting = .withoutEscapingSlashes
        // Encoding a String cannot fail.
        return String(decoding: try! encoder.encode(text), as: UTF8.self)
    }
}
