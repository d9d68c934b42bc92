import FleetTokenStoreTesting
import Foundation
import Testing
import TestSupportKit
@testable import FleetTokenStore

@Suite("Validation of every fetched token", .paced)
struct ValidationTests {
    let key = try! TokenKey.vehicle("truck-7")
    let now = referenceNow
    let validator = TokenValidator(policy: RefreshPolicy())

    func validate(_ value: String, stated: Date? = nil, policy: RefreshPolicy = RefreshPolicy(),
                  key: TokenKey? = nil) throws(TokenValidationError) -> StoredToken {
        try TokenValidator(policy: policy).validate(FetchedToken(value: value, statedExpiry: stated), for: key ?? self.key, now: now)
    }

    @Test("a lifetime beyond Int's range is reported, not a crash (found by fuzz-provider-response)")
    func absurdLifetimeIsDescribed() throws {
        let error = TokenValidationError.lifetimeTooLong(seconds: 1e300, limit: 3600)
        #expect(error.description.contains("more than the 3600 s Fleet Engine accepts"))
        #expect(TokenValidationError.lifetimeTooLong(seconds: 3661.5, limit: 3600).description.hasPrefix("exp is 3661 s after iat"))
        // The fuzzer's case: a JWT without exp, and a provider stating an absurd expiry.
        let token = TestJWT.raw(payload: #"{"iat":\#(Int(now.timeIntervalSince1970)),"authorization":{"vehicleid":"truck-7"}}"#)
        #expect { try validate(token, stated: Date(timeIntervalSince1970: 1e300)) } throws: {
            ($0 as? TokenValidationError)?.description.contains("after iat") == true
        }
    }

