// Test kit layer: the in-memory repository as a TokenSealingStore, so encryption can be tested
// (and embedded) without a file: key ids are read from the stored values as SQL reads them.

public import FleetTokenStore

extension InMemoryTokenRepository: TokenSealingStore {
    /// The store's ``location``.
    public var storeName: String { location }

    /// The key ids of the stored values.
    /// - Throws: `TokenStoreError.closed(path:)` after ``close()``.
    public func valueKeyIDs() async throws(TokenStoreError) -> Set<String> {
        Set(try valueKeyCounts().keys)
    }

    /// How many tokens are under each key id.
    /// - Throws: `TokenStoreError.closed(path:)` after ``close()``.
    public func valueKeyCounts() throws(TokenStoreError) -> [String: Int] {
        try read { state in
            var counts: [String: Int] = [:]
            for entry in state.entries.values {
                if let value = entry.token?.value { counts[Self.valueKeyID(value), default: 0] += 1 }
            }
            return counts
        }
    }

    /// Keys whose value is (or is not) under `valueKeyID`, in key order after `after`.
    /// - Throws: `TokenStoreError.closed(path:)` after ``close()``.
    public func tokenKeys(valueKeyID: String, matching: Bool, after: TokenKey?, limit: Int) async throws(TokenStoreError) -> [TokenKey] {
        try read { state in
            Array(state.sortedEntries(after: after).lazy.filter { entry in
                guard let value = entry.token?.value else { return false }
                return (Self.valueKeyID(value) == valueKeyID) == matching
            }.map(\.key).prefix(max(0, limit)))
        }
    }

    /// Replaces values still as read, all at once.
    /// - Throws: `TokenStoreError.closed(path:)` after ``close()``; nothing was changed then.
    public func replaceValues(_ replacements: [TokenValueReplacement]) async throws(TokenStoreError) -> Set<TokenKey> {
        try write { state in
            var replaced: Set<TokenKey> = []
            for replacement in replacements {
                guard var entry = state.entries[replacement.key], entry.token?.value == replacement.old else { continue }
                entry.token?.value = replacement.new
                state.set(replacement.key, entry)
                replaced.insert(replacement.key)
            }
            return replaced
        }
    }

    /// Removes `key`'s token while its value is still `value`, keeping its failure state.
    /// - Throws: `TokenStoreError.closed(path:)` after ``close()``; nothing was changed then.
    public func removeToken(for key: TokenKey, ifValue value: String) async throws(TokenStoreError) -> Bool {
        try write { state in
            guard state.entries[key]?.token?.value == value else { return false }
            state.removeToken(for: key)
            return true
        }
    }

    /// Nothing: memory keeps no copies of replaced values.
    public func discardReplacedValues() async throws(TokenStoreError) {}

    /// The key id the SQL stores derive from a value (the `value_key_id` column).
    private static func valueKeyID(_ value: String) -> String {
        SealedTokenValue.keyID(ofStored: value) ?? plaintextKeyID
    }
}
