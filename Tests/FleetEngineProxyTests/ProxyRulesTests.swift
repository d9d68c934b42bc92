// The proxy's pure rules: requests refused before anything else, headers forwarded, gRPC's
// unary framing, which answers reject a token, grpc-timeout, the refusal answers, the endpoint.

@testable import FleetEngineProxy
import NIOCore
import Testing

@Suite("Fleet Engine proxy: the rules, as pure functions", .paced)
struct ProxyRulesTests {
    static func request(_ wire: ProxyWire = .rest, authority: String? = "127.0.0.1:8788", _ headers: [(String, String)] = []) -> ProxyRequest {
        let base: [(String, String)] = wire == .grpc ? [("content-type", "application/grpc")] : [("x-goog-api-client", "gl-python/3.11")]
        return ProxyRequest(wire: wire, method: wire == .grpc ? "POST" : "GET", target: "/v1/providers/p/deliveryVehicles/dv",
                            authority: authority, headers: (base + headers).map { (name: $0.0, value: $0.1) }, body: ByteBuffer())
    }

    @Test("forwarding headers, a foreign Host, an Origin, and a REST call without x-goog-api-client or Fleet-Token-Request are refused",
          arguments: [
            ([("forwarded", "for=1.2.3.4")], ProxyTransport.unix, 403),
            ([("x-forwarded-for", "1.2.3.4")], .tcp(host: "127.0.0.1"), 403),
            ([("x-forwarded-host", "evil.example")], .unix, 403),
            ([("origin", "http://evil.example")], .tcp(host: "127.0.0.1"), 403),
          ] as [([(String, String)], ProxyTransport, Int)])
    func refusedHeaders(headers: [(String, String)], transport: ProxyTransport, status: Int) {
        let refusal = ProxyRequestRules.refusal(Self.request(.rest, headers), transport: transport)
        #expect(refusal?.httpStatus == status)
        #expect(refusal?.grpcStatus == 7)
    }

    @Test("Host must name loopback or the listener on TCP; any Host on a Unix socket; never two Host headers")
    func hostRule() {
        #expect(ProxyRequestRules.refusal(Self.request(authority: "evil.example:8788"), transport: .tcp(host: "127.0.0.1"))?.httpStatus == 421)
        #expect(ProxyRequestRules.refusal(Self.request(authority: nil), transport: .tcp(host: "127.0.0.1"))?.httpStatus == 421)
        #expect(ProxyRequestRules.refusal(Self.request(authority: "127.attacker.example"), transport: .tcp(host: "127.0.0.1")) != nil)
        #expect(ProxyRequestRules.refusal(Self.request(authority: "localhost:8788"), transport: .tcp(host: "127.0.0.1")) == nil)
        #expect(ProxyRequestRules.refusal(Self.request(authority: "[::1]:8788"), transport: .tcp(host: "::1")) == nil)
        #expect(ProxyRequestRules.refusal(Self.request(authority: "evil.example"), transport: .unix) == nil)
        // Two Host headers: refused on every listener (RFC 9112, 3.2), one is fine.
        let twice = Self.request(authority: "127.0.0.1:8788", [("host", "127.0.0.1:8788"), ("host", "evil.example")])
        #expect(ProxyRequestRules.refusal(twice, transport: .tcp(host: "127.0.0.1"))?.httpStatus == 400)
        #expect(ProxyRequestRules.refusal(twice, transport: .unix)?.httpStatus == 400)
        #expect(ProxyRequestRules.refusal(Self.request(authority: "127.0.0.1:8788", [("host", "127.0.0.1:8788")]), transport: .tcp(host: "127.0.0.1")) == nil)
    }

    @Test("a REST call needs x-goog-api-client or Fleet-Token-Request: true, on every listener; gRPC does not")
    func restHeaderRule() {
        var bare = Self.request()
        bare.headers.removeAll { $0.name == "x-goog-api-client" }
        #expect(ProxyRequestRules.refusal(bare, transport: .unix)?.message.contains("x-goog-api-client") == true)
        var marked = bare
        marked.headers.append(("fleet-token-request", "TRUE"))
        #expect(ProxyRequestRules.refusal(marked, transport: .unix) == nil)
        marked.headers[marked.headers.count - 1].value = "yes"
        #expect(ProxyRequestRules.refusal(marked, transport: .unix) != nil)
        #expect(ProxyRequestRules.refusal(Self.request(.grpc), transport: .unix) == nil)
    }

