import DevTokenIssuer
@testable import FleetTokenHTTP
import FleetTokenStore
import Foundation
import Testing
import TestSupportKit

@Suite("HTTPTokenFetcher against real loopback servers", .paced, .exclusive)
struct HTTPTokenFetcherTests {
    let vehicle = try! TokenKey.vehicle("truck 7/ä?x=1")
    let trip = try! TokenKey.trip("trip-42")

    @Test("vehicle and trip tokens with the samples' field names; ids are percent-encoded; tokens validate")
    func fetchesAndValidates() async throws {
        try await withIssuer { issuer in
            let http = try fetcher(issuer.urlTemplate)
            defer { Task { await http.shutdown() } }
            for key in [vehicle, trip] {
                let fetched = try await http.fetchToken(for: key)
                let claims = try JWTClaims.decode(fetched.value)
                #expect(claims.authorization?[key.kind.authorizationClaim] == key.subjectID)
                #expect(claims.algorithm == "RS256")
                #expect(claims.keyID == issuer.keyID)
                #expect(fetched.statedExpiry == claims.expiresAt)
                #expect(fetched.providerDate != nil)
                let token = try TokenValidator(policy: RefreshPolicy()).validate(fetched, for: key, now: Date())
                #expect(token.expiresAt.timeIntervalSinceNow > 3500)
            }
        }
    }

    @Test("every expiration format, explicit and auto, gives the JWT's exp", arguments: ["epoch-seconds", "epoch-millis", "relative-seconds"])
    func expirationFormats(format: String) async throws {
        try await withIssuer { issuer in
            let template = issuer.urlTemplate + "?expiration_format=\(format)"
            for configured in [HTTPTokenFetcherConfiguration.ExpirationFormat(rawValue: format)!, .auto] {
                let http = try fetcher(template) { $0.expirationFormat = configured }
                let fetched = try await http.fetchToken(for: trip)
                await http.shutdown()
                let exp = try #require(try JWTClaims.decode(fetched.value).expiresAt)
                let stated = try #require(fetched.statedExpiry)
                #expect(abs(stated.timeIntervalSince(exp)) <= 2, "\(format) read as \(configured)")
            }
        }
    }

    @Test("without an expiration field the JWT exp is used; a custom token key is honoured")
    func noExpirationField() async throws {
        try await withIssuer { issuer in
            let http = try fetcher(issuer.urlTemplate + "?expiration_format=none")
            defer { Task { await http.shutdown() } }
            let fetched = try await http.fetchToken(for: vehicle)
            #expect(fetched.statedExpiry == nil)
            let custom = try fetcher(issuer.urlTemplate) { $0.tokenKey = "access_token" }
            defer { Task { await custom.shutdown() } }
            await #expect(throws: TokenProviderError.missingData(field: "access_token")) { try await custom.fetchToken(for: vehicle) }
        }
    }

    @Test("auto tells the formats apart by magnitude")
    func autoMagnitudes() {
        let now = Date(timeIntervalSince1970: 1_800_000_000)
        let auto = HTTPTokenFetcherConfiguration.ExpirationFormat.auto
        #expect(auto.interpret(1_800_003_600, now: now) == now + 3600)
        #expect(auto.interpret(1_800_003_600_000, now: now) == now + 3600)
        #expect(auto.interpret(3600, now: now) == now + 3600)
    }

    @Test("static headers are sent; a header file is re-read when it changes")
    func headers() async throws {
        let server = CannedServer(.opaqueVehicleToken)
        try await server.start()
        defer { Task { await server.stop() } }
        let scratch = Scratch()
        let credential = scratch.file("credential")
        try "Bearer first\n".write(toFile: credential, atomically: true, encoding: .utf8)

        var policy = RefreshPolicy()
        policy.allowOpaqueTokens = true
        let http = try fetcher("http://127.0.0.1:\(server.port)/auth/{kind}/{id}") {
            $0.headers = [(name: "X-Agent", value: "gateway-1")]
            $0.headerFiles = [(name: "Authorization", path: credential)]
        }
        defer { Task { await http.shutdown() } }
        _ = try await http.fetchToken(for: vehicle)
        try "Bearer second\n".write(toFile: credential, atomically: true, encoding: .utf8)
        _ = try await http.fetchToken(for: vehicle)
        let seen = server.seen.withLock { $0 }
        #expect(seen.map(\.authorization) == ["Bearer first", "Bearer second"])
        #expect(seen.allSatisfy { $0.custom == "gateway-1" })
        #expect(seen.first?.path == "/auth/vehicle/truck%207%2F%C3%A4%3Fx%3D1")

        try FileManager.default.removeItem(atPath: credential)
        await #expect(throws: TokenProviderError.self) { try await http.fetchToken(for: vehicle) }
    }

