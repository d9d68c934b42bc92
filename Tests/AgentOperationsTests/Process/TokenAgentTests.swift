import Foundation
import Testing
import TestSupportKit
#if canImport(Glibc)
import Glibc
#endif

@Suite("token-agent as a real process", .paced, .serialized, .exclusive)
struct TokenAgentTests {
    @Test("demo mode: says so loudly, stores the demo subjects' tokens, stops on SIGTERM with 0 within 5 s")
    func demoMode() async throws {
        let scratch = Scratch()
        let db = scratch.file("tokens.sqlite")
        let agent = try AgentFixture.launch(["--db", db], in: scratch)
        #expect(await agent.waitForOutput("DEMO MODE", within: 30))
        #expect(await agent.waitForOutput("NOT FOR PRODUCTION", within: 1))
        let stored = await eventually(within: 30) { (try? await sqlite3(db, "SELECT count(*) FROM tokens WHERE token IS NOT NULL")) == "5" }
        #expect(stored, "stderr: \(agent.stderr)")
        #expect(await agent.waitForOutput("refreshed", within: 5))
        // Events are printed after their commit, by a task of their own: the store can be ahead.
        #expect(await eventually(within: 10) { agent.stdout.contains("vehicle/demo-vehicle-1") }, "\(agent.stdout)")
        agent.signal(SIGTERM)
        let status = await agent.wait(upTo: 5)
        #expect(status == 0, "stderr: \(agent.stderr)")
        #expect(try await sqlite3(db, "PRAGMA integrity_check") == "ok")
        // No token value on any output.
        let tokens = try await sqlite3(db, "SELECT token FROM tokens").split(separator: "\n")
        for token in tokens { #expect(!agent.stdout.contains(token) && !agent.stderr.contains(token)) }
    }

    @Test("SIGINT stops the agent cleanly too")
    func sigint() async throws {
        let scratch = Scratch()
        let agent = try AgentFixture.launch(["--db", scratch.file("t.sqlite"), "--vehicle", "v1"], in: scratch)
        #expect(await agent.waitForOutput("refreshed", within: 30))
        agent.signal(SIGINT)
        #expect(await agent.wait(upTo: 5) == 0)
    }

    @Test("--once fetches, a second --once reuses the store with zero fetches; --json has the contract's fields")
    func onceAndRestart() async throws {
        let scratch = Scratch()
        let issuer = try await IssuerProcess(scratch: scratch)
        let db = scratch.file("tokens.sqlite")
        let args = ["--db", db, "--provider-url", issuer.template, "--vehicle", "v-1", "--trip", "t-1", "--once", "--json"]
        let first = try await AgentFixture.run(args, in: scratch)
        #expect(first.status == 0, "\(first.stderr)")
        let firstResults = try onceResults(first.stdout)
        #expect(firstResults.map { $0["source"] } == ["provider", "provider"])
        #expect(Set(firstResults.map { "\($0["kind"]!)/\($0["id"]!)" }) == ["vehicle/v-1", "trip/t-1"])
        for result in firstResults {
            #expect(result["fingerprint"]?.count == 12)
            #expect(result["expires_at"]?.hasSuffix("Z") == true)
        }
        #expect(try await issuer.stats().issued == 2)

        let second = try await AgentFixture.run(args, in: scratch)
        #expect(second.status == 0)
        let secondResults = try onceResults(second.stdout)
        #expect(secondResults.map { $0["source"] } == ["store", "store"])
        #expect(secondResults.map { $0["fingerprint"] } == firstResults.map { $0["fingerprint"] })
        #expect(try await issuer.stats().issued == 2)
    }

    // Subject flags are taken out of the command line before ArgumentParser (which is quadratic
    // in repeated options); every form must still reach the agent, and `--` ends them.
    @Test("subject flags in every form, mixed with other flags, reach the agent")
    func subjectFlagForms() async throws {
        let scratch = Scratch()
        let issuer = try await IssuerProcess(scratch: scratch)
        let result = try await AgentFixture.run(["--vehicle=v-a", "--db", scratch.file("t.sqlite"), "--vehicle", "v-b",
                                                        "--provider-url", issuer.template, "--trip=t-1", "--delivery-vehicle", "d-1",
                                                        "--task=k-1", "--once", "--json", "--vehicle=-7"], in: scratch)
        #expect(result.status == 0, "\(result.stderr)")
        #expect(try onceResults(result.stdout).map { "\($0["kind"] ?? "")/\($0["id"] ?? "")" }
                == ["vehicle/v-a", "vehicle/v-b", "vehicle/-7", "trip/t-1", "deliveryVehicle/d-1", "task/k-1"])
        for tail in [["--vehicle"], ["--vehicle", "--json"]] {
            let missing = try await AgentFixture.run(["--db", scratch.file("t.sqlite"), "--provider-url", issuer.template, "--once"] + tail, in: scratch)
            #expect(missing.status == 64)
            #expect(missing.stderr.contains("Missing value for '--vehicle"), "\(missing.stderr)")
        }
    }

