// Issue 27 item 7: HTTPTokenFetcher's configuration digest, what a stored failure is bound to.
// It changes with every setting and file that shapes a request (so a fixed configuration is
// tried at once) and with nothing else, and it shows none of the values.

import FleetTokenHTTP
import FleetTokenStore
import Foundation
import TestSupportKit
import Testing
#if canImport(Glibc)
import Glibc
#endif

@Suite("The provider configuration digest", .paced)
struct ProviderConfigurationDigestTests {
    static let template = "https://auth.example.com/fleet/{kind}/{id}"

    func digest(_ configure: (inout HTTPTokenFetcherConfiguration) throws -> Void = { _ in }) throws -> String {
        var configuration = HTTPTokenFetcherConfiguration(urlTemplate: Self.template)
        try configure(&configuration)
        let made = try HTTPTokenFetcher(configuration: configuration, logger: quietLogger)
        defer { Task { await made.shutdown() } }
        return try #require(made.configurationDigest)
    }

    @Test("the same configuration gives the same digest: 64 hex digits that show no value")
    func stable() throws {
        let secret = "Bearer s3cr3t-credential"
        let first = try digest { $0.headers = [(name: "Authorization", value: secret)] }
        #expect(first == (try digest { $0.headers = [(name: "Authorization", value: secret)] }))
        #expect(first.count == 64 && first.allSatisfy(\.isHexDigit))
        #expect(!first.contains("s3cr3t"))
    }

    @Test("each setting that shapes the request or reads the answer changes it")
    func settingsChangeIt() throws {
        let base = try digest()
        let changed: [String: (inout HTTPTokenFetcherConfiguration) throws -> Void] = [
            "url": { $0.urlTemplate = "https://auth.example.com/v2/{kind}/{id}" },
            "method and body": { $0.method = .post; $0.body = try RequestBodyTemplate(#"{"id":"{id}"}"#, contentType: "application/json") },
            "token key": { $0.tokenKey = "/data/token" },
            "expiration key": { $0.expirationKey = "expiresAt" },
            "header value": { $0.headers = [(name: "Authorization", value: "Bearer b")] },
            "proxy": { $0.proxy = ProxySettings(proxy: .init(host: "proxy.example.com", port: 3128)) },
            "proxy credentials": {
                $0.proxy = ProxySettings(proxy: .init(host: "proxy.example.com", port: 3128, credentials: .init(username: "u", password: "p")))
            },
        ]
        var seen: Set<String> = [base]
        for (name, change) in changed.sorted(by: { $0.key < $1.key }) {
            let value = try digest(change)
            #expect(value != base, "\(name) did not change the digest")
            seen.insert(value)
        }
        #expect(seen.count == changed.count + 1, "two different configurations gave the same digest")
    }

    @Test("the contents of the CA bundle, the client certificate and the header files are part of it, read again when they change")
    func filesChangeIt() throws {
        let pki = try TestPKI(), other = try TestPKI()
        defer { pki.removeFiles(); other.removeFiles() }
        let scratch = Scratch()
        let ca = scratch.file("ca.pem"), header = scratch.file("credential")
        try FileManager.default.copyItem(atPath: pki.caPath, toPath: ca)
        try Data("first-credential".utf8).write(to: URL(fileURLWithPath: header))
        chmod(ca, 0o600)
        chmod(header, 0o600)
        var configuration = HTTPTokenFetcherConfiguration(urlTemplate: Self.template)
        configuration.tls.caFiles = [ca]
        configuration.headerFiles = [(name: "Authorization", path: header)]
        let fetcher = try HTTPTokenFetcher(configuration: configuration, logger: quietLogger)
        defer { Task { await fetcher.shutdown() } }
        let before = try #require(fetcher.configurationDigest)
        #expect(fetcher.configurationDigest == before)

        try Data("second-credential".utf8).write(to: URL(fileURLWithPath: header))
        let afterHeader = try #require(fetcher.configurationDigest)
        #expect(afterHeader != before, "a rotated header file did not change the digest")

        try FileManager.default.removeItem(atPath: ca)
        try FileManager.default.copyItem(atPath: other.caPath, toPath: ca)
        chmod(ca, 0o600)
        #expect(fetcher.configurationDigest != afterHeader, "a replaced CA bundle did not change the digest")

        // Without the CA file at all (the refused run's configuration): another digest again.
        let client = try pki.issueClient(commonName: "gateway")
        let withClient = try digest { $0.tls.caFiles = [ca]; $0.tls.clientCertificateFile = client.chainPath; $0.tls.clientKeyFile = client.keyPath }
        let withoutClient = try digest { $0.tls.caFiles = [ca] }
        #expect(withClient != withoutClient)
        #expect(try digest() != withoutClient)
    }
}
