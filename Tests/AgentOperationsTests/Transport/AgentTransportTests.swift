// Issue 14 from the outside: a real token-agent process against real TLS servers (a private CA,
// mutual TLS), a real CONNECT proxy, POST bodies, JSON-pointer answers and every token kind.

import FleetTokenStoreTesting
import DevTokenIssuer
import FleetTokenStore
import Foundation
import Logging
import NIOHTTP1
import TestSupportKit
import Testing
#if canImport(Glibc)
import Glibc
#endif

@Suite("token-agent reaches real token servers", .paced, .serialized, .exclusive)
struct AgentTransportTests {
    // MARK: trust

    @Test("a private CA given with --ca-file is trusted; without it the certificate error names the flag and nothing is stored")
    func privateCA() async throws {
        let pki = try TestPKI()
        defer { pki.removeFiles() }
        let server = try TLSTokenServer(pki: pki, answer: TLSTokenServer.anyKindToken())
        try await server.whileRunning {
            let scratch = Scratch()
            let db = scratch.file("tokens.sqlite")
            let refused = try await AgentFixture.runDirect(["--db", db, "--provider-url", server.baseURL + "/token/{kind}/{id}", "--vehicle", "truck-7", "--once"], scratch)
            #expect(refused.status == 1)
            #expect(refused.stderr.contains("TLS certificate problem"), "\(refused.stderr)")
            #expect(refused.stderr.contains("--ca-file"), "\(refused.stderr)")
            #expect(server.requests.isEmpty)
            #expect(try await storedKeys(db, scratch).isEmpty)

            // A fresh store: the refused run left its subject in backoff in the first one.
            let db2 = scratch.file("trusted.sqlite")
            let trusted = try await AgentFixture.runDirect(["--db", db2, "--provider-url", server.baseURL + "/token/{kind}/{id}", "--vehicle", "truck-7",
                                           "--ca-file", pki.caPath, "--once", "--json"], scratch)
            #expect(trusted.status == 0, "\(trusted.stderr)")
            #expect(try onceResults(trusted.stdout).map { $0["source"] } == ["provider"])
            #expect(try await storedKeys(db2, scratch) == ["vehicle/truck-7"])
        }
    }

    // MARK: mutual TLS

    @Test("mutual TLS: refused by the server without a client certificate, accepted with one")
    func mutualTLS() async throws {
        let pki = try TestPKI()
        defer { pki.removeFiles() }
        let client = try pki.issueClient(commonName: "gateway-7")
        let server = try TLSTokenServer(pki: pki, requireClientCertificate: true, answer: TLSTokenServer.anyKindToken())
        try await server.whileRunning {
            let scratch = Scratch()
            let db = scratch.file("tokens.sqlite")
            let base = ["--provider-url", server.baseURL + "/token/{kind}/{id}", "--ca-file", pki.caPath, "--vehicle", "truck-7", "--once"]
            let refused = try await AgentFixture.runDirect(["--db", db] + base, scratch)
            #expect(refused.status == 1)
            #expect(refused.stderr.contains("--client-cert"), "\(refused.stderr)")
            #expect(await eventually(within: 10) { !server.handshakeFailures.isEmpty })
            #expect(server.requests.isEmpty)
            #expect(try await storedKeys(db, scratch).isEmpty)

            let db2 = scratch.file("accepted.sqlite")
            let accepted = try await AgentFixture.runDirect(["--db", db2] + base + ["--client-cert", client.chainPath, "--client-key", client.keyPath], scratch)
            #expect(accepted.status == 0, "\(accepted.stderr)")
            #expect(server.requests.map(\.clientCommonName) == ["gateway-7"])
            #expect(try await storedKeys(db2, scratch) == ["vehicle/truck-7"])
        }
    }

