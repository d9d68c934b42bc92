// FleetTokenStoreTests' storage support: file hashes, plausible tokens, stored tokens relative
// to a reference time, and opening a store. (Directories, file modes and sqlite3 are in
// TestSupportKit; test time and JWTs in the test kit.)

import Crypto
import FleetTokenStoreTesting
import Foundation
import Logging
@testable import FleetTokenStore

func sha256(ofFile path: String) -> String {
    let data = FileManager.default.contents(atPath: path) ?? Data()
    return SHA256.hash(data: data).map { String(format: "%02x", $0) }.joined()
}

/// A plausible token value (not a signed JWT; storage does not validate).
func fakeToken(_ seed: String, length: Int = 120) -> String {
    var text = "eyJhbGciOiJSUzI1NiJ9.\(Data(seed.utf8).base64EncodedString())."
    while text.count < length { text += "x" }
    return text
}

/// The wall-clock time the unit tests start from (TestTime's default start).
let referenceNow = TestTime.defaultStart

func token(_ key: TokenKey, expiresIn seconds: TimeInterval, lifetime: TimeInterval = 3600,
           now: Date = referenceNow, value: String? = nil) -> StoredToken {
    let expires = now.addingTimeInterval(seconds)
    return StoredToken(key: key, value: value ?? fakeToken("\(key)-\(seconds)"), expiresAt: expires,
                       issuedAt: expires.addingTimeInterval(-lifetime), fetchedAt: expires.addingTimeInterval(-lifetime))
}

func openStore(_ path: String, mode: StoreOpenMode = .agent, configure: (inout StoreConfiguration) -> Void = { _ in },
               logger: Logger = Logger(label: "test")) throws -> SQLiteTokenRepository {
    var configuration = StoreConfiguration()
    configure(&configuration)
    return try SQLiteTokenRepository(path: path, mode: mode, configuration: configuration, logger: logger)
}

