// FleetTokenStoreTests' storage support: file hashes and opening a store. (Directories, file
// modes, sqlite3 and stored tokens relative to a reference time are in TestSupportKit; test
// time and JWTs in the test kit.)

import Crypto
import Foundation
import Logging
@testable import FleetTokenStore

func sha256(ofFile path: String) -> String {
    let data = FileManager.default.contents(atPath: path) ?? Data()
    return SHA256.hash(data: data).map { String(format: "%02x", $0) }.joined()
}

func openStore(_ path: String, mode: StoreOpenMode = .agent, configure: (inout StoreConfiguration) -> Void = { _ in },
               logger: Logger = Logger(label: "test")) throws -> SQLiteTokenRepository {
    var configuration = StoreConfiguration()
    configure(&configuration)
    return try SQLiteTokenRepository(path: path, mode: mode, configuration: configuration, logger: logger)
}