    @Test("TOKEN_STORE_DB is the default store path")
    func environmentStorePath() async throws {
        let scratch = Scratch()
        let issuer = try await IssuerProcess(scratch: scratch)
        let db = scratch.file("from-env.sqlite")
        let result = try await AgentFixture.run(["--provider-url", issuer.template, "--vehicle", "v", "--once"],
                                        environment: ["TOKEN_STORE_DB": db], in: scratch)
        #expect(result.status == 0, "\(result.stderr)")
        #expect(try await sqlite3(db, "SELECT subject_id FROM tokens") == "v")
    }

    @Test("kill -9 of a long-lived agent, then a restart reuses every stored token and the store is sound")
    func killAndRestart() async throws {
        let scratch = Scratch()
        let issuer = try await IssuerProcess(scratch: scratch)
        let db = scratch.file("tokens.sqlite")
        let subjects = (1...6).flatMap { ["--vehicle", "v\($0)"] }
        let agent = try AgentFixture.launch(["--db", db, "--provider-url", issuer.template] + subjects, in: scratch)
        #expect(await eventually(within: 30) { (try? await sqlite3(db, "SELECT count(*) FROM tokens WHERE token IS NOT NULL")) == "6" })
        agent.signal(SIGKILL)
        _ = await agent.wait(upTo: 5)
        #expect(try await sqlite3(db, "PRAGMA integrity_check") == "ok")
        let issued = try await issuer.stats().issued

        let again = try await AgentFixture.run(["--db", db, "--provider-url", issuer.template, "--once", "--json"] + subjects, in: scratch)
        #expect(again.status == 0, "\(again.stderr)")
        #expect(try onceResults(again.stdout).allSatisfy { $0["source"] == "store" })
        #expect(try await issuer.stats().issued == issued)
    }

    @Test("every expiration format, told explicitly or detected", arguments: ["epoch-seconds", "epoch-millis", "relative-seconds"])
    func expirationFormats(format: String) async throws {
        let scratch = Scratch()
        let issuer = try await IssuerProcess(scratch: scratch, lifetime: 1800)
        for told in [format, "auto"] {
            let db = scratch.file("\(told).sqlite")
            let result = try await AgentFixture.run([
                "--db", db, "--provider-url", issuer.template + "?expiration_format=\(format)",
                "--expiration-format", told, "--trip", "t", "--once", "--json",
            ], in: scratch)
            #expect(result.status == 0, "\(format) as \(told): \(result.stderr)")
            let stored = try await sqlite3(db, "SELECT expires_at - issued_at FROM tokens")
            #expect(Double(stored).map { abs($0 - 1800) < 2 } == true, "\(format) as \(told): lifetime \(stored)")
        }
    }

    @Test("provider faults through a real HTTP server: non-zero exit, a clear message, nothing stored", arguments: [
        ("fault=status&status=503&retry_after=30", "HTTP 503"),
        ("fault=status&status=403", "HTTP 403"),
        ("fault=html", "not a JSON object"),
        ("fault=missing-token", "lacks the \"VEHICLE_TOKEN_KEY\" field"),
        ("fault=huge-body", "larger than 1048576 bytes"),
        ("fault=hang", "did not answer within"),
        ("fault=wrong-subject", "authorization.vehicleid"),
        ("fault=expired", "expired"),
        ("fault=too-long", "Fleet Engine accepts"),
        ("fault=bad-base64", "not a JWT"),
    ])
    func providerFaults(query: String, message: String) async throws {
        let scratch = Scratch()
        let issuer = try await IssuerProcess(scratch: scratch)
        let db = scratch.file("tokens.sqlite")
        let result = try await AgentFixture.run([
            "--db", db, "--provider-url", issuer.template + "?\(query)", "--vehicle", "v1", "--once",
            "--request-timeout", "1",
        ], in: scratch)
        #expect(result.status == 1)
        #expect(result.stderr.contains("vehicle/v1"), "\(result.stderr)")
        #expect(result.stderr.contains(message), "\(result.stderr)")
        #expect(try await sqlite3(db, "SELECT count(*) FROM tokens WHERE token IS NOT NULL") == "0")
        #expect(try await sqlite3(db, "SELECT failure_count FROM tokens") == "1")
    }

