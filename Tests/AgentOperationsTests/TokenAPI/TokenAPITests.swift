// Issue 13: the local token API of a real token-agent process, over a real Unix socket and
// loopback TCP, against a real dev-token-server.

import AsyncHTTPClient
import FleetTokenStore
import Foundation
import NIOCore
import NIOHTTP1
import TestSupportKit
import Testing
#if canImport(Glibc)
import Glibc
#endif

@Suite("token-agent's local token API", .paced, .exclusive)
struct TokenAPITests {
    @Test("every route and status over the Unix socket and loopback TCP; the request-header and forwarding rules; no token in the access log")
    func routesAndRules() async throws {
        let scratch = Scratch()
        let issuer = try await IssuerProcess(scratch: scratch)
        let agent = try await APIAgent.start(scratch, provider: issuer.template, ["--vehicle", "v-1", "--allow", "trip:t-*"], tcp: true)
        var info = stat()
        #expect(stat(agent.socket, &info) == 0 && info.st_mode & 0o777 == 0o660)
        try await withAPIClient { client in
            for api in [APIClient.unix(agent.socket, client), APIClient.tcp(try #require(agent.tcpPort), client)] {
                let token = try await api.send("/v1/token/vehicle/v-1")
                #expect(token.status == 200, "\(token.body)")
                let object = try #require(token.json)
                #expect(Set(object.keys) == ["kind", "id", "token", "expires_at", "fingerprint", "source"])
                #expect(object["kind"] as? String == "vehicle" && object["id"] as? String == "v-1")
                let value = try #require(object["token"] as? String)
                #expect(value.split(separator: ".").count == 3)
                #expect(token.headers.first(name: "Fleet-Token-Fingerprint") == object["fingerprint"] as? String)
                // A token is served before its commit lands (the group commit writes it next).
                #expect(await eventually(within: 10) {
                    (try? await runToEnd("tokenctl", ["--db", scratch.file("tokens.sqlite"), "show", "vehicle", "v-1", "--reveal"], in: scratch))?
                        .stdout.contains(value) == true
                }, "the served token is in the store")

                let plain = try await api.send("/v1/token/vehicle/v-1", headers: [("Accept", "text/plain")])
                #expect(plain.status == 200 && plain.body == value)
                #expect(plain.headers.first(name: "Content-Type")?.hasPrefix("text/plain") == true)

                #expect(try await api.send("/v1/token/vehicle/v-1", marked: false).status == 403)
                #expect(try await api.send("/v1/token/vehicle/v-1", headers: [("X-Forwarded-For", "10.0.0.1")]).status == 403)
                #expect(try await api.send("/v1/token/vehicle/v-1", headers: [("Forwarded", "for=10.0.0.1")]).status == 403)
                #expect(try await api.send("/v1/token/bus/v-1").status == 404)
                #expect(try await api.send("/v1/token/vehicle/%2E%2E").status == 400)
                #expect(try await api.send("/v1/token/trip/x-1").status == 403)
                #expect(try await api.send("/v1/token/vehicle/v-2").status == 403)
                let onDemand = try await api.send("/v1/token/trip/t-9")
                #expect(onDemand.status == 200, "\(onDemand.body)")

                let subjects = try await api.send("/v1/subjects")
                #expect(subjects.status == 200)
                let list = try #require(try JSONSerialization.jsonObject(with: Data(subjects.body.utf8)) as? [[String: Any]])
                #expect(list.map { "\($0["kind"] ?? "")/\($0["id"] ?? "")/\($0["tracked"] ?? "")" } == ["trip/t-9/0", "vehicle/v-1/1"])
                #expect(list.allSatisfy { $0["status"] as? String == "valid" })
                #expect(!subjects.body.contains(value))

                #expect(try await api.send("/healthz").status == 200)
                #expect(try await api.send("/readyz").status == 200)
                #expect(try await api.send("/readyz", marked: false).status == 200, "health and metrics carry no token: no header needed")
            }
        }
        // Every token the API handed out stays out of the access log, even at trace level.
        let tokens = try await runToEnd("tokenctl", ["--db", scratch.file("tokens.sqlite"), "list", "--json"], in: scratch)
        #expect(tokens.status == 0)
        for key in [("vehicle", "v-1"), ("trip", "t-9")] {
            let shown = try await runToEnd("tokenctl", ["--db", scratch.file("tokens.sqlite"), "show", key.0, key.1, "--reveal", "--json"], in: scratch)
            let value = try #require((try JSONSerialization.jsonObject(with: Data(shown.stdout.utf8)) as? [String: Any])?["token"] as? String, "\(shown.stdout)")
            #expect(!agent.process.stderr.contains(value) && !agent.process.stdout.contains(value))
            #expect(!agent.process.stderr.contains(String(value.split(separator: ".").last!)))
        }
        #expect(agent.process.stderr.contains("path=/v1/token/vehicle/v-1 status=200"))
        #expect(await agent.stop() == 0, "\(agent.process.stderr)")
        #expect(!FileManager.default.fileExists(atPath: agent.socket), "the socket file is removed on exit")
    }

    @Test("/metrics is Prometheus text and its counters move")
    func metrics() async throws {
        try await withServingAgent(["--vehicle", "v-1"]) { api, _ in
            let before = try await api.send("/metrics", marked: false)
            #expect(before.status == 200)
            #expect(before.headers.first(name: "Content-Type")?.hasPrefix("text/plain; version=0.0.4") == true)
            #expect(isPrometheusText(before.body), "\(before.body)")
            #expect(sample("fleet_tokens_refreshes_total", in: before.body) == 1)
            let hits = sample("fleet_tokens_cache_hits_total", in: before.body) ?? 0
            for _ in 0..<5 { _ = try await api.send("/v1/token/vehicle/v-1") }
            let after = try await api.send("/metrics")
            #expect(sample("fleet_tokens_cache_hits_total", in: after.body) == hits + 5)
        }
    }

    @Test("1,000 concurrent clients asking for one missing key cause exactly one provider fetch")
    func singleFlightThroughTheAPI() async throws {
        // A slow provider: every client is waiting while the one fetch runs.
        try await withServingAgent(providerQuery: "?fault=slow&delay_ms=700", ["--vehicle", "v-0", "--allow", "vehicle:*"]) { api, issuer in
            let issuedBefore = try await issuer.stats().issued
            let answers = try await withThrowingTaskGroup(of: APIClient.Answer.self) { group in
                for _ in 0..<1000 { group.addTask { try await api.send("/v1/token/vehicle/new-1") } }
                return try await group.reduce(into: []) { $0.append($1) }
            }
            #expect(answers.count == 1000)
            #expect(answers.allSatisfy { $0.status == 200 }, "\(Set(answers.map(\.status)))")
            #expect(Set(answers.compactMap { $0.headers.first(name: "Fleet-Token-Fingerprint") }).count == 1)
            #expect(try await issuer.stats().issued - issuedBefore == 1)
        }
    }

    @Test("invalidate leads to exactly one fetch; a second within the interval is refused with Retry-After")
    func invalidate() async throws {
        try await withServingAgent(["--vehicle", "v-1"]) { api, issuer in
            let first = try await api.send("/v1/token/vehicle/v-1").headers.first(name: "Fleet-Token-Fingerprint")
            let issuedBefore = try await issuer.stats().issued
            #expect(try await api.send("/v1/invalidate/vehicle/v-1", method: .POST).status == 204)
            let second = try await api.send("/v1/token/vehicle/v-1")
            #expect(second.status == 200)
            #expect(second.headers.first(name: "Fleet-Token-Fingerprint") != first)
            let refused = try await api.send("/v1/invalidate/vehicle/v-1", method: .POST)
            #expect(refused.status == 429)
            #expect(Int(refused.headers.first(name: "Retry-After") ?? "") ?? 0 >= 1)
            let third = try await api.send("/v1/token/vehicle/v-1")
            #expect(third.headers.first(name: "Fleet-Token-Fingerprint") == second.headers.first(name: "Fleet-Token-Fingerprint"))
            #expect(try await issuer.stats().issued - issuedBefore == 1)
            #expect(try await api.send("/v1/invalidate/vehicle/v-9", method: .POST).status == 403)
            #expect(try await api.send("/v1/invalidate/vehicle/v-1", method: .POST, marked: false).status == 403)
        }
    }

    @Test("a provider that fails: 503 with Retry-After and the error's kind, /readyz 503 with the reason")
    func unavailable() async throws {
        try await withServingAgent(providerQuery: "?fault=status&status=500", ["--vehicle", "v-1"], waitForReady: false) { api, _ in
            let answer = try await api.send("/v1/token/vehicle/v-1")
            #expect(answer.status == 503)
            #expect(answer.json?["last_error_kind"] as? String == "httpStatus", "\(answer.body)")
            #expect(Int(answer.headers.first(name: "Retry-After") ?? "") ?? 0 >= 1)
            let ready = try await api.send("/readyz")
            #expect(ready.status == 503)
            #expect(ready.body.contains("vehicle/v-1 has no usable token"), "\(ready.body)")
        }
    }

    @Test("twelve configured subjects and a failing provider: /readyz names ten of them and counts the other two")
    func readinessBounded() async throws {
        let vehicles = (1...12).map { "v-\($0)" }
        try await withServingAgent(providerQuery: "?fault=status&status=500", vehicles.flatMap { ["--vehicle", $0] }, waitForReady: false) { api, _ in
            let ready = try await api.send("/readyz")
            #expect(ready.status == 503)
            let reasons = try #require(ready.json?["reasons"] as? [String], "\(ready.body)")
            #expect(reasons.count == 11, "\(reasons)")
            #expect(reasons.prefix(10).allSatisfy { $0.hasPrefix("vehicle/v-") && $0.contains("has no usable token") }, "\(reasons)")
            #expect(Set(reasons.prefix(10).compactMap { $0.split(separator: " ").first }).count == 10, "ten different subjects: \(reasons)")
            #expect(reasons.last?.hasPrefix("and 2 more configured subjects have no usable token") == true, "\(reasons)")
        }
    }

    @Test("a second agent on a live socket is refused; a stale socket of a killed agent is replaced")
    func socketOwnership() async throws {
        let scratch = Scratch()
        let issuer = try await IssuerProcess(scratch: scratch)
        let first = try await APIAgent.start(scratch, provider: issuer.template, ["--vehicle", "v-1"])
        let other = Scratch()
        let second = try await AgentFixture.run(["--db", other.file("t.sqlite"), "--provider-url", issuer.template,
                                                        "--vehicle", "v-1", "--listen", "unix:\(first.socket)"], in: other, timeout: 30)
        #expect(second.status == 1)
        #expect(second.stderr.contains("another process is listening on \(first.socket)"), "\(second.stderr)")

        first.process.signal(SIGKILL)
        _ = await first.process.wait(upTo: 10)
        #expect(FileManager.default.fileExists(atPath: first.socket), "a killed agent leaves its socket file")
        let third = try await APIAgent.start(other, provider: issuer.template, ["--vehicle", "v-1"], socket: first.socket)
        let health = try await withAPIClient { client in try await APIClient.unix(third.socket, client).send("/healthz").status }
        #expect(health == 200)
        #expect(await third.stop() == 0)

        let notSocket = scratch.file("plain-file")
        _ = FileManager.default.createFile(atPath: notSocket, contents: Data("x".utf8))
        let refused = try await AgentFixture.run(["--db", other.file("t.sqlite"), "--provider-url", issuer.template,
                                                         "--vehicle", "v-1", "--listen", "unix:\(notSocket)"], in: other, timeout: 30)
        #expect(refused.status == 1)
        #expect(refused.stderr.contains("is not a socket"))
    }

    @Test("listen addresses: loopback only unless allowed; bad forms are usage errors", arguments: [
        (["--listen", "0.0.0.0:8080"], "--allow-non-loopback-listen"),
        (["--listen", "localhost"], "unix:PATH or HOST:PORT"),
        (["--listen", "unix:"], "socket's path"),
        (["--allow", "bus:*"], "unknown kind"),
        (["--socket-mode", "999"], "octal"),
        (["--listen", "127.0.0.1:0", "--once"], "--once"),
    ])
    func listenUsage(arguments: [String], message: String) async throws {
        let scratch = Scratch()
        let result = try await AgentFixture.run(["--db", scratch.file("t.sqlite"), "--provider-url", "http://127.0.0.1:9/{kind}/{id}",
                                                        "--vehicle", "v"] + arguments, in: scratch, timeout: 30)
        #expect(result.status == 64)
        #expect(result.stderr.contains(message), "\(result.stderr)")
    }
}

extension TokenAPITests {
    /// The start-up most tests share: a dev-token-server, a token-agent serving the API on a Unix
    /// socket (with `arguments`, its provider URL ending in `providerQuery`) and a client of it.
    /// `body` runs once `/readyz` answers 200, unless `waitForReady` is false; the agent must
    /// then stop cleanly.
    func withServingAgent(providerQuery: String = "", _ arguments: [String], waitForReady: Bool = true,
                          _ body: (_ api: APIClient, _ issuer: IssuerProcess) async throws -> Void) async throws {
        let scratch = Scratch()
        let issuer = try await IssuerProcess(scratch: scratch)
        let agent = try await APIAgent.start(scratch, provider: issuer.template + providerQuery, arguments)
        try await withAPIClient { client in
            let api = APIClient.unix(agent.socket, client)
            if waitForReady {
                #expect(try await eventually(within: 60) { try await api.send("/readyz").status == 200 })
            }
            try await body(api, issuer)
        }
        #expect(await agent.stop() == 0)
    }
}
