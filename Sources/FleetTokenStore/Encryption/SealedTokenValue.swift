// Encryption layer: the text a sealed token value is stored as, and sealing and opening it.

import Crypto
import Foundation

/// A token value as an encrypted store keeps it:
/// `sealed:v1:<key id>:<fingerprint>:<base64 of nonce, ciphertext and tag>`.
///
/// AES-GCM with a random 96-bit nonce per write, over the token packed by `SealedPlaintext` (a
/// JWT as its segments' bytes, so the sealed text is about as long as the token). The associated data binds the ciphertext to
/// the token's kind, subject id, key id and fingerprint, so a value copied onto another row (or
/// relabelled with another key id) does not open. The key id and fingerprint stay readable, so
/// `tokenctl list` and `stats` need no key. Anything not in this form is a plaintext value.
public enum SealedTokenValue {
    /// What every sealed value starts with; the schema's `value_key_id` column reads the key id
    /// after it.
    public static let prefix = "sealed:v1:"

    /// The parts of a stored sealed value, or nil when `stored` is a plaintext value.
    struct Envelope {
        let keyID: Substring
        let fingerprint: Substring
        let payload: Substring
    }

    static func envelope(_ stored: String) -> Envelope? {
        guard stored.hasPrefix(prefix) else { return nil }
        let parts = stored.dropFirst(prefix.count).split(separator: ":", maxSplits: 2, omittingEmptySubsequences: false)
        guard parts.count == 3, parts[0].count == 16, parts[1].count == 12 else { return nil }
        return Envelope(keyID: parts[0], fingerprint: parts[1], payload: parts[2])
    }

    /// The id of the key that sealed `stored`, or nil for a plaintext value.
    package static func keyID(ofStored stored: String) -> String? {
        envelope(stored).map { String($0.keyID) }
    }

    /// The fingerprint of the token in `stored`, sealed or not: what logs and `tokenctl` show.
    package static func fingerprint(ofStored stored: String) -> TokenFingerprint {
        envelope(stored).map { TokenFingerprint(hex: String($0.fingerprint)) } ?? TokenFingerprint(of: stored)
    }

    /// `value`, the token of `key`, sealed with `encryptionKey`. `fingerprint` is the value's,
    /// when the caller holds it already (a ``StoredToken`` keeps its own).
    static func seal(_ value: String, for key: TokenKey, with encryptionKey: TokenEncryptionKey,
                     fingerprint known: TokenFingerprint? = nil) -> String {
        let fingerprint = (known ?? TokenFingerprint(of: value)).description
        let data = associatedData(key, keyID: encryptionKey.id, fingerprint: fingerprint)
        // AES-GCM with a fresh random nonce cannot fail for a 256-bit key and this input size.
        let box = try! AES.GCM.seal(SealedPlaintext.pack(value), using: encryptionKey.symmetricKey, authenticating: data)
        let payload = box.combined!.base64EncodedString()
        var sealed = ""
        sealed.reserveCapacity(prefix.utf8.count + 30 + payload.utf8.count)
        sealed += prefix
        sealed += encryptionKey.id
        sealed += ":"
        sealed += fingerprint
        sealed += ":"
        sealed += payload
        return sealed
    }

    /// What opening a stored value gave.
    package enum Opened: Sendable, Equatable {
        /// The value was sealed and opened.
        case opened(String, keyID: String)
        /// The value was stored as it is (not sealed).
        case plaintext(String)
        /// The value was sealed with a key the keyring does not hold.
        case missingKey(String)
        /// The value was sealed with a key the keyring holds but does not open: altered, or
        /// written for another row.
        case failed(keyID: String)
    }

    /// `stored`, the stored value of `key`'s token, opened with `keyring` (none: only a
    /// plaintext value opens).
    package static func open(_ stored: String, for key: TokenKey, with keyring: TokenKeyring?) -> Opened {
        guard let envelope = envelope(stored) else {
            // A value that starts like a sealed one but is malformed is a damaged sealed value.
            return stored.hasPrefix(prefix) ? .failed(keyID: "unknown") : .plaintext(stored)
        }
        let keyID = String(envelope.keyID)
        guard let encryptionKey = keyring?.key(id: keyID) else { return .missingKey(keyID) }
        guard let combined = Data(base64Encoded: String(envelope.payload)),
              let box = try? AES.GCM.SealedBox(combined: combined),
              let plain = try? AES.GCM.open(box, using: encryptionKey.symmetricKey,
                                            authenticating: associatedData(key, keyID: keyID, fingerprint: String(envelope.fingerprint))),
              let value = SealedPlaintext.unpack(Array(plain))
        else { return .failed(keyID: keyID) }
        return .opened(value, keyID: keyID)
    }

    private static func associatedData(_ key: TokenKey, keyID: String, fingerprint: String) -> [UInt8] {
        // NUL-separated: no kind, subject id (validated printable) or hex id contains a NUL.
        var data: [UInt8] = []
        data.reserveCapacity(64 + key.subjectID.utf8.count)
        for part in [associatedDataLabel, key.kind.rawValue, key.subjectID, keyID, fingerprint] {
            if !data.isEmpty { data.append(0) }
            data.append(contentsOf: part.utf8)
        }
        return data
    }

    private static let associatedDataLabel = "FleetTokenStore sealed v1"
}
