// Issue 32: a held token's GET is answered on the event loop that read it, bypassing the
// router. Against a real token-agent process over loopback TCP and its Unix socket, with
// requests written byte for byte: answers keep request order behind a routed request, the
// answer is the router's (headers, body, access log), and every rule still refuses.

import Foundation
import TestSupportKit
import Testing
#if canImport(Glibc)
import Glibc
#endif

@Suite("token API: held tokens answered on the event loop", .paced, .exclusive)
struct HeldTokenRouteTests {
    static let marked = "Fleet-Token-Request: true\r\n"

    static func get(_ target: String, _ extra: String = "") -> String {
        "GET \(target) HTTP/1.1\r\nHost: localhost\r\n\(marked)\(extra)\r\n"
    }

    /// The ids of the token answers in `raw`, in the order they arrived, and their statuses.
    static func answers(_ raw: String) -> (statuses: [String], ids: [String]) {
        let statuses = raw.components(separatedBy: "HTTP/1.1 ").dropFirst().map { String($0.prefix(3)) }
        let ids = raw.components(separatedBy: "\"id\":\"").dropFirst().map { String($0.prefix { $0 != "\"" }) }
        return (statuses, ids)
    }

    @Test("pipelined on one connection, a held token waits behind a routed request (a slow fetch) and answers stay in request order")
    func requestOrder() async throws {
        let scratch = Scratch()
        let issuer = try await IssuerProcess(scratch: scratch)
        // Every fetch takes 700 ms: a cold subject's answer comes long after a held one's could.
        let agent = try await APIAgent.start(scratch, provider: issuer.template + "?fault=slow&delay_ms=700",
                                             ["--vehicle", "v-0", "--allow", "vehicle:*"], tcp: true, logLevel: "info")
        let port = try #require(agent.tcpPort)
        #expect(await eventually(within: 60) { (try? RawHTTP.send(.unix(agent.socket), "GET", "/readyz"))?.status == 200 })
        for endpoint in [RawHTTP.Endpoint.tcp(port: port), .unix(agent.socket)] {
            let cold = endpoint.isUnix ? "cold-unix" : "cold-tcp"
            let requests = [
                Self.get("/v1/token/vehicle/v-0"),          // held: answered on the loop
                Self.get("/v1/token/vehicle/\(cold)"),      // routed: waits 700 ms for its fetch
                Self.get("/v1/token/vehicle/v-0"),          // held, but must wait behind it
                Self.get("/v1/token/vehicle/v-0?x=1"),
                Self.get("/v1/token/vehicle/v-0", "Connection: close\r\n"),
            ]
            let raw = try await offCooperativePool { try RawHTTP.pipelined(endpoint, requests) }
            let (statuses, ids) = Self.answers(raw)
            #expect(statuses == ["200", "200", "200", "200", "200"], "\(endpoint): \(raw.prefix(600))")
            #expect(ids == ["v-0", cold, "v-0", "v-0", "v-0"], "\(endpoint): answers out of request order")
        }
        // 2,000 held-token requests in one burst: each answered, in order, and the connection
        // closed after the last (it asked to close).
        let burst = Array(repeating: Self.get("/v1/token/vehicle/v-0"), count: 1999) + [Self.get("/v1/token/vehicle/v-0", "Connection: close\r\n")]
        let raw = try await offCooperativePool { try RawHTTP.pipelined(.tcp(port: port), burst) }
        let (statuses, ids) = Self.answers(raw)
        #expect(statuses.count == 2000 && statuses.allSatisfy { $0 == "200" }, "\(statuses.count) answers")
        #expect(ids.count == 2000 && ids.allSatisfy { $0 == "v-0" })
        #expect(agent.process.isRunning)
        #expect(await agent.stop() == 0, "\(agent.process.stderr.suffix(2000))")
    }