    @Test("claims a transport already decoded are used, not decoded again; equality ignores them")
    func claimsDecodedOnce() throws {
        let value = TestJWT.make(for: key, issuedAt: now)
        var fetched = FetchedToken(value: value)
        // Claims of another subject: only reusing them, not decoding `value`, can refuse the token.
        fetched.decodedClaims = .success(try JWTClaims.decode(TestJWT.make(for: try .vehicle("someone-else"), issuedAt: now)))
        #expect(fetched == FetchedToken(value: value))
        #expect { try validator.validate(ProviderAnswer(fetched), for: key, now: now, previous: nil) } throws: {
            ($0 as? TokenValidationError)?.code == .subjectMismatch
        }
        #expect(try validator.validate(ProviderAnswer(FetchedToken(value: value)), for: key, now: now, previous: nil).value == value)
    }

    @Test("a well-formed token for the subject passes with its exp and iat")
    func valid() throws {
        let jwt = TestJWT.make(for: key, issuedAt: now)
        let token = try validate(jwt)
        #expect(token.expiresAt == now + 3600)
        #expect(token.issuedAt == now)
        #expect(token.value == jwt)
        #expect(jwt.utf8.count > 700 && jwt.utf8.count < 1200)
    }

    @Test("the expiry used is the earlier of the stated expiry and exp")
    func earlierExpiryWins() throws {
        let jwt = TestJWT.make(for: key, issuedAt: now)
        #expect(try validate(jwt, stated: now + 1800).expiresAt == now + 1800)
        #expect(try validate(jwt, stated: now + 7200).expiresAt == now + 3600)
    }

    @Test("an authorization claim naming another subject is a subject mismatch; * is accepted")
    func subject() throws {
        #expect(throws: TokenValidationError.subjectMismatch(expected: "truck-7", claim: "vehicleid", found: "truck-8")) {
            try validate(TestJWT.make(for: key, issuedAt: now, authorizationSubject: "truck-8"))
        }
        _ = try validate(TestJWT.make(for: key, issuedAt: now, authorizationSubject: "*"))
        // A trip token presented for a trip key is checked against tripid.
        let trip = try TokenKey.trip("trip-1")
        #expect(throws: TokenValidationError.self) {
            try validate(TestJWT.make(for: trip, issuedAt: now, authorizationSubject: "trip-2"), key: trip)
        }
        // A vehicle token (vehicleid) asked for as a trip token names no trip: rejected.
        #expect(throws: TokenValidationError.subjectMismatch(expected: "truck-7", claim: "tripid", found: "(absent)")) {
            try validate(TestJWT.make(for: key, issuedAt: now), key: try .trip("truck-7"))
        }
        // No authorization claim at all: nothing says what the token may act on, so it is rejected.
        #expect(throws: TokenValidationError.missingAuthorization(claim: "vehicleid")) {
            try validate(TestJWT.make(for: key, issuedAt: now, includeAuthorization: false))
        }
    }

    @Test("expired tokens, and tokens with less than the floor left, are rejected")
    func expired() {
        #expect(throws: TokenValidationError.expired(expiresAt: now - 1)) {
            try validate(TestJWT.make(for: key, issuedAt: now - 3601))
        }
        #expect(throws: TokenValidationError.self) { try validate(TestJWT.make(for: key, issuedAt: now - 3590)) }
    }

    @Test("exp more than an hour (plus tolerance) after iat is rejected")
    func lifetimeTooLong() throws {
        #expect(throws: TokenValidationError.lifetimeTooLong(seconds: 7200, limit: 3600)) {
            try validate(TestJWT.make(for: key, issuedAt: now, lifetime: 7200))
        }
        _ = try validate(TestJWT.make(for: key, issuedAt: now, lifetime: 3600 + 59))
    }

    @Test("exp at or before iat is rejected as expired")
    func expBeforeIat() {
        let payload = #"{"iat":\#(Int(now.timeIntervalSince1970) + 30),"exp":\#(Int(now.timeIntervalSince1970) + 10),"authorization":{"vehicleid":"truck-7"}}"#
        #expect(throws: TokenValidationError.expired(expiresAt: now + 10)) { try validate(TestJWT.raw(payload: payload)) }
    }

    @Test("a fetched token's description and dump show a fingerprint, never the token")
    func fetchedTokenRedacted() {
        let jwt = TestJWT.make(for: key, issuedAt: now)
        let fetched = FetchedToken(value: jwt, statedExpiry: now + 60)
        var dumped = ""
        dump(fetched, to: &dumped)
        var dumpedStored = ""
        dump(try! validate(jwt), to: &dumpedStored)
        for text in [String(describing: fetched), dumped, dumpedStored, String(describing: try! validate(jwt))] {
            #expect(!text.contains(jwt))
            #expect(text.contains(TokenFingerprint(of: jwt).description))
        }
    }

    @Test("iat in the future beyond the tolerance is rejected")
    func issuedInFuture() {
        #expect(throws: TokenValidationError.issuedInFuture(issuedAt: now + 600)) {
            try validate(TestJWT.make(for: key, issuedAt: now + 600))
        }
    }

    @Test("malformed tokens are rejected with what is wrong", arguments: [
        ("two.segments", "segments"),
        ("a.b.c.d", "segments"),
        ("..", "empty"),
        ("eyJhbGciOiJSUzI1NiJ9.e30.sig!nature", "signature"),
        ("eyJhbGciOiJSUzI1NiJ9.e*30.c2ln", "payload"),
        ("bm90IGpzb24.e30.c2ln", "header"),
    ])
    func malformed(value: String, mentions: String) {
        let error = #expect(throws: TokenValidationError.self) { try validate(value) }
        guard error?.code == .malformed, let detail = error?.detail else {
            Issue.record("expected malformed, got \(String(describing: error))")
            return
        }
        #expect(detail.contains(mentions))
    }

    @Test("a payload that is not a JSON object, or a non-numeric exp, is rejected")
    func badPayload() {
        #expect(throws: TokenValidationError.undecodablePayload) { try validate(TestJWT.raw(payload: "[1,2]")) }
        #expect(throws: TokenValidationError.undecodablePayload) { try validate(TestJWT.raw(payload: "not json")) }
        #expect(throws: TokenValidationError.self) { try validate(TestJWT.raw(payload: #"{"exp":"soon"}"#)) }
        #expect(throws: TokenValidationError.self) { try validate(TestJWT.raw(payload: #"{"exp":true}"#)) }
    }

    @Test("no exp and no stated expiry is missingExpiry; a stated one suffices")
    func missingExpiry() throws {
        let noExp = TestJWT.raw(payload: #"{"iat":\#(Int(now.timeIntervalSince1970)),"authorization":{"vehicleid":"truck-7"}}"#)
        #expect(throws: TokenValidationError.missingExpiry) { try validate(noExp) }
        #expect(try validate(noExp, stated: now + 600).expiresAt == now + 600)
    }

    @Test("opaque tokens only when allowed, and then only with a stated expiry")
    func opaque() throws {
        #expect(throws: TokenValidationError.opaqueNotAllowed) { try validate("opaque-token-value") }
        var policy = RefreshPolicy()
        policy.allowOpaqueTokens = true
        #expect(throws: TokenValidationError.missingExpiry) { try validate("opaque-token-value", policy: policy) }
        #expect(try validate("opaque-token-value", stated: now + 900, policy: policy).expiresAt == now + 900)
        #expect(throws: TokenValidationError.self) { try validate("with space", stated: now + 900, policy: policy) }
    }

    @Test("error messages never contain the token")
    func redaction() {
        let jwt = TestJWT.make(for: key, issuedAt: now, authorizationSubject: "other")
        let error = #expect(throws: TokenValidationError.self) { try validate(jwt) }
        let text = String(describing: error) + TokenProviderError.invalidToken(error!).description
        #expect(!text.contains(jwt))
        #expect(!text.contains(String(jwt.split(separator: ".")[2])))
    }
}

