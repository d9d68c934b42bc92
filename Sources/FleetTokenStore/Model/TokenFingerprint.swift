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
        let digest = SHA256.hash(data: Array(token.utf8))
        var text = ""
        text.reserveCapacity(12)
        for byte in digest.prefix(6) {
            let hex = String(byte, radix: 16)
            if hex.count == 1 { text += "0" }
            text += hex
        }
        description = text
    }

    /// A fingerprint read back as stored (a sealed value carries its token's fingerprint).
    init(hex: String) {
        description = hex
    }
}
