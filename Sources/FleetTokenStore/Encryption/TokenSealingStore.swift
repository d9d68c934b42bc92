// Encryption layer: what a store tells about which keys sealed its token values (without
// reading them), the value-only rewrite that sealing a plaintext store and re-keying use, and
// the compare-and-delete of a value that does not open.

/// What a store tells about the keys its token values are sealed with, read from its
/// `value_key_id` column without opening a value, the rewrite of values alone, and the removal
/// of a value only while it is still the one read.
///
/// ``SQLiteTokenRepository`` and the PostgreSQL repository implement it; ``TokenValueResealer``
/// and ``EncryptedTokenRepository`` use it. Key ids are ``TokenEncryptionKey/id``s, or
/// ``plaintextKeyID`` for a value stored as it is.
public protocol TokenSealingStore: Sendable {
    /// The store's path or URL (without a password), for messages.
    var storeName: String { get }

    /// The key ids of the stored token values (``plaintextKeyID`` among them when some value is
    /// not sealed), found with a few index probes, not by reading every value.
    /// - Throws: ``TokenStoreError`` when the store cannot be read.
    func valueKeyIDs() async throws(TokenStoreError) -> Set<String>

    /// How many stored tokens are under each key id.
    /// - Throws: ``TokenStoreError`` when the store cannot be read.
    func valueKeyCounts() async throws(TokenStoreError) -> [String: Int]

    /// Keys whose token value is under key id `valueKeyID` (or, with `matching` false, under
    /// any other), in (kind, subject id) order after `after`, at most `limit`.
    /// - Throws: ``TokenStoreError`` when the store cannot be read.
    func tokenKeys(valueKeyID: String, matching: Bool, after: TokenKey?, limit: Int) async throws(TokenStoreError) -> [TokenKey]

    /// Replaces token values in one transaction, each only where the stored value is still
    /// the one it replaces (a value refreshed or purged meanwhile stays as it is); nothing else
    /// of a row changes. Returns the keys whose values were replaced.
    /// - Throws: ``TokenStoreError``; on failure nothing was changed.
    func replaceValues(_ replacements: [TokenValueReplacement]) async throws(TokenStoreError) -> Set<TokenKey>

    /// Removes `key`'s token only while its stored value is still `value` (one read before and
    /// found not to open), keeping the failure state as ``TokenRepository/removeToken(for:)``
    /// does: a token another process wrote since the read stays. Returns whether it removed.
    /// - Throws: ``TokenStoreError``; on failure nothing was changed.
    func removeToken(for key: TokenKey, ifValue value: String) async throws(TokenStoreError) -> Bool

    /// Clears what the storage may still hold of values replaced before (SQLite rewrites its
    /// file and empties its write-ahead log), as far as other connections allow.
    /// - Throws: ``TokenStoreError`` when the store cannot be rewritten.
    func discardReplacedValues() async throws(TokenStoreError)
}

/// The key id of a token value stored as it is, not sealed.
public let plaintextKeyID = "plaintext"

/// One token value to replace with another (see ``TokenSealingStore/replaceValues(_:)``).
public struct TokenValueReplacement: Sendable, Equatable {
    /// Whose token.
    public var key: TokenKey
    /// The stored value as read; the replacement applies only while it is still this.
    public var old: String
    /// The value to store instead.
    public var new: String

    /// Creates a replacement.
    public init(key: TokenKey, old: String, new: String) {
        self.key = key
        self.old = old
        self.new = new
    }
}
