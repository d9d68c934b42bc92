// Transport layer: reads a provider's answer for HTTPTokenFetcher with the configured
// ProviderResponseFormat, and says once when `auto` probably guessed the expiry's format wrong.

import FleetTokenStore
import Foundation
import Logging
import Synchronization

/// Reads the provider's answer with the configured ``ProviderResponseFormat`` and, for `auto`,
/// warns once when the stated expiry and the JWT's `exp` disagree.
struct ProviderResponseParser {
    let configuration: HTTPTokenFetcherConfiguration
    let logger: Logger
    let skewWarned: OnceFlag

    func parse(_ data: Data, for key: TokenKey, now: Date, providerDate: Date?) throws(TokenProviderError) -> FetchedToken {
        var fetched = try configuration.responseFormat.parse(data, for: key, now: now, providerDate: providerDate)
        if configuration.expirationFormat == .auto, let stated = fetched.statedExpiry {
            // Decoded here once; the engine's validation reuses it.
            let claims = FetchedToken.decodeClaims(of: fetched.value)
            fetched.decodedClaims = claims
            crossCheck(stated, exp: try? claims?.get().expiresAt)
        }
        return fetched
    }

    /// Warns (once) when the auto-detected expiry and the JWT's own `exp` disagree by more than
    /// five minutes: the format is probably not what `auto` guessed. The engine uses the
    /// earlier of the two either way.
    private func crossCheck(_ stated: Date, exp: Date?) {
        guard let exp, abs(exp.timeIntervalSince(stated)) > 300 else { return }
        guard skewWarned.claim() else { return }
        logger.warning("TOKEN_EXPIRATION read with the auto expiration format disagrees with the token's exp; set the expiration format explicitly", metadata: [
            "interpreted": .string(stated.formatted(.iso8601)), "jwt_exp": .string(exp.formatted(.iso8601)),
        ])
    }
}

/// True the first time only: for warnings worth saying once per process.
final class OnceFlag: Sendable {
    private let used = Mutex(false)

    func claim() -> Bool {
        used.withLock { used in
            defer { used = true }
            return !used
        }
    }
}