    @Test("a held token's answer is the router's: the same headers and body fields, a Date, the access log line; every rule still refuses it")
    func sameAnswerSameRules() async throws {
        let scratch = Scratch()
        let issuer = try await IssuerProcess(scratch: scratch)
        let agent = try await APIAgent.start(scratch, provider: issuer.template, ["--vehicle", "v-0", "--allow", "vehicle:*"], tcp: true, logLevel: "debug")
        let port = try #require(agent.tcpPort)
        let header = [("Fleet-Token-Request", "true")]
        let fromMemory = "answered from memory on its event loop"
        func heldAnswers() -> Int { agent.process.stderr.components(separatedBy: "\n").filter { $0.contains(fromMemory) && $0.contains("/v1/token/vehicle/v-1") }.count }
        // The first GET of v-1 fetches it (the router answers); the second finds it held.
        let routed = try RawHTTP.send(.tcp(port: port), "GET", "/v1/token/vehicle/v-1", headers: header)
        #expect(await eventually(within: 10) { agent.process.stderr.contains("path=/v1/token/vehicle/v-1 status=200") })
        #expect(heldAnswers() == 0, "the fetching GET was routed")
        let held = try RawHTTP.send(.tcp(port: port), "GET", "/v1/token/vehicle/v-1", headers: header)
        #expect(await eventually(within: 10) { heldAnswers() == 1 }, "the second GET was answered from memory")
        #expect(routed.status == 200 && held.status == 200, "\(routed) \(held)")
        #expect(Set(routed.headers.map(\.name)) == Set(held.headers.map(\.name)), "\(routed.headers) against \(held.headers)")
        for name in ["content-type", "cache-control", "fleet-token-fingerprint"] {
            #expect(routed.header(name) == held.header(name), "\(name)")
        }
        #expect(held.header("content-length") == "\(held.body.utf8.count)")
        #expect(held.header("date")?.hasSuffix(" GMT") == true, "\(held.headers)")
        let routedBody = try #require(try JSONSerialization.jsonObject(with: Data(routed.body.utf8)) as? [String: String])
        let heldBody = try #require(try JSONSerialization.jsonObject(with: Data(held.body.utf8)) as? [String: String])
        #expect(heldBody.keys.sorted() == routedBody.keys.sorted())
        #expect(heldBody["token"] == routedBody["token"] && heldBody["expires_at"] == routedBody["expires_at"])
        #expect(routedBody["source"] == "provider" && heldBody["source"] == "provider")
        let plain = try RawHTTP.send(.tcp(port: port), "GET", "/v1/token/vehicle/v-1", headers: header + [("Accept", "text/plain")])
        #expect(plain.status == 200 && plain.body == heldBody["token"] && plain.header("content-type")?.hasPrefix("text/plain") == true)
        // After a request asking to close, what follows on the connection is not answered, nor
        // handed out (no access line, no audit) for an answer nobody receives.
        let before = heldAnswers()
        let closed = try await offCooperativePool {
            try RawHTTP.pipelined(.tcp(port: port), [Self.get("/v1/token/vehicle/v-1", "Connection: close\r\n"), Self.get("/v1/token/vehicle/v-1")])
        }
        #expect(Self.answers(closed).statuses == ["200"], "\(closed.prefix(300))")
        try await Task.sleep(for: .milliseconds(300))  // a second answer's log line would be out by now
        #expect(heldAnswers() == before + 1)
        // Each rule refuses a held token as it refuses any: the router decides every refusal.
        let port80 = "127.0.0.1:\(port)"
        #expect(try RawHTTP.send(.tcp(port: port), "GET", "/v1/token/vehicle/v-1", host: port80).status == 403)
        #expect(try RawHTTP.send(.tcp(port: port), "GET", "/v1/token/vehicle/v-1", host: "rebind.example", headers: header).status == 421)
        #expect(try RawHTTP.send(.tcp(port: port), "GET", "/v1/token/vehicle/v-1", headers: header + [("Origin", "http://localhost")]).status == 403)
        #expect(try RawHTTP.send(.tcp(port: port), "GET", "/v1/token/vehicle/v-1", headers: header + [("Forwarded", "for=10.0.0.1")]).status == 403)
        #expect(try RawHTTP.send(.tcp(port: port), "GET", "/v1/token/vehicle/v-1/", headers: header).status == 400)
        #expect(try RawHTTP.send(.tcp(port: port), "GET", "/v1/token/trip/v-1", headers: header).status == 403)
        #expect(try RawHTTP.send(.tcp(port: port), "POST", "/v1/token/vehicle/v-1", headers: header).status != 200)
        // The access log has a line for the held answer as for the routed one, and no token.
        let token = try #require(heldBody["token"])
        let lines = agent.process.stderr.components(separatedBy: "\n").filter { $0.contains("path=/v1/token/vehicle/v-1 status=200") }
        #expect(lines.count >= 3, "\(agent.process.stderr.suffix(2000))")
        #expect(lines.allSatisfy { $0.contains("fingerprint=\(heldBody["fingerprint"] ?? "?")") })
        #expect(!agent.process.stderr.contains(token) && !agent.process.stdout.contains(token))
        #expect(await agent.stop() == 0, "\(agent.process.stderr.suffix(2000))")
    }

