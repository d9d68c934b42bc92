// token-agent's operator hints: the libraries say what to fix in their own terms (trust the CA,
// choose another store path); the agent adds which of its options does it when it prints one
// of their errors.

import FleetTokenHTTP
import FleetTokenService
import TokenAgentRuntime
import FleetTokenStore

/// The option that fixes what a library error says, appended to its message as `(hint)`.
enum OperatorHints {
    /// The error's message, with the agent's hint when it has one.
    static func describe(_ error: any Error) -> String {
        let message = String(describing: error)
        return hint(for: error).map { "\(message) (\($0))" } ?? message
    }

    static func hint(for error: any Error) -> String? {
        switch error {
        case let error as TokenUnavailable:
            if let provider = error.reason.providerError { return hint(for: provider) }
            return error.reason.storeError.flatMap { hint(for: $0) }
        case let error as TokenProviderError: return hint(for: error)
        case let error as TokenStoreError: return hint(for: error)
        case let error as HTTPFetcherConfigurationError:
            return error.code == .insecureHTTP ? "--allow-insecure-http allows it" : nil
        case let error as TokenAPIError: return hint(for: error)
        case let error as TokenFileSinkError: return "--sink sets the directory, now \(error.directory)"
        default: return nil
        }
    }

    private static func hint(for error: TokenProviderError) -> String? {
        hint(forKind: error.kind)
    }

    /// The hint for a provider error known by its kind only (a failure read from the store).
    static func hint(forKind kind: String) -> String? {
        switch kind {
        case TokenProviderError.Code.tlsCertificate.description:
            "--ca-file or --extra-ca-file for the CA; --client-cert and --client-key for the client certificate"
        case TokenProviderError.Code.missingData.description: "check --token-key / --expiration-key"
        default: nil
        }
    }

    private static func hint(for error: TokenStoreError) -> String? {
        switch error.code {
        case .directoryMissing, .directoryNotWritable: "--db or TOKEN_STORE_DB sets the store path"
        case .databaseUnavailable: "--db or TOKEN_STORE_DB sets the database URL"
        case .symbolicLink where error.file == error.path: error.target.map { "--db \($0)" }
        case .encryptionKeyMissing: "--encryption-key-file KEY (repeatable) gives the keys; under systemd, the credential token-store-key"
        default: nil
        }
    }

    private static func hint(for error: TokenAPIError) -> String? {
        switch error.code {
        case .nonLoopbackAddress: "--allow-non-loopback-listen allows them"
        case .socketDirectoryMissing: "systemd: RuntimeDirectory=token-agent"
        case .socketInUse: "a running token-agent? --listen chooses another path"
        default: nil
        }
    }
}