    @Test("upstream: the caller's authorization, hop-by-hop fields and ours are dropped; the rest passes; gRPC gets te: trailers")
    func upstreamHeaders() {
        let request = Self.request(.grpc, [
            ("authorization", "Bearer caller-token"), ("connection", "keep-alive"), ("te", "trailers"), ("host", "x"),
            ("fleet-token-request", "true"), ("x-goog-request-params", "provider_id=providers/p"),
            ("grpc-timeout", "5S"), ("google-cloud-resource-prefix", "providers/p"), ("content-length", "12"),
        ])
        let sent = ProxyRequestRules.upstreamHeaders(request)
        let names = sent.map(\.name)
        #expect(!names.contains("authorization") && !names.contains("connection") && !names.contains("host")
            && !names.contains("fleet-token-request") && !names.contains("content-length"))
        #expect(names.filter { $0 == "te" }.count == 1 && sent.contains { $0 == ("te", "trailers") })
        for kept in ["x-goog-request-params", "grpc-timeout", "google-cloud-resource-prefix", "content-type"] { #expect(names.contains(kept)) }
        #expect(!ProxyRequestRules.upstreamHeaders(Self.request(.rest)).contains { $0.name == "te" })
    }

    @Test("upstream: a caller's grpc-timeout goes on as the time remaining, in milliseconds, at least one; none is added")
    func remainingTimeout() {
        let request = Self.request(.grpc, [("grpc-timeout", "5S")])
        #expect(ProxyRequestRules.upstreamHeaders(request, remaining: .milliseconds(1234)).filter { $0.name == "grpc-timeout" }.map(\.value) == ["1234m"])
        #expect(ProxyRequestRules.upstreamHeaders(request, remaining: .microseconds(10)).filter { $0.name == "grpc-timeout" }.map(\.value) == ["1m"])
        #expect(ProxyRequestRules.upstreamHeaders(request).filter { $0.name == "grpc-timeout" }.map(\.value) == ["5S"])
        #expect(!ProxyRequestRules.upstreamHeaders(Self.request(.grpc), remaining: .seconds(3)).contains { $0.name == "grpc-timeout" })
    }

    // Found by a review: only the fixed hop-by-hop names were dropped.
    @Test("upstream: the fields a caller's Connection header names are hop-by-hop and dropped, in any case and spacing, over several Connection headers")
    func connectionNamedFields() {
        let request = Self.request(.rest, [
            ("connection", "keep-alive, X-Debug"), ("connection", " x-trace-hop ,close"), ("x-debug", "1"), ("x-trace-hop", "a"),
            ("x-goog-api-client", "gl-python/3.11"), ("x-goog-request-params", "name=providers/p"),
        ])
        let names = ProxyRequestRules.upstreamHeaders(request).map(\.name)
        #expect(!names.contains("x-debug") && !names.contains("x-trace-hop") && !names.contains("connection"), "\(names)")
        #expect(names.contains("x-goog-api-client") && names.contains("x-goog-request-params"), "\(names)")
    }

    static func frame(_ message: [UInt8], flag: UInt8 = 0, declared: Int? = nil, extra: [UInt8] = []) -> ByteBuffer {
        var buffer = ByteBuffer()
        buffer.writeInteger(flag)
        buffer.writeInteger(UInt32(declared ?? message.count))
        buffer.writeBytes(message)
        buffer.writeBytes(extra)
        return buffer
    }

    @Test("gRPC framing: one uncompressed message is read; compressed, cut short, a second message or no frame are refused")
    func unaryFrame() throws {
        #expect(try GRPCUnaryFrame.message(in: Self.frame([0x1A, 0x01, 0x41])) == [0x1A, 0x01, 0x41])
        #expect(try GRPCUnaryFrame.message(in: Self.frame([])) == [])
        #expect(throws: ProxyRefusal.self) { try GRPCUnaryFrame.message(in: Self.frame([1, 2], flag: 1)) }
        #expect((try? GRPCUnaryFrame.message(in: Self.frame([1, 2], flag: 1))) == nil)
        do {
            _ = try GRPCUnaryFrame.message(in: Self.frame([1, 2], flag: 1))
        } catch {
            #expect(error.grpcStatus == 12)
        }
        for bad in [Self.frame([1, 2], declared: 5), Self.frame([1], extra: [0, 0, 0, 0, 1, 9]), ByteBuffer(bytes: [0, 0, 0])] {
            do {
                _ = try GRPCUnaryFrame.message(in: bad)
                Issue.record("accepted a bad frame")
            } catch {
                #expect(error.grpcStatus == 3)
            }
        }
    }