@Suite("RefreshPolicy arithmetic", .paced)
struct RefreshPolicyTests {
    let policy = RefreshPolicy()

    @Test("the soft point is 80% of the lifetime, moved earlier by at most 5%")
    func softPointBounds() {
        let token = StoredToken(key: try! .vehicle("v"), value: "x", expiresAt: referenceNow + 3600,
                                issuedAt: referenceNow, fetchedAt: referenceNow)
        #expect(policy.softPoint(of: token, jitter: 0) == referenceNow + 2880)
        #expect(policy.softPoint(of: token, jitter: 1) == referenceNow + 2700)
        for _ in 0..<1000 {
            let soft = policy.softPoint(of: token, jitter: Double.random(in: 0...1))
            #expect(soft >= referenceNow + 2700 && soft <= referenceNow + 2880)
        }
        // Out-of-range randomness is clamped, never moving the point outside the bounds.
        #expect(policy.softPoint(of: token, jitter: 7) == referenceNow + 2700)
    }

    @Test("the floor is min(30 s, 10% of the lifetime)")
    func floor() {
        let hour = StoredToken(key: try! .vehicle("v"), value: "x", expiresAt: referenceNow + 3600, issuedAt: referenceNow, fetchedAt: referenceNow)
        let minute = StoredToken(key: try! .vehicle("v"), value: "x", expiresAt: referenceNow + 60, issuedAt: referenceNow, fetchedAt: referenceNow)
        #expect(policy.floor(of: hour) == 30)
        #expect(policy.floor(of: minute) == 6)
    }

    @Test("backoff doubles from 1 s to the 5 min cap; equal jitter never goes below half")
    func backoffSequence() {
        let nominal = (1...12).map { policy.nominalBackoff(afterFailures: $0, retryable: true) }
        #expect(nominal == [1, 2, 4, 8, 16, 32, 64, 128, 256, 300, 300, 300])
        for failures in 1...12 {
            let n = nominal[failures - 1]
            #expect(policy.jitteredBackoff(afterFailures: failures, retryable: true, random: 0) == n / 2)
            #expect(policy.jitteredBackoff(afterFailures: failures, retryable: true, random: 1) == n)
        }
        #expect(policy.nominalBackoff(afterFailures: 1, retryable: false) == 30)
        #expect(policy.nominalBackoff(afterFailures: 5, retryable: false) == 300)
        #expect(policy.nominalBackoff(afterFailures: 10_000, retryable: true) == 300)
    }
}
