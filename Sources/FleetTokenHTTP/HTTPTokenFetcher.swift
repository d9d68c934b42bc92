// Transport layer: the HTTP TokenFetcher. Builds each request from the configuration, runs it
// under one deadline, and hands the answer to the provider-response parser. Its configuration
// checks, error wording and header files are in the files beside it.

import AsyncHTTPClient
public import FleetTokenStore
public import Foundation
public import Logging
import NIOCore
import NIOFoundationCompat
import NIOHTTP1
import NIOSSL
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

/// Fetches tokens from the customer's HTTP(S) provider, the way the Fleet Engine samples do:
/// `GET` on a URL naming the subject, a JSON object with the token and its expiration; or a
/// `POST` with a body naming it, through a private CA, with a client certificate, through a
/// forward proxy (see ``HTTPTokenFetcherConfiguration``).
///
/// ```swift
/// var configuration = HTTPTokenFetcherConfiguration(urlTemplate: "https://auth.example.com/fleet/{kind}/{id}")
/// configuration.headerFiles = [(name: "Authorization", path: "/run/secrets/agent-credential")]
/// let fetcher = try HTTPTokenFetcher(configuration: configuration, logger: logger)
/// defer { Task { await fetcher.shutdown() } }
/// ```
///
/// Errors are `TokenProviderError`s: unreachable, timeout, HTTP status (with `Retry-After`),
/// not JSON, a missing field (`missingData`), a body over the limit. The engine then validates
/// the token itself.
public final class HTTPTokenFetcher: TokenFetcher, Sendable {
    /// The configuration in use.
    public let configuration: HTTPTokenFetcherConfiguration

    private let client: HTTPClient
    private let logger: Logger
    private let headerFiles: [HeaderFile]
    private let tls: ProviderTLS?
    /// The proxy chosen for the template's host (fixed: only `{kind}` and `{id}` vary).
    let proxy: ProxySettings.Proxy?
    private let skewWarned = OnceFlag()
    private let digest: ProviderConfigurationDigest

    /// Creates a fetcher with its own HTTP client (shut it down with ``shutdown()``).
    /// - Throws: ``HTTPFetcherConfigurationError`` for an unusable URL template or header.
    public init(configuration: HTTPTokenFetcherConfiguration, logger: Logger) throws(HTTPFetcherConfigurationError) {
        try Self.check(configuration)
        self.configuration = configuration
        self.logger = logger
        self.headerFiles = configuration.headerFiles.map { HeaderFile(name: $0.name, path: $0.path) }
        self.tls = configuration.tls.isDefault ? nil : try ProviderTLS(files: configuration.tls, logger: logger)
        self.proxy = URL(string: Self.probeURL(configuration.urlTemplate)).flatMap(configuration.proxy.proxy(for:))
        self.digest = ProviderConfigurationDigest(configuration: configuration, proxy: proxy)
        var clientConfiguration = HTTPClient.Configuration()
        if let proxy {
            // AsyncHTTPClient opens a CONNECT tunnel through it for https and http alike, so TLS
            // to the provider is end to end: the proxy sees only the host and port.
            clientConfiguration.proxy = .server(
                host: proxy.host, port: proxy.port,
                authorization: proxy.credentials.map { .basic(username: $0.username, password: $0.password) })
            logger.debug("token provider requests go through a proxy", metadata: ["proxy": "\(proxy)"])
        }
        clientConfiguration.timeout = .init(connect: .milliseconds(Int64(configuration.connectTimeout * 1000)))
        clientConfiguration.redirectConfiguration = .disallow
        // A failed connection (refused, untrusted certificate, proxy 407) fails the fetch at once
        // with its own error; AsyncHTTPClient would otherwise retry it until the connect timeout
        // and hide a configuration error behind 5 s. The engine's backoff does the retrying.
        clientConfiguration.connectionPool.retryConnectionEstablishment = false
        clientConfiguration.decompression = .disabled
        self.client = HTTPClient(eventLoopGroupProvider: .singleton, configuration: clientConfiguration)
    }

    private let isShutDown = OnceFlag()

    /// Closes the HTTP client's connections. Also done, without waiting, when the fetcher is released.
    public func shutdown() async {
        guard isShutDown.claim() else { return }
        try? await client.shutdown()
    }

    deinit {
        // The client keeps itself alive until its shutdown completes.
        if isShutDown.claim() { _ = client.shutdown() }
    }

    /// A digest of the configuration and of the current contents of the files it names (CA
    /// bundles, client certificate and key, header files): a stored failure is bound to it, so
    /// a changed configuration is tried at once. Never the values in clear.
    public var configurationDigest: String? { digest.current() }

