// Transport layer: how HTTPTokenFetcher asks the customer's token provider (URL, method, body,
// headers, TLS, proxy, limits) and reads its answer.

public import FleetTokenStore
public import Foundation

/// How ``HTTPTokenFetcher`` asks the customer's token provider and reads its answer.
public struct HTTPTokenFetcherConfiguration: Sendable {
    /// How `TOKEN_EXPIRATION` is written (see `ProviderResponseFormat.ExpirationFormat`).
    public typealias ExpirationFormat = ProviderResponseFormat.ExpirationFormat

    /// The provider URL with `{kind}` and `{id}` placeholders; `{id}` is percent-encoded. It may
    /// go without `{id}` when the ``body`` names the subject.
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
    /// The request method. Default `GET`.
    public var method: ProviderRequestMethod = .get
    /// The request body with `{kind}` and `{id}` filled in per subject, and its content type;
    /// `POST` only. Nil sends no body.
    public var body: RequestBodyTemplate?
    /// The forward proxy, if any. Default `ProxySettings/direct`: the library does not read the
    /// environment by itself; pass `try ProxySettings.fromEnvironment(ProcessInfo.processInfo.environment)`
    /// to honour `HTTPS_PROXY`, `HTTP_PROXY` and `NO_PROXY` as token-agent does.
    public var proxy: ProxySettings = .direct

    /// A configuration for `urlTemplate` with the samples' field names.
    public init(urlTemplate: String) {
        self.urlTemplate = urlTemplate
    }

    /// How the answer is read: ``tokenKey``, ``expirationKey`` and ``expirationFormat``.
    public var responseFormat: ProviderResponseFormat {
        ProviderResponseFormat(tokenKey: tokenKey, expirationKey: expirationKey, expirationFormat: expirationFormat)
    }

    /// The token field for `kind` (see `ProviderResponseFormat.tokenField(for:)`).
    public func tokenField(for kind: TokenKind) -> String {
        responseFormat.tokenField(for: kind)
    }
}

/// A configuration ``HTTPTokenFetcher`` cannot work with.
public enum HTTPFetcherConfigurationError: Error, Sendable, Equatable, CustomStringConvertible {
    /// The template is not an http(s) URL.
    case invalidURL(String)
    /// Neither the template nor the body has `{id}`, so every subject would get the same token.
    case missingIDPlaceholder(String)
    /// Plain HTTP to a non-loopback host without `allowInsecureHTTP`.
    case insecureHTTP(host: String)
    /// A header name or value is unusable.
    case invalidHeader(String)
    /// A CA bundle, client certificate or key is unusable (named, with the problem).
    case tls(String)
    /// The method and body do not fit together (a body on a `GET`).
    case request(String)

    /// What is wrong and what to do.
    public var description: String {
        switch self {
        case .invalidURL(let template): "provider URL \"\(template)\" is not an http:// or https:// URL"
        case .missingIDPlaceholder(let template): "provider URL \"\(template)\" has no {id} placeholder, nor has a body template: every subject would get the same token"
        case .insecureHTTP(let host): "plain http:// to \(host) would send tokens unencrypted: use https://, or pass --allow-insecure-http for a trusted network"
        case .invalidHeader(let detail): "bad header: \(detail)"
        case .tls(let detail): "TLS set-up: \(detail)"
        case .request(let detail): "request: \(detail)"
        }
    }
}

/// The HTTP method of requests to the token provider.
public enum ProviderRequestMethod: String, Sendable, CaseIterable, CustomStringConvertible {
    /// `GET`: the URL names the subject (the Fleet Engine samples' way).
    case get = "GET"
    /// `POST`: the URL, the body (``HTTPTokenFetcherConfiguration/body``) or both name it.
    case post = "POST"

    /// `GET` or `POST`.
    public var description: String { rawValue }
}
