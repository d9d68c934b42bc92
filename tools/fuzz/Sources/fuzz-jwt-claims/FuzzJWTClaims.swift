// libFuzzer harness for the JWT decoder, `JWTClaims.decode(_:)`, and the validation built on it
// (`TokenValidator.validate`), which every fetched token goes through.
//
// Input: byte 0 picks the mode and the context; the rest is the token.
//   bit 0: 0 = the rest is the token text; 1 = the rest is header JSON, payload JSON and
//          signature bytes separated by 0xFF, which the harness base64url-encodes and joins
//          with dots, so mutations reach the JSON behind the base64url
//   bit 1: (structured mode) pad the segments with "="
//   bits 2-3: key kind for validation (vehicle, trip, deliveryVehicle, task)
//   bits 4-5: `now` for validation (see `clocks`)
//   bit 6: allow opaque tokens; bit 7: the provider stated an expiry (now + 1800 s)

// @testable: JWTClaims, TokenValidator and RelativeTime (which the agent prints expiries with)
// are package-only (the fuzz build is a debug build, so testing is enabled).
@testable import FleetTokenStore
import Foundation
import FuzzSupport

let clocks: [Date] = [
    Date(timeIntervalSince1970: 1_800_000_000),       // the seeds' iat
    Date(timeIntervalSince1970: 1_800_001_800),
    Date(timeIntervalSince1970: 0),
    Date(timeIntervalSince1970: 253_402_300_799),     // 9999-12-31T23:59:59Z
]
let keys: [TokenKey] = [TokenKind.vehicle, .trip, .deliveryVehicle, .task].map { try! TokenKey(kind: $0, subjectID: "subject-1") }

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzJWTClaims(_ data: UnsafePointer<UInt8>?, _ size: Int) -> CInt {
    let input = FuzzInput(data, size)
    let mode = input.selector(0)
    let payload = input.payload(after: 1)
    let token: String
    if mode & 1 == 0 {
        token = String(decoding: payload, as: UTF8.self)
    } else {
        let parts = payload.split(separator: 0xFF, maxSplits: 2, omittingEmptySubsequences: false)
        let segments = (0..<3).map { $0 < parts.count ? Array(parts[$0]) : [] }
        token = segments.map { base64URL($0, padded: mode & 2 != 0) }.joined(separator: ".")
        checkEncodingIndependence(segments)
    }
    let claims = checkDecode(token)
    let now = clocks[Int(mode >> 4 & 3)]
    checkValidation(token, claims: claims, key: keys[Int(mode >> 2 & 3)], now: now,
                    allowOpaque: mode & 64 != 0, stated: mode & 128 != 0 ? now + 1800 : nil)
    return 0
}

/// Decodes `token` and checks what any outcome must satisfy; the claims when it decodes.
func checkDecode(_ token: String) -> JWTClaims? {
    do {
        let claims = try JWTClaims.decode(token)
        require(JWTClaims.hasJWTShape(token), "a token without the JWT shape decoded")
        require(token.utf8.count <= JWTClaims.maximumTokenLength, "an over-long token decoded")
        for (name, date) in [("exp", claims.expiresAt), ("iat", claims.issuedAt)] {
            guard let seconds = date?.timeIntervalSince1970 else { continue }
            require(seconds.isFinite && seconds >= 0 && seconds < 1e11, "\(name) \(seconds) is out of range")
        }
        return claims
    } catch {
        switch error.code {
        case .malformed, .undecodablePayload: break
        default: require(false, "decode threw \(error.kind)")
        }
        requireNoLeak(of: token, in: error.description, "the decoder's error")
        return nil
    }
}

/// The decoded claims depend neither on base64url padding nor on the signature's content (it
/// is not checked on the client).
func checkEncodingIndependence(_ segments: [[UInt8]]) {
    let unpadded = segments.map { base64URL($0) }
    let reference = outcome(unpadded.joined(separator: "."))
    let padded = segments.map { base64URL($0, padded: true) }.joined(separator: ".")
    require(outcome(padded) == reference, "padding changed the outcome: \(outcome(padded)) vs \(reference)")
    guard !segments[2].isEmpty else { return }
    let otherSignature = (unpadded[0..<2] + ["c2lnbmF0dXJl"]).joined(separator: ".")
    require(outcome(otherSignature) == reference, "the signature's content changed the outcome")
}

/// The claims, or the kind of error (its detail may name the segment that failed).
enum Outcome: Equatable {
    case claims(JWTClaims)
    case error(kind: String)
}

func outcome(_ token: String) -> Outcome {
    do { return .claims(try JWTClaims.decode(token)) } catch { return .error(kind: error.kind) }
}

/// Validation, as the engine runs it on every fetched token.
func checkValidation(_ token: String, claims: JWTClaims?, key: TokenKey, now: Date, allowOpaque: Bool, stated: Date?) {
    var policy = RefreshPolicy()
    policy.allowOpaqueTokens = allowOpaque
    let fetched = FetchedToken(value: token, statedExpiry: stated)
    let stored: StoredToken
    do {
        stored = try TokenValidator(policy: policy).validate(fetched, for: key, now: now)
    } catch {
        requireNoLeak(of: token, in: error.description, "the validator's error")
        requireNoLeak(of: token, in: TokenProviderError.invalidToken(error).description, "the provider error")
        return
    }
    require(stored.value == token, "validation changed the token")
    require(stored.expiresAt > now, "an expired token passed validation")
    if let stated { require(stored.expiresAt <= stated, "the stored expiry is later than the stated one") }
    if let claims {
        if let exp = claims.expiresAt { require(stored.expiresAt <= exp, "the stored expiry is later than exp") }
        require(stored.issuedAt == claims.issuedAt, "the stored iat is not the token's")
        if let issuedAt = claims.issuedAt {
            require(stored.expiresAt.timeIntervalSince(issuedAt) <= policy.maximumLifetime + policy.lifetimeTolerance,
                    "a lifetime over the maximum passed validation")
        }
        if let authorization = claims.authorization {
            let subject = authorization[key.kind.authorizationClaim]
            require(subject == key.subjectID || subject == "*", "a token for another subject passed validation")
        }
    } else {
        require(allowOpaque && !token.contains("."), "a token that does not decode passed validation")
    }
    requireNoLeak(of: token, in: stored.description, "StoredToken.description")
    requireNoLeak(of: token, in: String(reflecting: stored), "StoredToken's debug description")
    _ = RelativeTime.describe(stored.expiresAt, now: now)
}
