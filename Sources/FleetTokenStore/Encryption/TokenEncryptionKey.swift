// Encryption layer: one AES-256 key that seals token values at rest, and its short public id.

import Crypto
public import Foundation

/// A 256-bit key that seals token values at rest (AES-GCM), known by its ``id``.
///
/// The key never leaves memory: the store keeps only the ``id`` beside each sealed value, so an
/// operator (and an error message) can tell which key a store needs without holding it.
/// Load one with ``load(file:credentialsDirectory:)`` or make one from 32 bytes with ``init(bytes:)``.
public struct TokenEncryptionKey: Sendable {
    /// The key's id: 16 lowercase hex digits of a hash of the key, stored with every value it
    /// seals. Not reversible, and safe to log.
    public let id: String
    let symmetricKey: SymmetricKey

    /// The key from exactly 32 bytes.
    /// - Throws: ``TokenKeyFileError`` with code ``TokenKeyFileError/Code/wrongLength`` when
    ///   `bytes` is not 32 bytes long (its path is empty).
    public init(bytes: some ContiguousBytes) throws(TokenKeyFileError) {
        let count = bytes.withUnsafeBytes(\.count)
        guard count == Self.byteCount else { throw .wrongLength(path: "", byteCount: count) }
        symmetricKey = SymmetricKey(data: bytes)
        id = Self.id(of: symmetricKey)
    }

    /// A new random key (for tests and for tools that make key files).
    public static func random() -> TokenEncryptionKey {
        // 32 bytes, as the initializer requires: it cannot throw.
        try! TokenEncryptionKey(bytes: SymmetricKey(size: .bits256).withUnsafeBytes { Data($0) })
    }

    /// The key in a key file: 32 raw bytes, or their base64 text (surrounding white space ignored).
    ///
    /// The file must be a regular file owned by the running user and give no access to group or
    /// others, since whoever reads it reads every token sealed with it, in directories no other
    /// user may change (root's are trusted; a sticky one, as /tmp, too). A file under
    /// `credentialsDirectory` (systemd's `$CREDENTIALS_DIRECTORY`) is exempt from the owner and
    /// mode rules: systemd itself limits it to the service's user, and may do so with an ACL on
    /// a root-owned file.
    /// - Throws: ``TokenKeyFileError`` saying what is wrong with the file and how to fix it.
    public static func load(file path: String, credentialsDirectory: String? = nil) throws(TokenKeyFileError) -> TokenEncryptionKey {
        // O_NONBLOCK: a FIFO in the key's place is refused below, not waited on for ever.
        let descriptor = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK)
        guard descriptor >= 0 else { throw .unreadable(path: path, reason: String(cString: strerror(errno))) }
        defer { close(descriptor) }
        var status = stat()
        guard fstat(descriptor, &status) == 0 else { throw .unreadable(path: path, reason: String(cString: strerror(errno))) }
        guard status.st_mode & S_IFMT == S_IFREG else { throw .notAFile(path: path) }
        let exempt = credentialsDirectory.map { directory in
            URL(fileURLWithPath: path).standardizedFileURL.deletingLastPathComponent().path
                == URL(fileURLWithPath: directory).standardizedFileURL.path
        } ?? false
        if !exempt {
            guard status.st_uid == geteuid() else { throw .notOwnedByUser(path: path, ownerID: status.st_uid, userID: geteuid()) }
            let mode = Int(status.st_mode & 0o777)
            guard mode & 0o077 == 0 else { throw .modeTooOpen(path: path, mode: mode) }
            // As for steering files: a directory on the way that another user may change lets
            // them put another file (one of this user's, or a FIFO) in the key's place.
            if let unsafe = SteeringFileCheck.unsafeDirectory(onTheWayTo: path, thing: "the key file") {
                throw .unsafeDirectory(path: path, reason: unsafe.reason)
            }
        }
        // A key file is 32 bytes, or 44 characters of base64 and a newline: anything much
        // longer is the wrong file.
        var buffer = [UInt8](repeating: 0, count: 1024)
        let count = read(descriptor, &buffer, buffer.count)
        guard count >= 0 else { throw .unreadable(path: path, reason: String(cString: strerror(errno))) }
        let bytes = Array(buffer[..<count])
        if bytes.count == byteCount, let key = try? TokenEncryptionKey(bytes: bytes) { return key }
        let text = String(decoding: bytes, as: UTF8.self).trimmingCharacters(in: .whitespacesAndNewlines)
        if let decoded = Data(base64Encoded: text), decoded.count == byteCount, let key = try? TokenEncryptionKey(bytes: decoded) {
            return key
        }
        throw .wrongLength(path: path, byteCount: max(bytes.count, Int(status.st_size)))
    }

    /// Bytes in a key.
    static let byteCount = 32

    private static func id(of key: SymmetricKey) -> String {
        // A keyed hash of a fixed label: the id says nothing about the key, and no other use of
        // the key (AES-GCM) ever produces it.
        let tag = HMAC<SHA256>.authenticationCode(for: Data("FleetTokenStore key id v1".utf8), using: key)
        return tag.prefix(8).map { String(format: "%02x", $0) }.joined()
    }
}