    @Test("a client certificate rotated on disk is used by the running agent's next fetch, without a restart")
    func clientCertificateRotation() async throws {
        let pki = try TestPKI()
        defer { pki.removeFiles() }
        let first = try pki.issueClient(commonName: "gateway-old")
        let second = try pki.issueClient(commonName: "gateway-new")
        let server = try TLSTokenServer(pki: pki, requireClientCertificate: true, answer: TLSTokenServer.anyKindToken())
        try await server.whileRunning {
            let scratch = Scratch()
            let db = scratch.file("tokens.sqlite")
            let (certificate, key) = (scratch.file("client.pem"), scratch.file("client.key"))
            try first.install(certificateAt: certificate, keyAt: key)
            let running = try AgentFixture.launch(["--db", db, "--provider-url", server.baseURL + "/token/{kind}/{id}",
                                                             "--ca-file", pki.caPath, "--client-cert", certificate, "--client-key", key,
                                                             "--vehicle", "truck-7", "--json"], in: scratch)
            #expect(await eventually(within: 60) { server.requests.count == 1 }, "\(running.stderr)")

            try second.install(certificateAt: certificate, keyAt: key)
            // A purge makes the running agent refetch its tracked subject at once.
            let purge = try await runToEnd("tokenctl", ["--db", db, "purge", "--vehicle", "truck-7"], in: scratch)
            #expect(purge.status == 0, "\(purge.stderr)")
            #expect(await eventually(within: 60) { server.requests.count >= 2 }, "\(running.stderr)")
            #expect(server.requests.map(\.clientCommonName).prefix(2) == ["gateway-old", "gateway-new"])
            // The server counts the request when it reads it; a SIGTERM before the answer reaches
            // the agent cancels that fetch (by design), and the purged store would stay empty.
            #expect(try await eventually(within: 60) { try await storedKeys(db, scratch) == ["vehicle/truck-7"] }, "\(running.stderr)")
            running.signal(SIGTERM)
            #expect(await running.wait(upTo: 20) == 0, "\(running.stderr)")
            #expect(try await storedKeys(db, scratch) == ["vehicle/truck-7"])
        }
    }

    @Test("a client key that does not match the certificate, or a certificate without a key, is a usage error")
    func clientKeyMismatch() async throws {
        let pki = try TestPKI()
        defer { pki.removeFiles() }
        let one = try pki.issueClient(commonName: "one")
        let other = try pki.issueClient(commonName: "other")
        let scratch = Scratch()
        let url = "https://127.0.0.1:9/token/{kind}/{id}"
        let mismatch = try await AgentFixture.runDirect(["--db", scratch.file("t.sqlite"), "--provider-url", url, "--vehicle", "v",
                                        "--client-cert", one.certificatePath, "--client-key", other.keyPath, "--once"], scratch)
        #expect(mismatch.status == 64)
        #expect(mismatch.stderr.contains("does not belong to the certificate"), "\(mismatch.stderr)")
        let alone = try await AgentFixture.runDirect(["--db", scratch.file("t.sqlite"), "--provider-url", url, "--vehicle", "v",
                                     "--client-cert", one.certificatePath, "--once"], scratch)
        #expect(alone.status == 64)
        #expect(alone.stderr.contains("--client-key"), "\(alone.stderr)")
    }

    // MARK: proxies

    @Test("HTTPS_PROXY with credentials: the request goes through a CONNECT tunnel, TLS verified end to end; the password never shows")
    func proxyWithCredentials() async throws {
        let pki = try TestPKI()
        defer { pki.removeFiles() }
        let password = "s3cret-proxy-pass:word@x"
        let encoded = password.addingPercentEncoding(withAllowedCharacters: .alphanumerics)!
        let proxy = ConnectProxy(username: "agent", password: password)
        let server = try TLSTokenServer(pki: pki, answer: TLSTokenServer.anyKindToken())
        try await proxy.whileRunning {
            try await server.whileRunning {
                let scratch = Scratch()
                let db = scratch.file("tokens.sqlite")
                let arguments = ["--db", db, "--provider-url", server.baseURL + "/token/{kind}/{id}", "--ca-file", pki.caPath,
                                 "--vehicle", "truck-7", "--once", "--log-level", "debug"]
                let proxyURL = "http://agent:\(encoded)@127.0.0.1:\(proxy.port)"
                let through = try await AgentFixture.runDirect(arguments, scratch, environment: ["HTTPS_PROXY": proxyURL, "NO_PROXY": "example.com"])
                #expect(through.status == 0, "\(through.stderr)")
                let tunnels = proxy.requests.filter { $0.outcome == .tunnelled }
                #expect(tunnels.map(\.target) == ["127.0.0.1:\(server.port)"])
                #expect(tunnels.first?.proxyAuthorization == "Basic " + Data("agent:\(password)".utf8).base64EncodedString())
                #expect(server.requests.count == 1)
                for text in [through.stdout, through.stderr] {
                    #expect(!text.contains(password) && !text.contains(encoded), "the proxy password shows: \(text)")
                }
                #expect(through.stderr.contains("agent:***@127.0.0.1"), "the proxy in use is logged, redacted: \(through.stderr)")

                // Wrong credentials: the proxy answers 407; the message says so, without the password.
                let wrong = try await AgentFixture.runDirect(arguments + ["--proxy", "http://agent:wrong-\(encoded)@127.0.0.1:\(proxy.port)"], scratch,
                                            environment: ["HTTPS_PROXY": proxyURL])
                #expect(wrong.status == 0, "a stored token is still served: \(wrong.stderr)")
                _ = try await runToEnd("tokenctl", ["--db", db, "purge", "--all", "--yes"], in: scratch)
                let refused = try await AgentFixture.runDirect(arguments + ["--proxy", "http://agent:wrong-\(encoded)@127.0.0.1:\(proxy.port)"], scratch)
                #expect(refused.status == 1)
                #expect(refused.stderr.contains("407"), "\(refused.stderr)")
                #expect(!refused.stderr.contains(encoded) && !refused.stderr.contains(password), "\(refused.stderr)")
            }
        }
    }

