// Proves the issue-14 test kit (TestSupportKit/TransportKit: TestPKI, TLSTokenServer, ConnectProxy) with AsyncHTTPClient
// directly, before any fetcher code relies on it.

import AsyncHTTPClient
import FleetTokenStore
import Foundation
import NIOCore
import NIOPosix
import NIOSSL
import Testing
import TestSupportKit
import X509

@Suite("Test kit: generated PKI, TLS token server, CONNECT proxy", .paced, .exclusive)
struct KitTests {
    @Test("the PKI writes certificates, chains and 0600 keys with the expected names, usages and validity")
    func pkiFiles() throws {
        let pki = try TestPKI()
        defer { pki.removeFiles() }
        let client = try pki.issueClient(commonName: "gateway-a")
        let now = Date()
        let expired = try pki.issueClient(commonName: "gateway-old", validity: now.addingTimeInterval(-7200)...now.addingTimeInterval(-3600))

        #expect(pki.ca.commonName == "Fleet Token Test CA")
        #expect(try pki.ca.certificate.extensions.basicConstraints == .isCertificateAuthority(maxPathLength: 0))
        #expect(pki.server.certificate.issuer == pki.ca.certificate.subject)
        let sans = try #require(try pki.server.certificate.extensions.subjectAlternativeNames)
        #expect(sans.contains(.dnsName("localhost")))
        #expect(sans.contains(.ipAddress(.init(contentBytes: [127, 0, 0, 1]))))
        #expect(try pki.server.certificate.extensions.extendedKeyUsage?.contains(.serverAuth) == true)
        #expect(try client.certificate.extensions.extendedKeyUsage?.contains(.clientAuth) == true)
        #expect(client.commonName == "gateway-a")
        #expect(client.notValidAfter > now && client.notValidBefore < now)
        #expect(expired.notValidAfter < now)

        for identity in [pki.ca, pki.server, client, expired] {
            let key = try FileManager.default.attributesOfItem(atPath: identity.keyPath)
            #expect((key[.posixPermissions] as? Int) == 0o600, "\(identity.keyPath)")
            #expect(try String(contentsOfFile: identity.certificatePath, encoding: .utf8) == identity.certificatePEM)
        }
        let chain = try NIOSSLCertificate.fromPEMFile(client.chainPath)
        #expect(chain.count == 2)
        #expect(try chain[1].toDERBytes() == NIOSSLCertificate.fromPEMFile(pki.caPath)[0].toDERBytes())
        _ = try NIOSSLPrivateKey(file: client.keyPath, format: .pem)

        let other = try TestPKI()
        defer { other.removeFiles() }
        #expect(other.ca.certificate.publicKey != pki.ca.certificate.publicKey)
        #expect(other.directory != pki.directory)
    }

    @Test("a client trusting the CA gets a token over mutual TLS; the server records the request and the client's CN")
    func trustedMutualTLS() async throws {
        let pki = try TestPKI()
        defer { pki.removeFiles() }
        let client = try pki.issueClient(commonName: "gateway-a")
        let server = try TLSTokenServer(pki: pki, requireClientCertificate: true)
        try await server.whileRunning {
            try await withClient(trusting: pki, presenting: client) { http in
                for host in ["127.0.0.1", "localhost"] {
                    let response = try await get(http, "https://\(host):\(server.port)/token/vehicle/truck-\(host)?x=1")
                    #expect(response.status == 200)
                    let object = try #require(try JSONSerialization.jsonObject(with: Data(response.body.utf8)) as? [String: Any])
                    let token = try #require(object["VEHICLE_TOKEN_KEY"] as? String)
                    let claims = try JWTClaims.decode(token)
                    #expect(claims.authorization?["vehicleid"] == "truck-\(host)")
                    #expect((object["TOKEN_EXPIRATION"] as? Int) == claims.expiresAt.map { Int($0.timeIntervalSince1970) })
                }
            }
        }
        let requests = server.requests
        #expect(requests.count == 2)
        #expect(requests.allSatisfy { $0.clientCommonName == "gateway-a" && $0.method == .GET })
        #expect(requests.first?.uri == "/token/vehicle/truck-127.0.0.1?x=1")
        #expect(requests.first?.path == "/token/vehicle/truck-127.0.0.1")
        #expect(requests.map(\.connection) == [1, 2], "one connection per host name")
        #expect(server.handshakeFailures.isEmpty)
    }