/// Why a key file was refused: what is wrong and what to do.
public struct TokenKeyFileError: Error, Sendable, Equatable, CustomStringConvertible {
    /// What went wrong. More codes may come: match them with `==`, keep a `default`.
    public struct Code: Hashable, Sendable, CustomStringConvertible {
        fileprivate let name: String
        /// The file cannot be opened or read.
        public static let unreadable = Code(name: "unreadable")
        /// The path is a directory or special file.
        public static let notAFile = Code(name: "notAFile")
        /// The file belongs to another user.
        public static let notOwnedByUser = Code(name: "notOwnedByUser")
        /// The file grants access to group or others.
        public static let modeTooOpen = Code(name: "modeTooOpen")
        /// The file holds neither 32 bytes nor their base64 text.
        public static let wrongLength = Code(name: "wrongLength")
        /// A directory on the way to the file lets another user replace it.
        public static let unsafeDirectory = Code(name: "unsafeDirectory")
        /// The code's stable name.
        public var description: String { name }
    }

    /// What went wrong.
    public let code: Code
    /// The key file.
    public let path: String
    /// What the system said (``Code/unreadable``), or which directory is unsafe and why
    /// (``Code/unsafeDirectory``).
    public let reason: String?
    /// The file's permission bits (``Code/modeTooOpen``).
    package let mode: Int?
    /// The file's owner and the running user (``Code/notOwnedByUser``).
    package let ownerID: UInt32?, userID: UInt32?
    /// The bytes read (``Code/wrongLength``).
    package let byteCount: Int?

    private init(_ code: Code, path: String, reason: String? = nil, mode: Int? = nil, ownerID: UInt32? = nil,
                 userID: UInt32? = nil, byteCount: Int? = nil) {
        self.code = code
        self.path = path
        self.reason = reason
        self.mode = mode
        self.ownerID = ownerID
        self.userID = userID
        self.byteCount = byteCount
    }

    static func unreadable(path: String, reason: String) -> Self { Self(.unreadable, path: path, reason: reason) }
    static func notAFile(path: String) -> Self { Self(.notAFile, path: path) }
    static func notOwnedByUser(path: String, ownerID: UInt32, userID: UInt32) -> Self {
        Self(.notOwnedByUser, path: path, ownerID: ownerID, userID: userID)
    }
    static func modeTooOpen(path: String, mode: Int) -> Self { Self(.modeTooOpen, path: path, mode: mode) }
    static func wrongLength(path: String, byteCount: Int) -> Self { Self(.wrongLength, path: path, byteCount: byteCount) }
    static func unsafeDirectory(path: String, reason: String) -> Self { Self(.unsafeDirectory, path: path, reason: reason) }

    /// What happened and what to do next. Never the file's content.
    public var description: String {
        switch code {
        case .unreadable: "cannot read encryption key file \(path) (\(reason ?? "")): check the path and that this user may read it"
        case .notAFile: "encryption key file \(path) is a directory or special file: give the path of the key file itself"
        case .notOwnedByUser:
            "encryption key file \(path) belongs to uid \(ownerID ?? 0), not to this user (uid \(userID ?? 0)): chown it to the user that runs this program (whoever owns it can replace the key)"
        case .unsafeDirectory: "encryption key file \(path) \(reason ?? "is under a directory another user may change")"
        case .modeTooOpen:
            "encryption key file \(path) has mode \(String(mode ?? 0, radix: 8)), so other users can read the key to every stored token: chmod 600 it"
        default:
            "encryption key file \(path) holds \(byteCount ?? 0) bytes, not a key: it must hold 32 random bytes, raw or as base64 text (make one with: head -c 32 /dev/urandom | base64 > FILE)"
        }
    }
}