    @Test("NO_PROXY matching the provider, or --no-proxy, bypasses HTTPS_PROXY")
    func noProxyBypass() async throws {
        let pki = try TestPKI()
        defer { pki.removeFiles() }
        let proxy = ConnectProxy()
        let server = try TLSTokenServer(pki: pki, answer: TLSTokenServer.anyKindToken())
        try await proxy.whileRunning {
            try await server.whileRunning {
                let scratch = Scratch()
                let arguments = ["--provider-url", server.baseURL + "/token/{kind}/{id}", "--ca-file", pki.caPath, "--vehicle", "truck-7", "--once"]
                for (index, (extra, environment)) in [([String](), ["HTTPS_PROXY": proxy.url, "NO_PROXY": "localhost,127.0.0.0/8"]),
                                                      (["--no-proxy"], ["HTTPS_PROXY": proxy.url])].enumerated() {
                    let result = try await AgentFixture.runDirect(["--db", scratch.file("t\(index).sqlite")] + arguments + extra, scratch, environment: environment)
                    #expect(result.status == 0, "\(result.stderr)")
                }
                #expect(proxy.requests.isEmpty)
                #expect(server.requests.count == 2)
                // The same call without the exemption does use the proxy: the bypass above was real.
                let proxied = try await AgentFixture.runDirect(["--db", scratch.file("t9.sqlite")] + arguments, scratch, environment: ["HTTPS_PROXY": proxy.url])
                #expect(proxied.status == 0, "\(proxied.stderr)")
                #expect(proxy.requests.map(\.outcome) == [.tunnelled])
            }
        }
    }

    // MARK: request and answer shapes

