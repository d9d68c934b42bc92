// Sync layer: the Fleet Engine SDKs' authorization contexts and errors, for code ported from them.

/// The Driver SDK's authorization context (`GMTDAuthorizationContext`): which vehicle the SDK
/// needs a token for.
public struct VehicleAuthorizationContext: Sendable, Equatable {
    /// The vehicle ID, as the SDK passes it.
    public var vehicleID: String?

    /// Creates a context.
    public init(vehicleID: String?) {
        self.vehicleID = vehicleID
    }
}

/// The Consumer SDK's authorization context (`GMTCAuthorizationContext`): which trip the SDK
/// needs a token for.
public struct TripAuthorizationContext: Sendable, Equatable {
    /// The trip ID, as the SDK passes it.
    public var tripID: String?

    /// Creates a context.
    public init(tripID: String?) {
        self.tripID = tripID
    }
}

/// The errors of the Fleet Engine samples' token providers, for code ported from them.
public enum AuthorizationProviderError: Error, Sendable, Equatable, CustomStringConvertible {
    /// No context, or a context without an id, was given.
    case missingAuthorizationContext
    /// The provider's answer lacked the token or the expiration.
    case missingData
    /// The id cannot name a token.
    case invalidContext(InvalidTokenKey)
    /// Any other reason no token could be had.
    case unavailable(TokenUnavailable)

    /// What happened.
    public var description: String {
        switch self {
        case .missingAuthorizationContext: "no authorization context (vehicle or trip ID) was given"
        case .missingData: "the token provider's answer lacks the token or its expiration"
        case .invalidContext(let reason): reason.description
        case .unavailable(let reason): reason.description
        }
    }
}

extension TokenSyncEngine {
    /// The samples' `fetchToken(with:completion:)` for the Driver SDK: calls `completion` with
    /// the vehicle's token, or with ``AuthorizationProviderError``. Tokens are cached per
    /// vehicle ID, so a changed ID simply asks for another key.
    public func fetchToken(with context: VehicleAuthorizationContext?,
                           completion: @escaping @Sendable (String?, (any Error)?) -> Void) {
        fetchSeedToken(kind: .vehicle, id: context?.vehicleID, completion: completion)
    }

    /// The samples' `fetchToken(with:completion:)` for the Consumer SDK, keyed by trip ID.
    public func fetchToken(with context: TripAuthorizationContext?,
                           completion: @escaping @Sendable (String?, (any Error)?) -> Void) {
        fetchSeedToken(kind: .trip, id: context?.tripID, completion: completion)
    }

    private func fetchSeedToken(kind: TokenKind, id: String?,
                                completion: @escaping @Sendable (String?, (any Error)?) -> Void) {
        guard let id, !id.isEmpty else {
            completion(nil, AuthorizationProviderError.missingAuthorizationContext)
            return
        }
        let key: TokenKey
        do {
            key = try TokenKey(kind: kind, subjectID: id)
        } catch {
            completion(nil, AuthorizationProviderError.invalidContext(error))
            return
        }
        Task {
            do throws(TokenUnavailable) {
                completion(try await token(for: key).value, nil)
            } catch {
                if error.reason.providerError?.code == .missingData {
                    completion(nil, AuthorizationProviderError.missingData)
                } else {
                    completion(nil, AuthorizationProviderError.unavailable(error))
                }
            }
        }
    }
}
