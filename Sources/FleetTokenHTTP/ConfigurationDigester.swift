// Provider layer: the digest a fetcher gives of its configuration (TokenFetcher.configurationDigest),
// so that a stored failure can say which configuration failed without storing it in clear.

import Crypto
package import Foundation

/// SHA-256 over labelled, length-prefixed fields: no two different sequences of fields feed
/// the hash the same bytes (a field's end is never ambiguous, an absent field differs from an
/// empty one). The result is 64 lowercase hex digits, and reveals nothing of the values.
package struct ConfigurationDigester {
    private var hasher = SHA256()

    package init() {}

    /// Adds a field: its label, then its text (nil: absent).
    package mutating func add(_ label: String, _ value: String?) {
        add(label, value.map { Data($0.utf8) })
    }

    /// Adds a field: its label, then its bytes (nil: absent, e.g. a file that cannot be read).
    package mutating func add(_ label: String, _ bytes: Data?) {
        feed(Data(label.utf8))
        guard let bytes else {
            hasher.update(data: [0])
            return
        }
        hasher.update(data: [1])
        feed(bytes)
    }

    /// The digest of the fields added so far, in hex.
    package func finalize() -> String {
        hasher.finalize().map { String(format: "%02x", $0) }.joined()
    }

    private mutating func feed(_ bytes: Data) {
        withUnsafeBytes(of: UInt64(bytes.count).bigEndian) { hasher.update(bufferPointer: $0) }
        hasher.update(data: bytes)
    }
}