    @Test("HTTP errors carry the status and Retry-After")
    func httpStatus() async throws {
        try await withIssuer { issuer in
            for (status, retryAfter) in [(503, "7"), (429, "120"), (500, nil), (401, nil), (403, nil)] as [(Int, String?)] {
                var template = issuer.urlTemplate + "?fault=status&status=\(status)"
                if let retryAfter { template += "&retry_after=\(retryAfter)" }
                let http = try fetcher(template)
                await #expect(throws: TokenProviderError.httpStatus(code: status, retryAfter: retryAfter.flatMap(Double.init))) {
                    try await http.fetchToken(for: trip)
                }
                await http.shutdown()
            }
            #expect(!TokenProviderError.httpStatus(code: 403, retryAfter: nil).isRetryable)
            #expect(TokenProviderError.httpStatus(code: 429, retryAfter: nil).isRetryable)
            #expect(TokenProviderError.httpStatus(code: 408, retryAfter: nil).isRetryable)
        }
    }

    @Test("HTML, missing fields and oversized bodies are typed errors")
    func badBodies() async throws {
        try await withIssuer { issuer in
            let cases: [(String, (TokenProviderError) -> Bool)] = [
                ("html", { $0.code == .notJSON && $0.detail?.contains("HTML") == true }),
                ("missing-token", { $0 == .missingData(field: "TRIP_TOKEN_KEY") }),
                ("huge-body", { $0 == .bodyTooLarge(limitBytes: 1 << 20) }),
            ]
            for (fault, matches) in cases {
                let http = try fetcher(issuer.urlTemplate + "?fault=\(fault)")
                let error = await #expect(throws: TokenProviderError.self) { try await http.fetchToken(for: trip) }
                #expect(error.map(matches) == true, "\(fault): \(String(describing: error))")
                await http.shutdown()
            }
        }
    }

    @Test("an unreachable provider and a hanging one are reported as such, within the timeouts")
    func unreachableAndTimeout() async throws {
        let closed = try fetcher("http://127.0.0.1:1/token/{kind}/{id}")
        let error = await #expect(throws: TokenProviderError.self) { try await closed.fetchToken(for: trip) }
        if error?.code != .unreachable { Issue.record("expected unreachable, got \(String(describing: error))") }
        await closed.shutdown()

        try await withIssuer { issuer in
            for fault in ["hang", "slow-body"] {
                let http = try fetcher(issuer.urlTemplate + "?fault=\(fault)") { $0.totalTimeout = 0.5 }
                let started = Date()

                await #expect(throws: TokenProviderError.timeout(seconds: 0.5)) { try await http.fetchToken(for: trip) }
                // Ends by its 0.5 s timeout, not with the hanging server (bounded for a loaded machine).
                #expect(Date().timeIntervalSince(started) < 10)

                await http.shutdown()

            }
        }
    }

    @Test("Retry-After: digits or an HTTP date, capped; anything else is ignored")
    func retryAfterParsing() {
        #expect(HTTPTokenFetcher.retryAfter("120") == 120)
        #expect(HTTPTokenFetcher.retryAfter(" 7 ") == 7)
        #expect(HTTPTokenFetcher.retryAfter("99999999999999999999") == 86_400)
        for bad in ["inf", "1e400", "-5", "nan", "12.5", "", "soon"] { #expect(HTTPTokenFetcher.retryAfter(bad) == nil, "\(bad)") }
        let start = Date()
        let inTwoMinutes = HTTPTokenFetcher.retryAfter(httpDate(start.addingTimeInterval(120)))
        // Less than 120 s by the dropped fraction of a second and the time passed since `start`.
        let elapsed = Date().timeIntervalSince(start)
        #expect(inTwoMinutes.map { $0 <= 120 && $0 >= 120 - 1 - elapsed - 0.01 } == true, "\(String(describing: inTwoMinutes)) after \(elapsed) s")
        // A description with a huge value must not trap.
        #expect(TokenProviderError.httpStatus(code: 503, retryAfter: .infinity).description.contains("503"))
    }

    @Test("only literal loopback addresses count as loopback")
    func loopback() {
        for host in ["127.0.0.1", "127.1.2.3", "localhost", "::1", "[::1]"] { #expect(HTTPTokenFetcher.isLoopback(host), "\(host)") }
        for host in ["127.example.com", "example.com", "10.0.0.1", "128.0.0.1"] { #expect(!HTTPTokenFetcher.isLoopback(host), "\(host)") }
        #expect(throws: HTTPFetcherConfigurationError.insecureHTTP(host: "127.example.com")) { try fetcher("http://127.example.com/{id}") }
    }

    @Test("a credential with control characters is refused, and never quoted in the error")
    func credentialControlCharacters() async throws {
        for value in ["Bearer a\u{0}b", "Bearer a\r\nX-Injected: 1", "Bearer \u{7F}", "Bearer \u{0C}x"] {
            #expect(throws: HTTPFetcherConfigurationError.self) { try fetcher("https://x/{id}") { $0.headers = [(name: "Authorization", value: value)] } }
        }
        let scratch = Scratch()
        let secret = "Bearer s3cr3t-\u{0C}-value"
        try secret.write(toFile: scratch.file("credential"), atomically: true, encoding: .utf8)
        let http = try fetcher("http://127.0.0.1:1/{kind}/{id}") { $0.headerFiles = [(name: "Authorization", path: scratch.file("credential"))] }
        defer { Task { await http.shutdown() } }
        let error = await #expect(throws: TokenProviderError.self) { try await http.fetchToken(for: vehicle) }
        #expect(error?.description.contains("control character") == true)
        #expect(error?.description.contains("s3cr3t") == false)
    }

    // Issue 12 item 11: `--header 'Authorization Bearer abc: x'` made the credential part of
    // the "name", which the error quoted.
    @Test("an invalid header name is refused without being quoted")
    func invalidHeaderNameNotQuoted() {
        for name in ["Authorization Bearer s3cr3t", "", "Bearer\ts3cr3t"] {
            let error = #expect(throws: HTTPFetcherConfigurationError.self) {
                try fetcher("https://x/{id}") { $0.headers = [(name: name, value: "x")] }
            }
            #expect(error?.description.contains("header name is not valid") == true)
            #expect(error?.description.contains("s3cr3t") == false)
        }
        #expect(throws: HTTPFetcherConfigurationError.self) {
            try fetcher("https://x/{id}") { $0.headerFiles = [(name: "Bearer s3cr3t", path: "/dev/null")] }
        }
    }

    @Test("a header file behind a swapped symlink (rotated secret) is re-read")
    func symlinkedHeaderFile() async throws {
        let server = CannedServer(.opaqueVehicleToken)
        try await server.start()
        defer { Task { await server.stop() } }
        let scratch = Scratch()
        let dir = scratch.path
        try FileManager.default.createDirectory(atPath: dir + "/a", withIntermediateDirectories: true)
        try FileManager.default.createDirectory(atPath: dir + "/b", withIntermediateDirectories: true)
        try "Bearer one".write(toFile: dir + "/a/credential", atomically: true, encoding: .utf8)
        try "Bearer two".write(toFile: dir + "/b/credential", atomically: true, encoding: .utf8)
        try FileManager.default.createSymbolicLink(atPath: dir + "/data", withDestinationPath: dir + "/a")
        let http = try fetcher("http://127.0.0.1:\(server.port)/{kind}/{id}") {
            $0.headerFiles = [(name: "Authorization", path: dir + "/data/credential")]
        }
        defer { Task { await http.shutdown() } }
        _ = try await http.fetchToken(for: vehicle)
        try FileManager.default.removeItem(atPath: dir + "/data")
        try FileManager.default.createSymbolicLink(atPath: dir + "/data", withDestinationPath: dir + "/b")
        _ = try await http.fetchToken(for: vehicle)
        #expect(server.seen.withLock { $0.map(\.authorization) } == ["Bearer one", "Bearer two"])
    }

    @Test("the issuer answers 400 to an impossible fault status instead of crashing")
    func issuerRejectsBadStatus() async throws {
        try await withIssuer { issuer in
            let http = try fetcher(issuer.urlTemplate + "?fault=status&status=1000")
            await #expect(throws: TokenProviderError.httpStatus(code: 400, retryAfter: nil)) { try await http.fetchToken(for: trip) }
            await http.shutdown()
            // Still serving.
            let ok = try fetcher(issuer.urlTemplate)
            _ = try await ok.fetchToken(for: trip)
            await ok.shutdown()
        }
    }

    @Test("bad configurations are refused with what to do")
    func configurationChecks() {
        #expect(throws: HTTPFetcherConfigurationError.insecureHTTP(host: "auth.example.com")) {
            try fetcher("http://auth.example.com/{kind}/{id}")
        }
        #expect(throws: Never.self) { try fetcher("http://auth.example.com/{id}") { $0.allowInsecureHTTP = true } }
        #expect(throws: Never.self) { try fetcher("https://auth.example.com/{kind}/{id}") }
        #expect(throws: Never.self) { try fetcher("http://localhost:8080/{kind}/{id}") }
        #expect(throws: HTTPFetcherConfigurationError.missingIDPlaceholder("https://auth.example.com/token")) {
            try fetcher("https://auth.example.com/token")
        }
        #expect(throws: HTTPFetcherConfigurationError.invalidURL("ftp://x/{id}")) { try fetcher("ftp://x/{id}") }
        #expect(throws: HTTPFetcherConfigurationError.self) { try fetcher("https://x/{id}") { $0.headers = [(name: "Bad Name", value: "v")] } }
        #expect(throws: HTTPFetcherConfigurationError.self) { try fetcher("https://x/{id}") { $0.headers = [(name: "X", value: "a\r\nInjected: 1")] } }
        // The library names its own setting; token-agent adds its flag (AgentOperationsTests).
        let message = HTTPFetcherConfigurationError.insecureHTTP(host: "h").description
        #expect(message.contains("allowInsecureHTTP") && !message.contains("--"), "\(message)")
    }
}
