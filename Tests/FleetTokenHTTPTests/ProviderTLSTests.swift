import FleetTokenHTTP
import FleetTokenStore
import Foundation
import Logging
import Testing
import TestSupportKit

/// The fetcher against real TLS servers with a generated private CA: custom trust, mutual TLS,
/// client certificates rotated on disk (issue 14, TLS part).
@Suite("HTTPTokenFetcher: private CAs and client certificates", .paced, .exclusive)
struct ProviderTLSTests {
    let key = try! TokenKey.vehicle("truck-7")

    func fetcher(_ server: TLSTokenServer, tls: ProviderTLSFiles) throws -> HTTPTokenFetcher {
        var configuration = HTTPTokenFetcherConfiguration(urlTemplate: "\(server.baseURL)/token/{kind}/{id}")
        configuration.tls = tls
        configuration.connectTimeout = 2
        configuration.totalTimeout = 5
        return try HTTPTokenFetcher(configuration: configuration, logger: Logger(label: "tls-test"))
    }

    @Test("a private CA: untrusted by default (a certificate error, said so), trusted with caFiles or extraCAFiles")
    func customTrust() async throws {
        let pki = try TestPKI()
        defer { pki.removeFiles() }
        let server = try TLSTokenServer(pki: pki)
        try await server.whileRunning {
            let untrusted = try fetcher(server, tls: ProviderTLSFiles())
            defer { Task { await untrusted.shutdown() } }
            let error = await #expect(throws: TokenProviderError.self) { try await untrusted.fetchToken(for: key) }
            #expect(error?.kind == "tlsCertificate", "\(String(describing: error))")
            // Library terms; token-agent adds its flags (AgentTransportTests).
            #expect(error?.description.contains("trust the CA that signed the provider's certificate") == true, "\(String(describing: error))")

            var only = ProviderTLSFiles()
            only.caFiles = [pki.caPath]
            var extra = ProviderTLSFiles()
            extra.extraCAFiles = [pki.caPath]
            for files in [only, extra] {
                let trusted = try fetcher(server, tls: files)
                let token = try await trusted.fetchToken(for: key)
                #expect(try JWTClaims.decode(token.value).authorization?["vehicleid"] == "truck-7")
                await trusted.shutdown()
            }
        }
    }

    // AsyncHTTPClient retried a failed connection until the connect timeout, so a certificate
    // the agent does not trust, a refused port or a proxy's 407 was reported only after it (5 s by
    // default, as a timeout when nothing else was remembered). Not a speed goal: whether the
    // error is the real one and comes before the timeout.
    @Test("an untrusted certificate or a refused connection fails the fetch at once with its own error, not after the connect timeout")
    func connectionFailuresAreNotRetried() async throws {
        let pki = try TestPKI()
        defer { pki.removeFiles() }
        let server = try TLSTokenServer(pki: pki)
        let closedPort: Int = try await server.whileRunning { server.port }
        let untrustedServer = try TLSTokenServer(pki: pki)
        try await untrustedServer.whileRunning {
            for (url, kind) in [("\(untrustedServer.baseURL)/token/{kind}/{id}", "tlsCertificate"),
                                ("https://127.0.0.1:\(closedPort)/token/{kind}/{id}", "unreachable")] {
                var configuration = HTTPTokenFetcherConfiguration(urlTemplate: url)
                configuration.connectTimeout = 30
                configuration.totalTimeout = 60
                let fetcher = try HTTPTokenFetcher(configuration: configuration, logger: Logger(label: "tls-test"))
                let started = ContinuousClock.now
                let error = await #expect(throws: TokenProviderError.self) { try await fetcher.fetchToken(for: key) }
                #expect(error?.kind == kind, "\(String(describing: error))")
                #expect(ContinuousClock.now - started < .seconds(15), "\(url): reported after \(ContinuousClock.now - started)")
                await fetcher.shutdown()
            }
        }
    }

    @Test("mutual TLS: refused without a client certificate, accepted with one; a rotated certificate is used by the next fetch")
    func mutualTLSAndRotation() async throws {
        let pki = try TestPKI()
        defer { pki.removeFiles() }
        let first = try pki.issueClient(commonName: "gateway-a"), second = try pki.issueClient(commonName: "gateway-b")
        let certificatePath = pki.directory.appendingPathComponent("client.pem").path
        let keyPath = pki.directory.appendingPathComponent("client.key").path
        try first.install(certificateAt: certificatePath, keyAt: keyPath, chain: true)
        let server = try TLSTokenServer(pki: pki, requireClientCertificate: true)
        try await server.whileRunning {
            var anonymous = ProviderTLSFiles()
            anonymous.caFiles = [pki.caPath]
            let refused = try fetcher(server, tls: anonymous)
            let error = await #expect(throws: TokenProviderError.self) { try await refused.fetchToken(for: key) }
            #expect(error?.kind == "tlsCertificate", "\(String(describing: error))")
            await refused.shutdown()

            var mutual = anonymous
            mutual.clientCertificateFile = certificatePath
            mutual.clientKeyFile = keyPath
            let fetcher = try fetcher(server, tls: mutual)
            _ = try await fetcher.fetchToken(for: key)
            #expect(server.requests.last?.clientCommonName == "gateway-a")
            // Rotation on disk, no restart: the next fetch presents the new certificate.
            try second.install(certificateAt: certificatePath, keyAt: keyPath)
            _ = try await fetcher.fetchToken(for: key)
            #expect(server.requests.last?.clientCommonName == "gateway-b")
            await fetcher.shutdown()
        }
    }

    @Test("a client key that does not belong to the certificate, or a missing file, is a set-up error naming the file")
    func mismatchedKey() throws {
        let pki = try TestPKI()
        defer { pki.removeFiles() }
        let a = try pki.issueClient(commonName: "gateway-a"), b = try pki.issueClient(commonName: "gateway-b")
        var configuration = HTTPTokenFetcherConfiguration(urlTemplate: "https://127.0.0.1:1/token/{kind}/{id}")
        configuration.tls.clientCertificateFile = a.certificatePath
        configuration.tls.clientKeyFile = b.keyPath
        let error = #expect(throws: HTTPFetcherConfigurationError.self) {
            try HTTPTokenFetcher(configuration: configuration, logger: Logger(label: "tls-test"))
        }
        #expect(error?.description.contains("does not belong") == true, "\(String(describing: error))")
        #expect(error?.description.contains(b.keyPEM) == false)
        configuration.tls.clientKeyFile = pki.directory.appendingPathComponent("absent.key").path
        let missing = #expect(throws: HTTPFetcherConfigurationError.self) {
            try HTTPTokenFetcher(configuration: configuration, logger: Logger(label: "tls-test"))
        }
        #expect(missing?.description.contains("absent.key") == true)
    }
}