    /// Fetches a token for `key`.
    /// - Throws: `TokenProviderError`.
    public func fetchToken(for key: TokenKey) async throws(TokenProviderError) -> FetchedToken {
        var request = HTTPClientRequest(url: url(for: key))
        request.method = configuration.method == .post ? .POST : .GET
        if let body = configuration.body {
            let bytes = ByteBuffer(string: body.render(for: key))
            request.headers.add(name: "Content-Type", value: body.contentType)
            request.body = .bytes(bytes)
        } else if configuration.method == .post {
            request.body = .bytes(ByteBuffer())
        }
        // Per request: a rotated client certificate takes effect on the next fetch, while
        // requests in flight keep their connections (the pool keys connections by it).
        request.tlsConfiguration = tls?.current()
        request.headers.add(name: "Accept", value: "application/json")
        for header in configuration.headers { request.headers.add(name: header.name, value: header.value) }
        for file in headerFiles { request.headers.add(name: file.name, value: try file.value()) }

        // The deadline covers the whole exchange: AsyncHTTPClient's own timeout stops at the
        // response head, and a provider can trickle its body forever.
        let client = self.client
        let configuration = self.configuration
        let prepared = request
        let (response, body): (HTTPClientResponse, ByteBuffer)
        do {
            (response, body) = try await withThrowingTaskGroup(of: (HTTPClientResponse, ByteBuffer)?.self) { group in
                group.addTask {
                    let response = try await client.execute(prepared, timeout: .milliseconds(Int64(configuration.totalTimeout * 1000)))
                    guard (200..<300).contains(response.status.code) else {
                        // nginx and others finish the handshake without a client certificate and
                        // answer 400 "No required SSL certificate was sent": say what it means.
                        if response.status.code == 400, configuration.tls.clientCertificateFile == nil,
                           let text = try? await response.body.collect(upTo: 4096),
                           String(buffer: text).contains("SSL certificate") {
                            throw TokenProviderError.tlsCertificate(
                                detail: "the provider answered HTTP 400: it requires a client certificate and none was sent")
                        }
                        throw TokenProviderError.httpStatus(code: Int(response.status.code),
                                                            retryAfter: response.headers.first(name: "Retry-After").flatMap(Self.retryAfter))
                    }
                    return (response, try await response.body.collect(upTo: configuration.maximumBodyBytes))
                }
                group.addTask {
                    try await Task.sleep(for: .milliseconds(Int64(configuration.totalTimeout * 1000)))
                    return nil
                }
                defer { group.cancelAll() }
                guard let first = try await group.next(), let result = first else {
                    throw HTTPClientError.deadlineExceeded
                }
                return result
            }
        } catch let error as TokenProviderError {
            throw error
        } catch {
            throw mapTransportError(error)
        }
        let receivedAt = Date()
        let providerDate = response.headers.first(name: "Date").flatMap { HTTPDate.parse($0) }
        return try parse(Data(buffer: body), for: key, now: providerDate ?? receivedAt, providerDate: providerDate)
    }

    /// Reads the provider's JSON answer (exposed for tests and fuzzing).
    /// - Throws: `TokenProviderError.notJSON` or `TokenProviderError.missingData`.
    public func parse(_ data: Data, for key: TokenKey, now: Date, providerDate: Date? = nil) throws(TokenProviderError) -> FetchedToken {
        try ProviderResponseParser(configuration: configuration, logger: logger, skewWarned: skewWarned)
            .parse(data, for: key, now: now, providerDate: providerDate)
    }

    func url(for key: TokenKey) -> String {
        configuration.urlTemplate
            .replacingOccurrences(of: "{kind}", with: key.kind.rawValue)
            .replacingOccurrences(of: "{id}", with: PercentEncoding.encode(key.subjectID))
    }

    /// Longest `Retry-After` taken from a provider (the engine caps it further).
    static let maximumRetryAfter: TimeInterval = 86_400

    /// `Retry-After` as delay-seconds (digits only, RFC 9110) or an HTTP date; capped.
    static func retryAfter(_ value: String) -> TimeInterval? {
        let trimmed = value.trimmingCharacters(in: .whitespaces)
        if !trimmed.isEmpty, trimmed.utf8.allSatisfy({ $0 >= UInt8(ascii: "0") && $0 <= UInt8(ascii: "9") }),
           let seconds = Double(trimmed) {
            return min(seconds, maximumRetryAfter)
        }
        return HTTPDate.parse(trimmed).map { min(max(0, $0.timeIntervalSinceNow), maximumRetryAfter) }
    }
}