    @Test("behind a held token's answer, a HEAD and then a routed GET on the same connection are each framed for their own request (the HTTP/1 encoder pairs answers with requests)")
    func framingAfterHeldAnswer() async throws {
        let scratch = Scratch()
        let issuer = try await IssuerProcess(scratch: scratch)
        let agent = try await APIAgent.start(scratch, provider: issuer.template, ["--vehicle", "v-0"], tcp: true, logLevel: "debug")
        let port = try #require(agent.tcpPort)
        #expect(await eventually(within: 60) {
            (try? RawHTTP.send(.tcp(port: port), "GET", "/v1/token/vehicle/v-0", headers: [("Fleet-Token-Request", "true")]))?.status == 200
        })
        func heldAnswers() -> Int { agent.process.stderr.components(separatedBy: "\n").filter { $0.contains("answered from memory on its event loop") }.count }
        for endpoint in [RawHTTP.Endpoint.tcp(port: port), .unix(agent.socket)] {
            let before = heldAnswers()
            let raw = try await offCooperativePool {
                try RawHTTP.pipelined(endpoint, [
                    Self.get("/v1/token/vehicle/v-0"),
                    "HEAD /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n",
                    "GET /healthz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n",
                ])
            }
            let answers = raw.components(separatedBy: "HTTP/1.1 ").dropFirst().map { String($0) }
            #expect(answers.count == 3, "\(endpoint): \(raw.prefix(1500))")
            guard answers.count == 3 else { continue }
            #expect(answers[0].hasPrefix("200") && answers[0].contains("\"id\":\"v-0\""), "\(answers[0].prefix(300))")
            #expect(answers[1].hasSuffix("\r\n\r\n"), "the HEAD's answer has no body: \(answers[1])")
            #expect(answers[2].hasPrefix("200") && answers[2].hasSuffix("{\"status\":\"ok\"}"), "the GET's answer has its body: \(answers[2])")
            #expect(await eventually(within: 10) { heldAnswers() == before + 1 }, "\(endpoint): the first was answered from memory")
        }
        #expect(await agent.stop() == 0, "\(agent.process.stderr.suffix(2000))")
    }

    @Test("a graceful stop (SIGTERM) while a token request's end is still to come waits for it and answers it, then closes: answered from memory (a chunked GET) or routed (a body)")
    func gracefulStopWithRequestInProgress() async throws {
        // (head sent before the stop, rest sent after it)
        let variants = [
            ("Transfer-Encoding: chunked\r\n\r\n", "0\r\n\r\n"),  // no body part: answered here
            ("Content-Length: 1\r\n\r\n", "x"),                     // a body: passed on to the router
        ]
        for (headEnd, rest) in variants {
            let scratch = Scratch()
            let issuer = try await IssuerProcess(scratch: scratch)
            let agent = try await APIAgent.start(scratch, provider: issuer.template, ["--vehicle", "v-0"], tcp: true)
            let port = try #require(agent.tcpPort)
            let connection = RawHTTP.openIdle(.tcp(port: port))
            try #require(connection >= 0)
            defer { close(connection) }
            // Served once on this connection (the token fetched, the connection read from).
            let first = try RawHTTP.answer(on: connection, Self.get("/v1/token/vehicle/v-0"))
            #expect(first.hasPrefix("HTTP/1.1 200"), "\(first.prefix(300))")
            let head = Array("GET /v1/token/vehicle/v-0 HTTP/1.1\r\nHost: localhost\r\nFleet-Token-Request: true\r\n\(headEnd)".utf8)
            #expect(RawHTTP.writeAll(connection, head))
            // The head read by the agent's event loop before the stop (a connection with nothing
            // read is idle, and a stop closes it): its end's receive queue empty.
            #expect(await eventually(within: 30) { RawHTTP.serverHasRead(connection) == true }, "the agent did not read the request's head")
            agent.process.signal(SIGTERM)
            // The stop has begun once the listener is closed; its connections are told then.
            #expect(await eventually(within: 30) { (try? RawHTTP.connect(.tcp(port: port), timeout: 1)).map { close($0); return false } ?? true },
                    "the listener closes on SIGTERM")
            try await Task.sleep(for: .milliseconds(300))
            let bytes = Array(rest.utf8)
            #expect(RawHTTP.writeAll(connection, bytes))
            let raw = String(decoding: try await offCooperativePool { try RawHTTP.readToEnd(connection) }, as: UTF8.self)
            #expect(raw.hasPrefix("HTTP/1.1 200") && raw.contains("\"id\":\"v-0\""), "\(headEnd): answered, then closed: \(raw.prefix(400))")
            #expect(await agent.process.wait(upTo: 60) == 0, "\(agent.process.stderr.suffix(2000))")
        }
    }

    @Test("on the Unix socket, client rules decide a held token per caller: granted to this uid it is served, to another it is refused")
    func clientRulesOnHeldTokens() async throws {
        let scratch = Scratch()
        let issuer = try await IssuerProcess(scratch: scratch)
        let me = getuid()
        let agent = try await APIAgent.start(scratch, provider: issuer.template, [
            "--vehicle", "theirs-1", "--allow-client", "uid:\(me) vehicle:mine-*", "--allow-client", "uid:\(me + 1) vehicle:theirs-*",
        ])
        let header = [("Fleet-Token-Request", "true")]
        #expect(await eventually(within: 60) { (try? RawHTTP.send(.unix(agent.socket), "GET", "/readyz"))?.status == 200 })
        // theirs-1 is configured, so held from the start: still refused to this uid, every time.
        for _ in 0..<3 {
            #expect(try RawHTTP.send(.unix(agent.socket), "GET", "/v1/token/vehicle/theirs-1", headers: header).status == 403)
        }
        for _ in 0..<3 {
            #expect(try RawHTTP.send(.unix(agent.socket), "GET", "/v1/token/vehicle/mine-1", headers: header).status == 200)
        }
        #expect(await agent.stop() == 0, "\(agent.process.stderr.suffix(2000))")
    }
}

extension RawHTTP.Endpoint {
    var isUnix: Bool { if case .unix = self { true } else { false } }
}