    @Test("a POST body and headers are recorded as sent; the answer closure can be replaced")
    func recordsBodies() async throws {
        let pki = try TestPKI()
        defer { pki.removeFiles() }
        let server = try TLSTokenServer(pki: pki) { _ in .init(status: .created, body: "first") }
        try await server.whileRunning {
            try await withClient(trusting: pki) { http in
                var request = HTTPClientRequest(url: server.baseURL + "/issue")
                request.method = .POST
                request.headers.add(name: "Content-Type", value: "application/json")
                request.body = .bytes(ByteBuffer(string: #"{"vehicleId":"v-1"}"#))
                let first = try await http.execute(request, timeout: .seconds(5))
                #expect(first.status == .created)
                #expect(String(buffer: try await first.body.collect(upTo: 1 << 16)) == "first")
                server.setAnswer { request in .init(status: .ok, body: "echo " + request.bodyText) }
                let second = try await http.execute(request, timeout: .seconds(5))
                #expect(String(buffer: try await second.body.collect(upTo: 1 << 16)) == #"echo {"vehicleId":"v-1"}"#)
            }
        }
        let recorded = try #require(server.requests.first)
        #expect(recorded.method == .POST)
        #expect(recorded.bodyText == #"{"vehicleId":"v-1"}"#)
        #expect(recorded.headers["Content-Type"] == ["application/json"])
        #expect(recorded.clientCertificate == nil)
    }

    @Test("a client trusting an unrelated CA fails the handshake; the server records the failure, no request")
    func untrustedCA() async throws {
        let pki = try TestPKI()
        let other = try TestPKI(name: "Unrelated CA")
        defer { pki.removeFiles(); other.removeFiles() }
        let server = try TLSTokenServer(pki: pki)
        try await server.whileRunning {
            try await withClient(trusting: other) { http in
                let error = await #expect(throws: (any Error).self) { try await get(http, server.baseURL + "/token/vehicle/v") }
                #expect(String(describing: error).contains("CERTIFICATE_VERIFY_FAILED"), "\(String(describing: error))")
            }
            #expect(await eventually(within: 5) { server.handshakeFailures.count == 1 })
        }
        #expect(server.requests.isEmpty)
    }

    @Test("the mTLS server refuses a client without a certificate, with a foreign one, and with an expired one")
    func mutualTLSRefusals() async throws {
        let pki = try TestPKI()
        let other = try TestPKI(name: "Unrelated CA")
        defer { pki.removeFiles(); other.removeFiles() }
        let now = Date()
        // The client sees the server's TLS alert (TLS 1.3: after its own handshake completed).
        let cases: [(alert: String, identity: TestPKI.Identity?)] = [
            ("CERTIFICATE_REQUIRED", nil),
            ("UNKNOWN_CA", try other.issueClient(commonName: "intruder")),
            ("CERTIFICATE_EXPIRED", try pki.issueClient(commonName: "gateway-old", validity: now.addingTimeInterval(-7200)...now.addingTimeInterval(-3600))),
        ]
        let server = try TLSTokenServer(pki: pki, requireClientCertificate: true)
        try await server.whileRunning {
            for (index, (alert, identity)) in cases.enumerated() {
                try await withClient(trusting: pki, presenting: identity) { http in
                    let error = await #expect(throws: (any Error).self) { try await get(http, server.baseURL + "/token/vehicle/v") }
                    #expect(String(describing: error).contains(alert), "\(String(describing: error))")
                }
                #expect(await eventually(within: 5) { server.handshakeFailures.count == index + 1 }, "\(alert): \(server.handshakeFailures)")
            }
        }
        #expect(server.requests.isEmpty)
    }

    @Test("the proxy answers 407 without or with wrong credentials, records CONNECT and Proxy-Authorization, tunnels with them")
    func proxyCredentials() async throws {
        let pki = try TestPKI()
        defer { pki.removeFiles() }
        let server = try TLSTokenServer(pki: pki)
        let proxy = ConnectProxy(username: "fleet", password: "s3cret")
        try await server.whileRunning {
            try await proxy.whileRunning {
                let url = server.baseURL + "/token/vehicle/v-7"
                for authorization in [nil, HTTPClient.Authorization.basic(username: "fleet", password: "wrong")] {
                    try await withClient(trusting: pki, proxy: .server(host: "127.0.0.1", port: proxy.port, authorization: authorization)) { http in
                        await #expect(throws: HTTPClientError.proxyAuthenticationRequired) { try await get(http, url) }
                    }
                }
                let good = HTTPClient.Configuration.Proxy.server(host: "127.0.0.1", port: proxy.port,
                                                                 authorization: .basic(username: "fleet", password: "s3cret"))
                try await withClient(trusting: pki, proxy: good) { http in
                    let response = try await get(http, url)
                    #expect(response.status == 200)
                }
            }
        }
        let target = "127.0.0.1:\(server.port)"
        let requests = proxy.requests
        #expect(requests.map(\.method) == ["CONNECT", "CONNECT", "CONNECT"])
        #expect(requests.map(\.target) == [target, target, target])
        #expect(requests.map(\.outcome) == [.refused(status: 407), .refused(status: 407), .tunnelled])
        #expect(requests.first?.proxyAuthorization == nil)
        #expect(requests.last?.proxyAuthorization == "Basic " + Data("fleet:s3cret".utf8).base64EncodedString())
        #expect(requests.last?.proxyAuthorization == proxy.requiredAuthorization)
        #expect(server.requests.count == 1)
    }

    @Test("TLS through the proxy is end to end: the server sees the client certificate, a wrong trust root still fails")
    func endToEndThroughProxy() async throws {
        let pki = try TestPKI()
        let other = try TestPKI(name: "Unrelated CA")
        defer { pki.removeFiles(); other.removeFiles() }
        let server = try TLSTokenServer(pki: pki, requireClientCertificate: true)
        let proxy = ConnectProxy()
        try await server.whileRunning {
            try await proxy.whileRunning {
                let via = HTTPClient.Configuration.Proxy.server(host: "127.0.0.1", port: proxy.port)
                try await withClient(trusting: pki, presenting: try pki.issueClient(commonName: "gateway-tunnel"), proxy: via) { http in
                    let response = try await get(http, "https://localhost:\(server.port)/token/vehicle/v-8")
                    #expect(response.status == 200)
                }
                try await withClient(trusting: other, presenting: try pki.issueClient(commonName: "gateway-b"), proxy: via) { http in
                    await #expect(throws: (any Error).self) { try await get(http, server.baseURL + "/token/vehicle/v-9") }
                }
            }
        }
        #expect(server.requests.map(\.clientCommonName) == ["gateway-tunnel"])
        #expect(proxy.requests.map(\.target) == ["localhost:\(server.port)", "127.0.0.1:\(server.port)"])
        #expect(proxy.requests.map(\.outcome) == [.tunnelled, .tunnelled])
    }

    @Test("the proxy forwards absolute-form HTTP with Connection: close, refuses non-loopback targets (403) and malformed heads (400)")
    func plainForwardingAndRefusals() async throws {
        let recorder = CannedServer(.opaqueVehicleToken)
        try await recorder.start()
        let proxy = ConnectProxy()
        let closedPort = try SilentSocket(listening: false)
        defer { closedPort.close() }
        do {
            try await proxy.whileRunning {
                let forwarded = try await exchange(port: proxy.port, "GET http://127.0.0.1:\(recorder.port)/plain/x?y=1 HTTP/1.1\r\nHost: 127.0.0.1:\(recorder.port)\r\nProxy-Connection: keep-alive\r\n\r\n")
                #expect(forwarded.hasPrefix("HTTP/1.1 200"), "\(forwarded)")
                #expect(forwarded.lowercased().contains("connection: close"))
                #expect(forwarded.contains("VEHICLE_TOKEN_KEY"))
                let outside = try await exchange(port: proxy.port, "CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n")
                #expect(outside.hasPrefix("HTTP/1.1 403"), "\(outside)")
                let outsidePlain = try await exchange(port: proxy.port, "GET http://192.0.2.1/x HTTP/1.1\r\nHost: 192.0.2.1\r\n\r\n")
                #expect(outsidePlain.hasPrefix("HTTP/1.1 403"), "\(outsidePlain)")
                let malformed = try await exchange(port: proxy.port, "NONSENSE\r\n\r\n")
                #expect(malformed.hasPrefix("HTTP/1.1 400"), "\(malformed)")
                let unreachable = try await exchange(port: proxy.port, "CONNECT 127.0.0.1:\(closedPort.port) HTTP/1.1\r\n\r\n")
                #expect(unreachable.hasPrefix("HTTP/1.1 502"), "\(unreachable)")
            }
        } catch {
            Issue.record(error)
        }
        await recorder.stop()
        #expect(recorder.seen.withLock { $0.map(\.path) } == ["/plain/x"])
        #expect(proxy.requests.map(\.outcome) == [.forwarded, .refused(status: 403), .refused(status: 403), .refused(status: 502)])
        #expect(proxy.requests.first?.target == "http://127.0.0.1:\(recorder.port)/plain/x?y=1")
    }

    @Test("stopping the proxy and the server closes open tunnels and kept-alive connections")
    func stopClosesConnections() async throws {
        let pki = try TestPKI()
        defer { pki.removeFiles() }
        let server = try TLSTokenServer(pki: pki)
        let proxy = ConnectProxy()
        try await server.whileRunning {
            try await proxy.start()
            let port = server.port
            let ended = try await within(seconds: 5) {
                try await withRawConnection(port: proxy.port) { connection in
                    try await connection.send("CONNECT 127.0.0.1:\(port) HTTP/1.1\r\n\r\n")
                    let established = try await connection.read(until: "\r\n\r\n")
                    #expect(established.hasPrefix("HTTP/1.1 200 Connection established"))
                    #expect(await eventually(within: 5) { server.connectionCount == 1 })
                    await proxy.stop()
                    return try await connection.readToEnd()
                }
            }
            await proxy.stop()
            #expect(ended == "HTTP/1.1 200 Connection established\r\n\r\n")
        }
        // A kept-alive HTTPS connection from AsyncHTTPClient: stopping the server ends it.
        let restarted = try TLSTokenServer(pki: pki)
        try await restarted.start()
        try await withClient(trusting: pki) { http in
            _ = try await get(http, restarted.baseURL + "/token/vehicle/v")
            await restarted.stop()
            await #expect(throws: (any Error).self) { try await get(http, restarted.baseURL + "/token/vehicle/v") }
        }
        #expect(restarted.connectionCount == 1)
    }
}

// MARK: - Clients

/// An AsyncHTTPClient trusting only `pki`'s CA (read from its PEM file), optionally presenting
/// `identity` (certificate chain and key files), optionally through `proxy`; 5 s timeouts (generous for a loaded machine; the tests take milliseconds); no
/// retried connection establishment.
private func makeClient(trusting pki: TestPKI, presenting identity: TestPKI.Identity? = nil,
                        proxy: HTTPClient.Configuration.Proxy? = nil) throws -> HTTPClient {
    var tls = TLSConfiguration.makeClientConfiguration()
    tls.trustRoots = .certificates(try NIOSSLCertificate.fromPEMFile(pki.caPath))
    if let identity {
        tls.certificateChain = try NIOSSLCertificate.fromPEMFile(identity.chainPath).map { .certificate($0) }
        tls.privateKey = .privateKey(try NIOSSLPrivateKey(file: identity.keyPath, format: .pem))
    }
    var configuration = HTTPClient.Configuration(tlsConfiguration: tls, proxy: proxy)
    configuration.timeout = .init(connect: .seconds(5), read: .seconds(5))
    // Fail at the first failed connection (TLS handshake, 407, refused) instead of retrying with
    // backoff until the connect timeout: fast tests and exact counts on the servers.
    configuration.connectionPool.retryConnectionEstablishment = false
    return HTTPClient(eventLoopGroupProvider: .singleton, configuration: configuration)
}

/// Runs `body` with ``makeClient(trusting:presenting:proxy:)``'s client and shuts it down, also
/// when `body` throws (AsyncHTTPClient traps on a client deallocated without shutdown).
@discardableResult
private func withClient<T>(trusting pki: TestPKI, presenting identity: TestPKI.Identity? = nil,
                           proxy: HTTPClient.Configuration.Proxy? = nil, _ body: (HTTPClient) async throws -> T) async throws -> T {
    let http = try makeClient(trusting: pki, presenting: identity, proxy: proxy)
    do {
        let result = try await body(http)
        try await http.shutdown()
        return result
    } catch {
        try? await http.shutdown()
        throw error
    }
}

private struct TextResponse: Sendable {
    let status: Int
    let body: String
}

private func get(_ http: HTTPClient, _ url: String) async throws -> TextResponse {
    let response = try await http.execute(HTTPClientRequest(url: url), timeout: .seconds(5))
    let body = try await response.body.collect(upTo: 1 << 16)
    return TextResponse(status: Int(response.status.code), body: String(buffer: body))
}

/// Sends `request` on a new connection to 127.0.0.1:`port` and reads until the peer closes (5 s at most).
private func exchange(port: Int, _ request: String) async throws -> String {
    try await within(seconds: 5) {
        try await withRawConnection(port: port) { connection in
            try await connection.send(request)
            return try await connection.readToEnd()
        }
    }
}

/// A plain TCP connection for speaking to the proxy byte by byte.
private struct RawConnection {
    var inbound: NIOAsyncChannelInboundStream<ByteBuffer>.AsyncIterator
    let outbound: NIOAsyncChannelOutboundWriter<ByteBuffer>
    var received = ""

    func send(_ text: String) async throws {
        try await outbound.write(ByteBuffer(string: text))
    }

    /// Everything received until `marker` (inclusive of what arrived with it).
    mutating func read(until marker: String) async throws -> String {
        while !received.contains(marker), let chunk = try await inbound.next() {
            received += String(buffer: chunk)
        }
        return received
    }

    /// Everything received until the peer closed.
    mutating func readToEnd() async throws -> String {
        while let chunk = try await inbound.next() { received += String(buffer: chunk) }
        return received
    }
}

private func withRawConnection<T: Sendable>(port: Int, _ body: (inout RawConnection) async throws -> T) async throws -> T {
    let channel = try await ClientBootstrap(group: MultiThreadedEventLoopGroup.singleton)
        .connectTimeout(.seconds(2))
        .connect(host: "127.0.0.1", port: port) { channel in
            channel.eventLoop.makeCompletedFuture { try NIOAsyncChannel<ByteBuffer, ByteBuffer>(wrappingChannelSynchronously: channel) }
        }
    return try await channel.executeThenClose { inbound, outbound in
        var connection = RawConnection(inbound: inbound.makeAsyncIterator(), outbound: outbound)
        return try await body(&connection)
    }
}

private struct TimedOut: Error {}

/// Runs `body`, cancelling it after `seconds` (then throws `TimedOut`).
private func within<T: Sendable>(seconds: Double, _ body: @escaping @Sendable () async throws -> T) async throws -> T {
    try await withThrowingTaskGroup(of: T.self) { group in
        group.addTask { try await body() }
        group.addTask {
            try await Task.sleep(for: .seconds(seconds))
            throw TimedOut()
        }
        defer { group.cancelAll() }
        return try #require(try await group.next())
    }
}
