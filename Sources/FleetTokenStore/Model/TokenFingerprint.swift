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
        self.init(digestPrefix: Self.digestPrefix(of: token))
    }

    /// The first 6 bytes of `token`'s SHA-256 digest, in the low 48 bits (first byte highest):
    /// what a fingerprint shows, in a form a token can keep in an atomic word.
    static func digestPrefix(of token: String) -> UInt64 {
        var token = token
        // Hashed in place: every sealed write and every token answer needs a fingerprint.
        let digest = token.withUTF8 { SHA256.hash(data: UnsafeRawBufferPointer($0)) }
        return digest.withUnsafeBytes { bytes in
            (0..<6).reduce(UInt64(0)) { prefix, index in prefix << 8 | UInt64(bytes[index]) }
        }
    }

    /// The fingerprint whose digest prefix is `prefix` (``digestPrefix(of:)``), written from a table.
    init(digestPrefix prefix: UInt64) {
        description = String(unsafeUninitializedCapacity: 12) { text in
            for index in 0..<12 {
                text[index] = Self.hexDigits[Int(truncatingIfNeeded: prefix >> UInt64(44 - 4 * index)) & 0x0f]
            }
            return 12
        }
    }

    private static let hexDigits = Array("0123456789abcdef".utf8)

    /// A fingerprint read back as stored (a sealed value carries its token's fingerprint).
    init(hex: String) {
        description = hex
    }
}
