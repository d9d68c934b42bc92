// Encryption layer: what a store tells about which keys sealed its token values (without
// reading them), the value-only rewrite that sealing a plaintext store and re-keying use, the
// clean-up of the storage's copies of replaced values (owed durably until it has run), and the
// compare-and-delete of a value that does not open.

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
    ///
    /// A store whose storage keeps copies of replaced values (SQLite) records, in the same
    /// transaction, that ``discardReplacedValues()`` is owed (see
    /// ``replacedValuesAwaitDiscard()``), so a clean-up cut short is not forgotten.
    /// - Throws: ``TokenStoreError``; on failure nothing was changed, the record included.
    func replaceValues(_ replacements: [TokenValueReplacement]) async throws(TokenStoreError) -> Set<TokenKey>

    /// Removes `key`'s token only while its stored value is still `value` (one read before and
    /// found not to open), keeping the failure state as ``TokenRepository/removeToken(for:)``
    /// does: a token another process wrote since the read stays. Returns whether it removed.
    /// - Throws: ``TokenStoreError``; on failure nothing was changed.
    func removeToken(for key: TokenKey, ifValue value: String) async throws(TokenStoreError) -> Bool

    /// Clears what the storage may still hold of values replaced before (SQLite rewrites its
    /// file and empties its write-ahead log), as far as other connections allow, then clears
    /// the record that this was owed (``replacedValuesAwaitDiscard()``). What other
    /// connections kept from being cleared stays owed, for the next call.
    /// - Throws: ``TokenStoreError`` when the store cannot be rewritten (on SQLite a `VACUUM`
    ///   needs free space on the store's disk of about the store's size); the clean-up then
    ///   stays owed.
    func discardReplacedValues() async throws(TokenStoreError)

    /// Whether values replaced with ``replaceValues(_:)`` may still be in the storage because
    /// no ``discardReplacedValues()`` has finished since: a record kept in the store itself,
    /// set in the transaction of each replacement and cleared only once the clean-up has run,
    /// so one cut by a crash or a power cut, or failed (a full disk), is run by the next
    /// ``TokenValueResealer/prepare(keyring:)`` or ``TokenValueResealer/rekey(_:)`` even when no
    /// value is left to replace. One small read (on SQLite, of the file's header), whatever
    /// the store's size.
    ///
    /// The default implementation answers false: a store whose ``discardReplacedValues()``
    /// has nothing to do keeps no record (the in-memory store; PostgreSQL, whose replaced row
    /// versions only the server's vacuuming clears). A store that wraps another forwards it.
    /// - Throws: ``TokenStoreError`` when the store cannot be read.
    func replacedValuesAwaitDiscard() async throws(TokenStoreError) -> Bool
}

extension TokenSealingStore {
    /// False: this store records no clean-up owed (see
    /// ``TokenSealingStore/replacedValuesAwaitDiscard()``); a store whose storage keeps copies
    /// of replaced values, or that wraps such a store, implements it.
    /// - Throws: Nothing; typed as the requirement is.
    public func replacedValuesAwaitDiscard() async throws(TokenStoreError) -> Bool { false }
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
