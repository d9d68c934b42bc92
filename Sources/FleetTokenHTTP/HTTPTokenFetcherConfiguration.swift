public import FleetTokenStore
public import Foundation

/// How ``HTTPTokenFetcher`` asks the customer's token provider and reads its answer.
public struct HTTPTokenFetcherConfiguration: Sendable {
    /// How `TOKEN_EXPIRATION` is written (see ``ProviderResponseFormat/ExpirationFormat``).
    public typealias ExpirationFormat = ProviderResponseFormat.ExpirationFormat

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
    /// Trusted CAs and the client certificate (mutual TLS), re-read when the files change.
    public var tls = ProviderTLSFiles()

    /// A configuration for `urlTemplate` with the samples' field names.
    public init(urlTemplate: String) {
        self.urlTemplate = urlTemplate
    }

    /// How the answer is read: ``tokenKey``, ``expirationKey`` and ``expirationFormat``.
    public var responseFormat: ProviderResponseFormat {
        ProviderResponseFormat(tokenKey: tokenKey, expirationKey: expirationKey, expirationFormat: expirationFormat)
    }

    /// The token field for `kind` (see ``ProviderResponseFormat/tokenField(for:)``).
    public func tokenField(for kind: TokenKind) -> String {
        responseFormat.tokenField(for: kind)
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
    /// A CA bundle, client certificate or key is unusable (named, with the problem).
    case tls(String)

    /// What is wrong and what to do.
    public var description: String {
        switch self {
        case .invalidURL(let template): "provider URL \"\(template)\" is not an http:// or https:// URL"
        case .missingIDPlaceholder(let template): "provider URL \"\(template)\" has no {id} placeholder: every subject would get the same token"
        case .insecureHTTP(let host): "plain http:// to \(host) would send tokens unencrypted: use https://, or pass --allow-insecure-http for a trusted network"
        case .invalidHeader(let detail): "bad header: \(detail)"
        case .tls(let detail): "TLS set-up: \(detail)"
        }
    }
}
