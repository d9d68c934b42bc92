// tokenctl's operator hints: the library says what to fix in its own terms (choose another
// store path, migrate the store); tokenctl adds which of its options or commands does it.

import FleetTokenStore

/// The option or command that fixes what a store error says, appended to its message.
enum OperatorHints {
    /// The error's message, with tokenctl's hint as `(hint)` when it has one.
    static func describe(_ error: TokenStoreError) -> String {
        hint(for: error).map { "\(error.description) (\($0))" } ?? error.description
    }

    private static func hint(for error: TokenStoreError) -> String? {
        switch error.code {
        case .directoryMissing, .directoryNotWritable: "--db or TOKEN_STORE_DB sets the store path"
        case .databaseUnavailable: "--db or TOKEN_STORE_DB sets the database URL"
        case .storeMissing: "check --db / TOKEN_STORE_DB; beside an installed agent, --config /etc/token-agent/token-agent.yaml finds its store; or create one with `tokenctl migrate`"
        case .storeOlderThanBuild: "run `tokenctl migrate`, or start the agent, which migrates"
        case .symbolicLink where error.file == error.path: error.target.map { "--db \($0)" }
        case .encryptionKeyMissing: "--encryption-key-file KEY (repeatable) gives the keys"
        default: nil
        }
    }
}
