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

/// A configuration ``HTTPTokenFetcher`` cannot work with: thrown when the fetcher is made (or
/// its configuration checked), before any request.
///
/// Check ``code`` against the static values of ``Code`` (`error.code == .insecureHTTP`).
/// Messages speak of the configuration's properties, never of a program's flags.
public struct HTTPFetcherConfigurationError: Error, Sendable, Equatable, CustomStringConvertible {
    /// What is wrong. More codes may come: match them with `==`, keep a `default`.
    public struct Code: Hashable, Sendable, CustomStringConvertible {
        fileprivate enum Value: String, Sendable { case invalidURL, missingIDPlaceholder, insecureHTTP, invalidHeader, tls, request }

        fileprivate let value: Value

        /// The URL template is not an http(s) URL.
        public static let invalidURL = Code(value: .invalidURL)
        /// Neither the template nor the body has `{id}`.
        public static let missingIDPlaceholder = Code(value: .missingIDPlaceholder)
        /// Plain HTTP to a non-loopback host without ``HTTPTokenFetcherConfiguration/allowInsecureHTTP``.
        public static let insecureHTTP = Code(value: .insecureHTTP)
        /// A header name or value is unusable.
        public static let invalidHeader = Code(value: .invalidHeader)
        /// A CA bundle, client certificate or key is unusable.
        public static let tls = Code(value: .tls)
        /// The method and body do not fit together.
        public static let request = Code(value: .request)

        /// The code's name, e.g. `insecureHTTP`.
        public var description: String { value.rawValue }
    }

    /// What is wrong.
    public let code: Code
    /// The URL template at fault (``Code/invalidURL``, ``Code/missingIDPlaceholder``).
    public let urlTemplate: String?
    /// The host plain HTTP would go to (``Code/insecureHTTP``).
    public let host: String?
    /// What is wrong, naming the header, file or setting at fault (``Code/invalidHeader``,
    /// ``Code/tls``, ``Code/request``).
    public let detail: String?

    private init(_ code: Code, urlTemplate: String? = nil, host: String? = nil, detail: String? = nil) {
        self.code = code
        self.urlTemplate = urlTemplate
        self.host = host
        self.detail = detail
    }

    /// The template is not an http(s) URL.
    public static func invalidURL(_ template: String) -> Self { Self(.invalidURL, urlTemplate: template) }
    /// Neither the template nor the body has `{id}`, so every subject would get the same token.
    public static func missingIDPlaceholder(_ template: String) -> Self { Self(.missingIDPlaceholder, urlTemplate: template) }
    /// Plain HTTP to a non-loopback host without ``HTTPTokenFetcherConfiguration/allowInsecureHTTP``.
    public static func insecureHTTP(host: String) -> Self { Self(.insecureHTTP, host: host) }
    /// A header name or value is unusable.
    public static func invalidHeader(_ detail: String) -> Self { Self(.invalidHeader, detail: detail) }
    /// A CA bundle, client certificate or key is unusable (named, with the problem).
    public static func tls(_ detail: String) -> Self { Self(.tls, detail: detail) }
    /// The method and body do not fit together (a body on a `GET`).
    public static func request(_ detail: String) -> Self { Self(.request, detail: detail) }

    /// What is wrong and what to do.
    public var description: String {
        switch code.value {
        case .invalidURL: "provider URL \"\(urlTemplate ?? "")\" is not an http:// or https:// URL"
        case .missingIDPlaceholder:
            "provider URL \"\(urlTemplate ?? "")\" has no {id} placeholder, nor has a body template: every subject would get the same token"
        case .insecureHTTP:
            "plain http:// to \(host ?? "") would send tokens unencrypted: use https://, or allow insecure HTTP (allowInsecureHTTP) for a trusted network"
        case .invalidHeader: "bad header: \(detail ?? "")"
        case .tls: "TLS set-up: \(detail ?? "")"
        case .request: "request: \(detail ?? "")"
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
