public import FleetTokenStore
public import Foundation

/// How ``HTTPTokenFetcher`` asks the customer's token provider and reads its answer.
public struct HTTPTokenFetcherConfiguration: Sendable {
    /// How `TOKEN_EXPIRATION` is written. The Fleet Engine samples disagree: the Swift sample
    /// reads absolute Unix seconds, the Objective-C sample seconds from now.
    public enum ExpirationFormat: String, Sendable, CaseIterable {
        /// Tell the formats apart by magnitude (see ``HTTPTokenFetcherConfiguration/ExpirationFormat/interpret(_:now:)``)
        /// and cross-check with the JWT `exp`.
        case auto
        /// Absolute Unix time in seconds.
        case epochSeconds = "epoch-seconds"
        /// Absolute Unix time in milliseconds.
        case epochMillis = "epoch-millis"
        /// Seconds from now.
        case relativeSeconds = "relative-seconds"

        /// The absolute expiry `value` means at `now` in this format.
        ///
        /// `auto`: above 10^11 it is milliseconds (10^11 s is the year 5138), above 10^9 it is
        /// seconds since 1970 (10^9 s is 2001), below it is seconds from now (10^9 s is 31 years).
        public func interpret(_ value: Double, now: Date) -> Date {
            switch self {
            case .epochSeconds: Date(timeIntervalSince1970: value)
            case .epochMillis: Date(timeIntervalSince1970: value / 1000)
            case .relativeSeconds: now.addingTimeInterval(value)
            case .auto:
                value >= 1e11 ? Date(timeIntervalSince1970: value / 1000)
                    : value >= 1e9 ? Date(timeIntervalSince1970: value) : now.addingTimeInterval(value)
            }
        }
    }

    /// The provider URL with `{kind}` and `{id}` placeholders; `{id}` is percent-encoded.
    public var urlTemplate: String
    /// Headers sent with every request.
    public var headers: [(name: String, value: String)] = []
    /// Headers whose value is read from a file, re-read when the file changes (an agent's own
    /// credential, rotated on disk).
    public var headerFiles: [(name: String, path: String)] = []
    /// One token field name for every kind, overriding the per-kind defaults.
    public var tokenKey: String?
    /// The expiration field name. Default `TOKEN_EXPIRATION`; nil uses the JWT `exp` only.
    public var expirationKey: String? = "TOKEN_EXPIRATION"
    /// How to read the expiration field.
    public var expirationFormat: ExpirationFormat = .auto
    /// Largest accepted body. Default 1 MiB.
    public var maximumBodyBytes = 1 << 20
    /// Connect timeout. Default 5 s.
    public var connectTimeout: TimeInterval = 5
    /// Whole-request timeout. Default 15 s.
    public var totalTimeout: TimeInterval = 15
    /// Allow plain `http://` to hosts other than loopback.
    public var allowInsecureHTTP = false

    /// A configuration for `urlTemplate` with the samples' field names.
    public init(urlTemplate: String) {
        self.urlTemplate = urlTemplate
    }

    /// The token field for `kind`: ``tokenKey`` if set, else the samples' name
    /// (`VEHICLE_TOKEN_KEY`, `TRIP_TOKEN_KEY`; `DELIVERY_VEHICLE_TOKEN_KEY`, `TASK_TOKEN_KEY`).
    public func tokenField(for kind: TokenKind) -> String {
        if let tokenKey { return tokenKey }
        switch kind {
        case .vehicle: return "VEHICLE_TOKEN_KEY"
        case .trip: return "TRIP_TOKEN_KEY"
        case .deliveryVehicle: return "DELIVERY_VEHICLE_TOKEN_KEY"
        case .task: return "TASK_TOKEN_KEY"
        }
    }
}

/// A configuration ``HTTPTokenFetcher`` cannot work with.
public enum HTTPFetcherConfigurationError: Error, Sendable, Equatable, CustomStringConvertible {
    /// The template is not an http(s) URL.
    case invalidURL(String)
    /// The template lacks `{id}`, so every subject would get the same token.
    case missingIDPlaceholder(String)
    /// Plain HTTP to a non-loopback host without `allowInsecureHTTP`.
    case insecureHTTP(host: String)
    /// A header name or value is unusable.
    case invalidHeader(String)

    /// What is wrong and what to do.
    public var description: String {
        switch self {
        case .invalidURL(let template): "provider URL \"\(template)\" is not an http:// or https:// URL"
        case .missingIDPlaceholder(let template): "provider URL \"\(template)\" has no {id} placeholder: every subject would get the same token"
        case .insecureHTTP(let host): "plain http:// to \(host) would send tokens unencrypted: use https://, or pass --allow-insecure-http for a trusted network"
        case .invalidHeader(let detail): "bad header: \(detail)"
        }
    }
}