    @Test("only UNAUTHENTICATED and PERMISSION_DENIED (gRPC, trailers or trailers-only) and 401/403 (REST) reject the token")
    func rejection() {
        func grpc(_ status: String, trailersOnly: Bool = false) -> ProxyResponse {
            trailersOnly ? ProxyResponse(status: 200, headers: [("grpc-status", status)], body: ByteBuffer())
                : ProxyResponse(status: 200, headers: [], body: ByteBuffer(), trailers: [("grpc-status", status)])
        }
        #expect(TokenRejection.rejectsToken(grpc("16"), wire: .grpc))
        #expect(TokenRejection.rejectsToken(grpc("7", trailersOnly: true), wire: .grpc))
        for other in ["0", "5", "14", "4", "3", "13"] { #expect(!TokenRejection.rejectsToken(grpc(other), wire: .grpc)) }
        for status in [401, 403] { #expect(TokenRejection.rejectsToken(ProxyResponse(status: status, headers: [], body: ByteBuffer()), wire: .rest)) }
        for status in [200, 400, 404, 429, 500, 503] { #expect(!TokenRejection.rejectsToken(ProxyResponse(status: status, headers: [], body: ByteBuffer()), wire: .rest)) }
        // A gRPC answer without grpc-status (from a front end before the service): the code its
        // HTTP status maps to, as a gRPC client reads it.
        for status in [401, 403] { #expect(TokenRejection.rejectsToken(ProxyResponse(status: status, headers: [], body: ByteBuffer()), wire: .grpc)) }
        for status in [200, 400, 404, 429, 500, 503] { #expect(!TokenRejection.rejectsToken(ProxyResponse(status: status, headers: [], body: ByteBuffer()), wire: .grpc)) }
        #expect(!TokenRejection.rejectsToken(ProxyResponse(status: 401, headers: [("grpc-status", "0")], body: ByteBuffer()), wire: .grpc),
                "a grpc-status present decides")
        let mapped = [400: 13, 401: 16, 403: 7, 404: 12, 429: 14, 502: 14, 503: 14, 504: 14, 500: 2, 200: 2]
        for (status, code) in mapped { #expect(ProxyResponse(status: status, headers: [], body: ByteBuffer()).effectiveGRPCStatus == code, "\(status)") }
    }

    @Test("grpc-timeout: every unit, and malformed values ignored", arguments: [
        ("5S", Int64(5_000_000_000)), ("250m", 250_000_000), ("2M", 120_000_000_000), ("1H", 3_600_000_000_000), ("7u", 7_000), ("9n", 9),
    ])
    func timeout(value: String, nanoseconds: Int64) {
        #expect(GRPCTimeout.nanoseconds(value) == nanoseconds)
    }

    @Test("grpc-timeout: malformed values are ignored", arguments: ["", "S", "5", "5s", "-1S", "123456789S", "1.5S"])
    func badTimeout(value: String) {
        #expect(GRPCTimeout.nanoseconds(value) == nil)
    }

    @Test("a refusal is a trailers-only gRPC answer with an encoded message, or Google's JSON error shape for REST")
    func refusalAnswers() {
        let refusal = ProxyRefusal.forbidden("GetVehicle: 100% \"denied\"\nnext")
        let grpc = refusal.response(for: .grpc)
        #expect(grpc.status == 200 && grpc.grpcStatus == 7 && grpc.trailers == nil && grpc.body.readableBytes == 0)
        let message = grpc.headers.first { $0.name == "grpc-message" }?.value ?? ""
        #expect(message.contains("100%25") && message.contains("%0A") && !message.contains("\n"))
        let rest = ProxyRefusal(grpcStatus: 14, httpStatus: 503, message: "no token", retryAfter: 7).response(for: .rest)
        #expect(rest.status == 503)
        #expect(String(buffer: rest.body) == #"{"error":{"code":503,"message":"no token","status":"UNAVAILABLE"}}"#)
        #expect(rest.headers.contains { $0 == ("retry-after", "7") })
    }

    @Test("--fleet-engine-url: https anywhere, http to loopback only, scheme/host/port only")
    func endpoint() throws {
        let google = try FleetEngineEndpoint(parsing: FleetEngineEndpoint.defaultURL)
        #expect(google.secure && google.host == "fleetengine.googleapis.com" && google.port == 443 && google.authority == "fleetengine.googleapis.com")
        let local = try FleetEngineEndpoint(parsing: "http://127.0.0.1:9090/")
        #expect(!local.secure && local.port == 9090 && local.authority == "127.0.0.1:9090")
        let v6 = try FleetEngineEndpoint(parsing: "http://[::1]:9090")
        #expect(v6.host == "::1" && v6.authority == "[::1]:9090")
        for bad in ["http://fleetengine.googleapis.com", "ftp://x", "https://", "https://h/v1", "https://h?x=1", "https://u:p@h", "fleetengine.googleapis.com"] {
            #expect(throws: FleetEngineProxyError.self, "\(bad)") { try FleetEngineEndpoint(parsing: bad) }
        }
        #expect((try? FleetEngineEndpoint(parsing: "http://10.0.0.1:80")) == nil)
    }
}
