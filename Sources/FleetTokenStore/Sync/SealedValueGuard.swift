// Sync layer: a value that reaches the engine still sealed (its store holds encrypted tokens
// and was not wrapped in EncryptedTokenRepository) is never handed out as a token.

import Logging

/// Keeps a sealed value from being served as a token when an engine reads an encrypted store
/// without its key: the entry reads as missing, and the error says what to do.
enum SealedValueGuard {
    /// `entry`, without its token when the token's value is still sealed.
    static func checked(_ entry: TokenEntry?, logger: Logger) -> TokenEntry? {
        guard var entry, let value = entry.token?.value, value.hasPrefix(SealedTokenValue.prefix) else { return entry }
        logger.error("stored token is sealed and this engine was given no key: treated as missing; open the store with its key (EncryptedTokenRepository)", metadata: [
            "key": .string(entry.key.description), "key_id": .string(SealedTokenValue.keyID(ofStored: value) ?? "unknown"),
        ])
        entry.token = nil
        entry.tokenUnreadable = true
        return entry
    }
}
