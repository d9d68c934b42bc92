import FleetTokenStoreTesting
import Foundation
import Logging
import TestSupportKit
@testable import FleetTokenStore

/// A JWT-shaped value fixed by `key` (TestJWT signs anew on every call): header, payload naming
/// the subject, and a 256-byte signature of its own, so a scan can look for each part.
func jwtLike(_ key: TokenKey) -> String {
    var seed: UInt64 = 0xcbf2_9ce4_8422_2325
    for byte in "\(key)".utf8 { seed = (seed ^ UInt64(byte)) &* 0x100_0000_01b3 }
    let signature = Data((0..<256).map { index -> UInt8 in
        seed = seed &* 6_364_136_223_846_793_005 &+ 1_442_695_040_888_963_407
        return UInt8(truncatingIfNeeded: (seed >> 33) ^ UInt64(index))
    })
    func url(_ data: Data) -> String {
        data.base64EncodedString().replacingOccurrences(of: "+", with: "-").replacingOccurrences(of: "/", with: "_")
            .replacingOccurrences(of: "=", with: "")
    }
    let payload = #"{"authorization":{"vehicleid":"\#(key.subjectID)"},"iat":1700000000,"exp":1700003600}"#
    return url(Data(#"{"alg":"RS256","typ":"JWT"}"#.utf8)) + "." + url(Data(payload.utf8)) + "." + url(signature)
}

extension LogRecorder {
    /// Each error entry as one line: message and metadata.
    var errorLines: [String] {
        entries.filter { $0.level == .error }.map { entry in
            "\(entry.message) " + entry.metadata.map { "\($0.key)=\($0.value)" }.sorted().joined(separator: " ")
        }
    }
}
