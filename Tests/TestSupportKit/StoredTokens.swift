// Shared by the test targets: stored tokens for storage tests (plausible values, expiries
// relative to a reference time), used by the repository contract and the SQLite store's tests.

import FleetTokenStore
import FleetTokenStoreTesting
import Foundation

/// The wall-clock time storage and engine unit tests start from (TestTime's default start, a
/// whole number of seconds, so every store keeps times relative to it exactly).
public let referenceNow = TestTime.defaultStart

/// A plausible token value (not a signed JWT; storage does not validate).
public func fakeToken(_ seed: String, length: Int = 120) -> String {
    var text = "eyJhbGciOiJSUzI1NiJ9.\(Data(seed.utf8).base64EncodedString())."
    while text.count < length { text += "x" }
    return text
}

/// A token of `key` expiring `seconds` after `now`, issued and fetched `lifetime` before its expiry.
public func token(_ key: TokenKey, expiresIn seconds: TimeInterval, lifetime: TimeInterval = 3600,
                  now: Date = referenceNow, value: String? = nil) -> StoredToken {
    let expires = now.addingTimeInterval(seconds)
    return StoredToken(key: key, value: value ?? fakeToken("\(key)-\(seconds)"), expiresAt: expires,
                       issuedAt: expires.addingTimeInterval(-lifetime), fetchedAt: expires.addingTimeInterval(-lifetime))
}
