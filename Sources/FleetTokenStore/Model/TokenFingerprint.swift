// Model layer: a short, non-reversible name for a token value, safe for logs, errors, metrics
// and admin output.

import Crypto

/// A short, non-reversible name for a token value, safe for logs, errors, metrics and admin output.
///
/// It is the first 6 bytes of the token's SHA-256 digest, in hex: enough to tell tokens apart
/// in a log, far too little to recover or forge one.
public struct TokenFingerprint: Hashable, Sendable, CustomStringConvertible {
    /// Twelve lowercase hex digits.
    public let description: String

    /// The fingerprint of `token`.
    public init(of token: String) {
        var token = token
        // Hashed in place and written from a table: every sealed write computes one.
        let digest = token.withUTF8 { SHA256.hash(data: UnsafeRawBufferPointer($0)) }
        description = digest.withUnsafeBytes { bytes in
            String(unsafeUninitializedCapacity: 12) { text in
                for index in 0..<6 {
                    text[2 * index] = Self.hexDigits[Int(bytes[index] >> 4)]
                    text[2 * index + 1] = Self.hexDigits[Int(bytes[index] & 0x0f)]
                }
                return 12
            }
        }
    }

    private static let hexDigits = Array("0123456789abcdef".utf8)

    /// A fingerprint read back as stored (a sealed value carries its token's fingerprint).
    init(hex: String) {
        description = hex
    }
}