    @Test("an unreachable provider is reported, and retried only after the persisted backoff")
    func unreachable() async throws {
        let scratch = Scratch()
        let result = try await AgentFixture.run(["--db", scratch.file("t.sqlite"), "--provider-url",
                                                        "http://127.0.0.1:1/token/{kind}/{id}", "--trip", "t", "--once"], in: scratch)
        #expect(result.status == 1)
        #expect(result.stderr.contains("unreachable"), "\(result.stderr)")
    }

    @Test("8 quick restarts against a failing provider send at most 4 requests")
    func crashLoop() async throws {
        let scratch = Scratch()
        let issuer = try await IssuerProcess(scratch: scratch)
        let db = scratch.file("tokens.sqlite")
        for _ in 0..<8 {
            let result = try await AgentFixture.run(["--db", db, "--provider-url", issuer.template + "?fault=status&status=500",
                                                            "--vehicle", "v1", "--once"], in: scratch)
            #expect(result.status == 1)
        }
        let requests = try await issuer.stats().requests
        #expect(requests >= 1 && requests <= 4, "requests: \(requests)")
    }

    @Test("bad arguments are usage errors (exit 64) with a clear message", arguments: [
        ["--vehicle", ""],
        ["--header", "no-colon"],
        ["--header-file", "Name-only"],
        ["--expiration-format", "weekly"],
        ["--provider-url", "https://auth.invalid/token"],
        ["--no-such-flag"],
        ["--request-timeout", "inf"],
        ["--connect-timeout", "0"],
        ["--vehicle", ".."],
        ["--trip", "."],
    ])
    func usageErrors(arguments: [String]) async throws {
        let scratch = Scratch()
        let result = try await AgentFixture.run(["--db", scratch.file("t.sqlite"), "--once"] + arguments, in: scratch)
        #expect(result.status == 64, "\(arguments): \(result.stderr)")
        #expect(result.stderr.contains("Error") || result.stderr.contains("error"), "\(result.stderr)")
    }

    // Issue 12 item 11: a malformed `--header 'Bearer <credential>'` was printed back whole.
    @Test("a malformed --header or --header-file is a usage error that names the flag, never the value", arguments: [
        ["--header", "Bearer s3cr3t-credential-value"],
        ["--header", "Authorization Bearer s3cr3t-credential-value: x"],
        ["--header", "X-Key: s3cr3t-credential-value\r\nX-Evil: 1"],
        ["--header-file", "Bearer s3cr3t-credential-value"],
    ])
    func headerNeverEchoed(arguments: [String]) async throws {
        let scratch = Scratch()
        let result = try await AgentFixture.run(["--db", scratch.file("t.sqlite"), "--provider-url", "https://auth.invalid/{kind}/{id}",
                                                        "--vehicle", "v", "--once"] + arguments, in: scratch)
        #expect(result.status == 64, "\(arguments): \(result.stderr)")
        #expect(result.stderr.contains(arguments[0]), "\(result.stderr)")
        #expect(!(result.stdout + result.stderr).contains("s3cr3t"), "\(result.stderr)")
    }

    @Test("plain http to a non-loopback provider is refused unless allowed")
    func insecureHTTP() async throws {
        let scratch = Scratch()
        let result = try await AgentFixture.run(["--db", scratch.file("t.sqlite"), "--provider-url", "http://auth.example.com/{kind}/{id}",
                                                        "--vehicle", "v", "--once"], in: scratch)
        #expect(result.status == 64)
        #expect(result.stderr.contains("--allow-insecure-http"))
    }
}