    @Test("POST with a JSON body template: the server receives the body as sent, with its content type")
    func postBody() async throws {
        let pki = try TestPKI()
        defer { pki.removeFiles() }
        let server = try TLSTokenServer(pki: pki, answer: TLSTokenServer.anyKindToken(subject: { request in
            let object = try? JSONSerialization.jsonObject(with: Data(request.body)) as? [String: String]
            return (object?["kind"] ?? "?", object?["vehicleId"] ?? "?")
        }))
        try await server.whileRunning {
            let scratch = Scratch()
            let result = try await AgentFixture.runDirect(["--db", scratch.file("t.sqlite"), "--provider-url", server.baseURL + "/mint", "--ca-file", pki.caPath,
                                          "--method", "POST", "--body-template", #"{"vehicleId":"{id}","kind":"{kind}"}"#,
                                          "--vehicle", #"truck "7"/a"#, "--delivery-vehicle", "dv-1", "--once", "--json"], scratch)
            #expect(result.status == 0, "\(result.stderr)")
            let requests = server.requests.sorted { $0.bodyText < $1.bodyText }
            #expect(requests.map(\.method) == [.POST, .POST])
            #expect(requests.map(\.uri) == ["/mint", "/mint"])
            #expect(requests.map(\.bodyText) == [#"{"vehicleId":"dv-1","kind":"deliveryVehicle"}"#, #"{"vehicleId":"truck \"7\"/a","kind":"vehicle"}"#])
            #expect(requests.allSatisfy { $0.headers.first(name: "Content-Type") == "application/json" })
            #expect(try onceResults(result.stdout).map { $0["id"] ?? "" }.sorted() == ["dv-1", #"truck "7"/a"#])

            let form = try await AgentFixture.runDirect(["--db", scratch.file("f.sqlite"), "--provider-url", server.baseURL + "/mint", "--ca-file", pki.caPath,
                                        "--method", "post", "--body-template", "subject={id}&kind={kind}",
                                        "--content-type", "application/x-www-form-urlencoded", "--task", "t 1&x=2", "--once"], scratch)
            // The form body is not JSON, so this server cannot read the subject from it: only the request matters here.
            #expect(server.requests.last?.bodyText == "subject=t%201%26x%3D2&kind=task")
            #expect(server.requests.last?.headers.first(name: "Content-Type") == "application/x-www-form-urlencoded")
            #expect(form.status == 1)
        }
    }

    @Test("request-shape flags that do not fit together are usage errors", arguments: [
        (["--body-template", #"{"v":"{id}"}"#], "--method POST"),
        (["--method", "POST", "--body-template", #"{"v":{id}}"#], "--body-template"),
        (["--method", "POST", "--body-template", "v={vehicle}"], "--body-template"),
        (["--content-type", "text/plain"], "--content-type needs --body-template"),
        (["--method", "PUT"], "PUT"),
        (["--proxy", "http://p:1", "--no-proxy"], "exclude each other"),
        (["--proxy", "https://user:hunter2hunter2@p:1"], "user:***@p"),
    ])
    func requestUsage(extra: [String], message: String) async throws {
        let scratch = Scratch()
        let result = try await AgentFixture.runDirect(["--db", scratch.file("t.sqlite"), "--provider-url", "https://127.0.0.1:9/token/{kind}/{id}",
                                      "--vehicle", "v", "--once"] + extra, scratch)
        #expect(result.status == 64)
        #expect(result.stderr.contains(message), "\(result.stderr)")
        #expect(!result.stderr.contains("hunter2hunter2"))
    }

    @Test("a bad proxy URL in the environment is a usage error naming the variable, password redacted")
    func badEnvironmentProxy() async throws {
        let scratch = Scratch()
        let result = try await AgentFixture.runDirect(["--db", scratch.file("t.sqlite"), "--provider-url", "https://127.0.0.1:9/token/{kind}/{id}",
                                      "--vehicle", "v", "--once"], scratch, environment: ["https_proxy": "socks5://u:hunter2hunter2@proxy:1080"])
        #expect(result.status == 64)
        #expect(result.stderr.contains("https_proxy"), "\(result.stderr)")
        #expect(!result.stderr.contains("hunter2hunter2"), "\(result.stderr)")
    }

    @Test("JSON-pointer keys read a nested answer")
    func nestedAnswer() async throws {
        let pki = try TestPKI()
        defer { pki.removeFiles() }
        let server = try TLSTokenServer(pki: pki) { request in
            let now = Date()
            let token = TestJWT.make(kind: .vehicle, subject: request.lastPathComponent, issuedAt: now)
            return .init(body: #"{"data":{"token":"\#(token)","expires":{"at":\#(Int(now.timeIntervalSince1970) + 3600)}}}"#)
        }
        try await server.whileRunning {
            let scratch = Scratch()
            let db = scratch.file("t.sqlite")
            let result = try await AgentFixture.runDirect(["--db", db, "--provider-url", server.baseURL + "/token/{kind}/{id}", "--ca-file", pki.caPath,
                                          "--token-key", "/data/token", "--expiration-key", "/data/expires/at", "--vehicle", "truck-7", "--once", "--json"], scratch)
            #expect(result.status == 0, "\(result.stderr)")
            #expect(try await storedKeys(db, scratch) == ["vehicle/truck-7"])
        }
    }

    // MARK: every token kind

    @Test("delivery vehicle and task tokens end to end: token-agent --once, then tokenctl list --kind")
    func deliveriesKinds() async throws {
        let scratch = Scratch()
        let issuer = try await IssuerProcess(scratch: scratch)
        let db = scratch.file("tokens.sqlite")
        let result = try await AgentFixture.runDirect(["--db", db, "--provider-url", issuer.template, "--delivery-vehicle", "dv-1",
                                      "--task", "task-9", "--vehicle", "truck-7", "--once", "--json"], scratch)
        #expect(result.status == 0, "\(result.stderr)")
        #expect(try onceResults(result.stdout).map { "\($0["kind"] ?? "")/\($0["id"] ?? "")" }
                == ["vehicle/truck-7", "deliveryVehicle/dv-1", "task/task-9"])
        for (kind, id) in [("deliveryVehicle", "dv-1"), ("task", "task-9")] {
            let listed = try await runToEnd("tokenctl", ["--db", db, "list", "--kind", kind, "--json"], in: scratch)
            let rows = try #require(try JSONSerialization.jsonObject(with: Data(listed.stdout.utf8)) as? [[String: Any]], "\(listed.stderr)")
            #expect(rows.map { "\($0["id"] ?? "")/\($0["status"] ?? "")" } == ["\(id)/valid"])
        }
        let stats = try await issuer.stats()
        #expect(stats.issued == 3)
    }
}

/// `kind/id` of every stored row that holds a token, from `tokenctl list --json`.
private func storedKeys(_ db: String, _ scratch: Scratch) async throws -> [String] {
    guard FileManager.default.fileExists(atPath: db) else { return [] }
    let listed = try await runToEnd("tokenctl", ["--db", db, "list", "--json"], in: scratch)
    let rows = try JSONSerialization.jsonObject(with: Data(listed.stdout.utf8)) as? [[String: Any]] ?? []
    return rows.filter { ($0["expires_at"] as? String) != nil }.map { "\($0["kind"] ?? "")/\($0["id"] ?? "")" }
}

