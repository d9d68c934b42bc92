// Encryption layer: the keys a process holds: one to seal with, others only to open (rotation).

import Foundation

/// The keys a process seals and opens token values with: the ``primary`` seals every new value;
/// every key, primary included, opens the values sealed with it. Keeping the old key as a
/// second key while ``TokenValueResealer`` (`tokenctl rekey`) moves values to the new one is
/// how a key is rotated.
public struct TokenKeyring: Sendable {
    /// The key new values are sealed with.
    public let primary: TokenEncryptionKey
    /// Every key by id, the primary included.
    let keysByID: [String: TokenEncryptionKey]

    /// A keyring sealing with `primary` and also opening values sealed with `others` (a key
    /// given twice counts once).
    public init(primary: TokenEncryptionKey, others: [TokenEncryptionKey] = []) {
        self.primary = primary
        var keys: [String: TokenEncryptionKey] = [:]
        for key in [primary] + others where keys[key.id] == nil { keys[key.id] = key }
        keysByID = keys
    }

    /// The ids of every key, the primary first.
    public var ids: [String] {
        [primary.id] + keysByID.keys.filter { $0 != primary.id }.sorted()
    }

    /// The key with `id`, if the keyring holds it.
    public func key(id: String) -> TokenEncryptionKey? { keysByID[id] }

    /// The name of systemd's credential that holds the key when no key file is given.
    package static let credentialName = "token-store-key"

    /// The keyring of key `files` (the first is the primary), or, when none is given, of the
    /// systemd credential `token-store-key` in `$CREDENTIALS_DIRECTORY` when `environment`
    /// names one and it exists; nil when neither gives a key (values are then stored as they are).
    /// - Throws: ``TokenKeyFileError`` for the first key file that is refused.
    public static func load(files: [String], environment: [String: String]) throws(TokenKeyFileError) -> TokenKeyring? {
        let credentials = environment["CREDENTIALS_DIRECTORY"].flatMap { $0.isEmpty ? nil : $0 }
        var paths = files
        if paths.isEmpty, let credentials {
            let path = URL(fileURLWithPath: credentials).appendingPathComponent(credentialName).path
            if FileManager.default.fileExists(atPath: path) { paths = [path] }
        }
        var keys: [TokenEncryptionKey] = []
        for path in paths { keys.append(try TokenEncryptionKey.load(file: path, credentialsDirectory: credentials)) }
        guard let primary = keys.first else { return nil }
        return TokenKeyring(primary: primary, others: Array(keys.dropFirst()))
    }
}
