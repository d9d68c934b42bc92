// Transport layer: HTTPTokenFetcher's configuration digest (TokenFetcher.configurationDigest):
// what a stored failure is bound to, so that a fixed configuration is tried at once.

import FleetTokenStore
import Foundation
import Synchronization

/// The digest of everything that shapes an ``HTTPTokenFetcher``'s requests and how it reads the
/// answers: the settings (URL template, method, body template and content type, token and
/// expiration fields, headers with their values, timeouts, limits, the proxy with its
/// credentials) and the contents of the files it reads (CA bundles, client certificate and key,
/// header files). The files are hashed again only when one of them changes on disk (inode,
/// size, modification time), so reading the digest costs a `stat` per file.
final class ProviderConfigurationDigest: Sendable {
    /// The settings' part, hashed once.
    private let settings: String
    /// The files read, each with its label.
    private let files: [(label: String, path: String)]
    private let cache = Mutex<(stamp: String, digest: String)?>(nil)

    init(configuration: HTTPTokenFetcherConfiguration, proxy: ProxySettings.Proxy?) {
        var digester = ConfigurationDigester()
        digester.add("url", configuration.urlTemplate)
        digester.add("method", configuration.method.rawValue)
        digester.add("body", configuration.body?.template)
        digester.add("content-type", configuration.body?.contentType)
        digester.add("token-key", configuration.tokenKey)
        digester.add("expiration-key", configuration.expirationKey)
        digester.add("expiration-format", configuration.expirationFormat.rawValue)
        for header in configuration.headers {
            digester.add("header", header.name)
            digester.add("value", header.value)
        }
        digester.add("max-body", String(configuration.maximumBodyBytes))
        digester.add("connect-timeout", String(configuration.connectTimeout))
        digester.add("total-timeout", String(configuration.totalTimeout))
        digester.add("insecure-http", String(configuration.allowInsecureHTTP))
        digester.add("proxy", proxy.map { "\($0.host):\($0.port)" })
        digester.add("proxy-user", proxy?.credentials?.username)
        digester.add("proxy-password", proxy?.credentials?.password)
        settings = digester.finalize()
        let tls = configuration.tls
        files = tls.caFiles.map { ("ca-file", $0) } + tls.extraCAFiles.map { ("extra-ca-file", $0) }
            + [tls.clientCertificateFile.map { ("client-cert", $0) }, tls.clientKeyFile.map { ("client-key", $0) }].compactMap { $0 }
            + configuration.headerFiles.map { ("header-file \($0.name)", $0.path) }
    }

    /// The digest now: the settings' part and the files' current contents.
    func current() -> String {
        let stamp = files.map { FileStamp.of($0.path) }.joined(separator: "|")
        if let cached = cache.withLock({ $0 }), cached.stamp == stamp { return cached.digest }
        var digester = ConfigurationDigester()
        digester.add("settings", settings)
        for file in files {
            digester.add(file.label, FileManager.default.contents(atPath: file.path))
        }
        let digest = digester.finalize()
        cache.withLock { $0 = (stamp, digest) }
        return digest
    }
}
