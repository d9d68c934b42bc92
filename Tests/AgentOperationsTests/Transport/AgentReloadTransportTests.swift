// Issue 18 from the outside: a real token-agent process, configured by a file, against the test
// kit's TLS token server. A reload (SIGHUP) swaps header files and CA bundles without a restart,
// a reload that cannot be applied changes nothing, and --exit-on-permanent-error gives up (exit
// 78) only when the provider refuses every subject.

import FleetTokenStore
import Foundation
import TestSupportKit
import Testing
#if canImport(Glibc)
import Glibc
#endif

@Suite("token-agent reloads its transport and gives up on permanent refusals", .paced, .serialized, .exclusive)
struct AgentReloadTransportTests {
    // MARK: reload: header files

    @Test("SIGHUP after the config file points header-file elsewhere and adds a vehicle: the new subject and later fetches carry the new header; no secret is printed")
    func headerFileChangedByReload() async throws {
        let pki = try TestPKI()
        defer { pki.removeFiles() }
        let server = try TLSTokenServer(pki: pki, answer: TLSTokenServer.anyKindToken())
        try await server.whileRunning {
            let scratch = Scratch()
            let db = scratch.file("tokens.sqlite")
            let (keyA, keyB) = (scratch.file("key-a"), scratch.file("key-b"))
            try writeAtomically("alpha-secret\n", to: keyA)
            try writeAtomically("bravo-secret\n", to: keyB)
            let config = scratch.file("token-agent.yaml")
            func writeConfig(headerFile: String, vehicles: [String]) throws {
                try writeAtomically("""
                    db: "\(db)"
                    provider-url: "\(server.baseURL)/token/{kind}/{id}"
                    ca-file: ["\(pki.caPath)"]
                    vehicle: [\(vehicles.joined(separator: ", "))]
                    header-file: ["X-Api-Key:\(headerFile)"]
                    log-level: debug

                    """, to: config)
            }
            try writeConfig(headerFile: keyA, vehicles: ["v-1"])
            let running = try AgentFixture.launchDirect(["--config", config, "--json"], scratch)

            #expect(await eventually(within: 60) { server.requests.contains { $0.lastPathComponent == "v-1" } }, "\(running.stderr)")
            #expect(server.requests.map { $0.headers.first(name: "X-Api-Key") } == ["alpha-secret"])
            #expect(await eventually(within: 60) { events(running, "refreshed").contains { $0["id"] == "v-1" } }, "\(running.stdout)")

            try writeConfig(headerFile: keyB, vehicles: ["v-1", "v-2"])
            running.signal(SIGHUP)
            #expect(await eventually(within: 60) { !events(running, "config_reloaded").isEmpty }, "\(running.stderr)")
            let reloads = events(running, "config_reloaded")
            #expect(reloads.contains { Set(($0["changed"] ?? "").split(separator: ",")).isSuperset(of: ["header-file", "vehicle"]) },
                    "\(reloads)")
            #expect(reloads.allSatisfy { $0["restart_needed"] == "" }, "\(reloads)")

            // The subject the reload added is fetched with the header the reload configured.
            #expect(await eventually(within: 60) { events(running, "refreshed").contains { $0["id"] == "v-2" } },
                    "\(running.stdout)\n\(running.stderr)")
            let forV2 = server.requests.filter { $0.lastPathComponent == "v-2" }.map { $0.headers.first(name: "X-Api-Key") }
            // The new client is installed before the added subjects are tracked (it went out with
            // the old header in 8 runs of 12 when the order was the other way round).
            #expect(forV2 == ["bravo-secret"], "the new subject's first request went out with the old header file")

            // So is the next fetch of a subject tracked before the reload (a purge forces one).
            let purge = try await runToEnd("tokenctl", ["--db", db, "purge", "--vehicle", "v-1"], in: scratch)
            #expect(purge.status == 0, "\(purge.stderr)")
            #expect(await eventually(within: 60) { server.requests.filter { $0.lastPathComponent == "v-1" }.count >= 2 }, "\(running.stderr)")
            #expect(server.requests.filter { $0.lastPathComponent == "v-1" }.map { $0.headers.first(name: "X-Api-Key") }
                    == ["alpha-secret", "bravo-secret"])

            #expect(running.isRunning)
            running.signal(SIGTERM)
            #expect(await running.wait(upTo: 20) == 0, "\(running.stderr)")
            for (name, text) in [("stdout", running.stdout), ("stderr", running.stderr)] {
                #expect(!text.contains("alpha-secret") && !text.contains("bravo-secret"), "a header value shows on \(name): \(text)")
            }
        }
    }

    @Test("header values from the config file (changed by a reload) or from TOKEN_AGENT_HEADER are sent but never show on stdout or stderr, even at debug level")
    func headerValuesNeverPrinted() async throws {
        let pki = try TestPKI()
        defer { pki.removeFiles() }
        let server = try TLSTokenServer(pki: pki, answer: TLSTokenServer.anyKindToken())
        try await server.whileRunning {
            let scratch = Scratch()
            let db = scratch.file("tokens.sqlite")
            let config = scratch.file("token-agent.yaml")
            func writeConfig(header: String) throws {
                try writeAtomically("""
                    db: "\(db)"
                    provider-url: "\(server.baseURL)/token/{kind}/{id}"
                    ca-file: ["\(pki.caPath)"]
                    vehicle: [v-1]
                    header: ["X-Api-Key: \(header)"]
                    log-level: debug

                    """, to: config)
            }
            func sent(_ subject: String) -> [String?] {
                server.requests.filter { $0.lastPathComponent == subject }.map { $0.headers.first(name: "X-Api-Key") }
            }
            try writeConfig(header: "charlie-secret")
            let fromFile = try AgentFixture.launchDirect(["--config", config, "--json"], scratch)
            #expect(await eventually(within: 60) { sent("v-1") == ["charlie-secret"] }, "\(fromFile.stderr)")
            try writeConfig(header: "delta-secret")
            fromFile.signal(SIGHUP)
            #expect(await eventually(within: 60) { events(fromFile, "config_reloaded").contains { ($0["changed"] ?? "").split(separator: ",").contains("header") } },
                    "\(fromFile.stdout)")
            let purge = try await runToEnd("tokenctl", ["--db", db, "purge", "--vehicle", "v-1"], in: scratch)
            #expect(purge.status == 0, "\(purge.stderr)")
            #expect(await eventually(within: 60) { sent("v-1") == ["charlie-secret", "delta-secret"] }, "\(fromFile.stderr)")
            fromFile.signal(SIGTERM)
            #expect(await fromFile.wait(upTo: 20) == 0, "\(fromFile.stderr)")

            let fromEnvironment = try AgentFixture.launchDirect(["--db", scratch.file("env.sqlite"), "--provider-url", server.baseURL + "/token/{kind}/{id}",
                                                  "--ca-file", pki.caPath, "--vehicle", "v-9", "--log-level", "debug", "--json"], scratch,
                                                 environment: ["TOKEN_AGENT_HEADER": "X-Api-Key: echo-secret"])
            #expect(await eventually(within: 60) { sent("v-9") == ["echo-secret"] }, "\(fromEnvironment.stderr)")
            fromEnvironment.signal(SIGTERM)
            #expect(await fromEnvironment.wait(upTo: 20) == 0, "\(fromEnvironment.stderr)")

            let secrets = ["charlie-secret", "delta-secret", "echo-secret"]
            for text in [fromFile.stdout, fromEnvironment.stdout] {
                #expect(secrets.filter { text.contains($0) }.isEmpty, "header values show on stdout: \(text)")
            }
            let stderr = [fromFile.stderr, fromEnvironment.stderr].joined(separator: "\n").split(separator: "\n")
            let agentLines = stderr.filter { !$0.contains("[ServiceLifecycle]") }.joined(separator: "\n")
            #expect(secrets.filter { agentLines.contains($0) }.isEmpty, "header values show on stderr: \(agentLines)")
            // At debug level swift-service-lifecycle logs each service's `String(describing:)`
            // ("Starting service", "Service finished", …); the reload service holds the settings
            // (header values) and the environment, so its description must not show them.
            let lifecycleLines = stderr.filter { $0.contains("[ServiceLifecycle]") }.joined(separator: "\n")
            #expect(secrets.filter { lifecycleLines.contains($0) }.isEmpty, "header values show in ServiceLifecycle's lines")
        }
    }

    // MARK: reload: CA files

    @Test("a wrong CA bundle fails with tlsCertificate; a reload to the right one refreshes in the same process; a reload naming a missing CA file is refused and changes nothing")
    func caFileFixedByReload() async throws {
        let pki = try TestPKI()
        let foreign = try TestPKI(name: "Some Other Test CA")
        defer {
            pki.removeFiles()
            foreign.removeFiles()
        }
        let server = try TLSTokenServer(pki: pki, answer: TLSTokenServer.anyKindToken())
        try await server.whileRunning {
            let scratch = Scratch()
            let db = scratch.file("tokens.sqlite")
            let wrongBundle = scratch.file("wrong-bundle.pem")
            try writeAtomically(foreign.ca.certificatePEM, to: wrongBundle)
            let config = scratch.file("token-agent.yaml")
            func writeConfig(caFile: String) throws {
                try writeAtomically("""
                    db: "\(db)"
                    provider-url: "\(server.baseURL)/token/{kind}/{id}"
                    ca-file: ["\(caFile)"]
                    vehicle: [v-1]

                    """, to: config)
            }
            try writeConfig(caFile: wrongBundle)
            // The default backoff after a certificate error (15-30 s) is longer than the bound
            // below: the refresh has to come from the reload, which retries failing subjects.
            let running = try AgentFixture.launchDirect(["--config", config, "--json"], scratch)
            let pid = running.pid

            #expect(await eventually(within: 60) { events(running, "failed").contains { $0["id"] == "v-1" } }, "\(running.stderr)")
            #expect(events(running, "failed").first?["error_kind"] == "tlsCertificate", "\(running.stdout)")
            #expect(server.requests.isEmpty)
            // The server records the failed handshake when it reads the agent's alert, on an
            // event loop of its own: possibly after the agent has reported the failure.
            #expect(await eventually(within: 10) { !server.handshakeFailures.isEmpty })
            let nextAttempt = try #require(events(running, "failed").first?["next_attempt_at"].flatMap { try? Date($0, strategy: .iso8601) })

            try writeConfig(caFile: pki.caPath)
            running.signal(SIGHUP)
            #expect(await eventually(within: 30) { events(running, "config_reloaded").contains { ($0["changed"] ?? "").contains("ca-file") } },
                    "\(running.stdout)\n\(running.stderr)")
            #expect(await eventually(within: 30) { events(running, "refreshed").contains { $0["id"] == "v-1" } },
                    "\(running.stdout)\n\(running.stderr)")
            #expect(Date() < nextAttempt, "refreshed by the backoff's end, not by the reload")
            #expect(running.isRunning && running.pid == pid)
            #expect(server.requests.map(\.lastPathComponent).contains("v-1"))

            // A CA file that does not exist: the reload is refused and the client in force stays.
            let missing = scratch.file("no-such-ca.pem")
            try writeConfig(caFile: missing)
            running.signal(SIGHUP)
            #expect(await eventually(within: 60) { !events(running, "reload_failed").isEmpty }, "\(running.stdout)\n\(running.stderr)")
            let refusal = try #require(events(running, "reload_failed").first)
            #expect(refusal["path"] == config, "\(refusal)")
            #expect(refusal["error"]?.contains("no-such-ca.pem") == true, "\(refusal)")
            #expect(running.isRunning)

            let served = events(running, "refreshed").count
            let failuresBefore = events(running, "failed").count
            let purge = try await runToEnd("tokenctl", ["--db", db, "purge", "--vehicle", "v-1"], in: scratch)
            #expect(purge.status == 0, "\(purge.stderr)")
            #expect(await eventually(within: 60) { events(running, "refreshed").count > served }, "\(running.stdout)\n\(running.stderr)")
            #expect(events(running, "failed").count == failuresBefore, "the refused reload changed the client: \(running.stdout)")
            #expect(running.isRunning && running.pid == pid)

            running.signal(SIGTERM)
            #expect(await running.wait(upTo: 20) == 0, "\(running.stderr)")
        }
    }

    @Test("a CA bundle rewritten in place (the config file unchanged) is read again on SIGHUP")
    func caBundleRotatedInPlace() async throws {
        let pki = try TestPKI()
        let foreign = try TestPKI(name: "Some Other Test CA")
        defer {
            pki.removeFiles()
            foreign.removeFiles()
        }
        let server = try TLSTokenServer(pki: pki, answer: TLSTokenServer.anyKindToken())
        try await server.whileRunning {
            let scratch = Scratch()
            let bundle = scratch.file("provider-ca.pem")
            try writeAtomically(foreign.ca.certificatePEM, to: bundle)
            let config = scratch.file("token-agent.yaml")
            try writeAtomically("""
                db: "\(scratch.file("tokens.sqlite"))"
                provider-url: "\(server.baseURL)/token/{kind}/{id}"
                ca-file: ["\(bundle)"]
                vehicle: [v-1]

                """, to: config)
            let running = try AgentFixture.launchDirect(["--config", config, "--json"], scratch)
            #expect(await eventually(within: 60) { events(running, "failed").contains { $0["error_kind"] == "tlsCertificate" } },
                    "\(running.stdout)\n\(running.stderr)")
            let nextAttempt = try #require(events(running, "failed").first?["next_attempt_at"].flatMap { try? Date($0, strategy: .iso8601) })

            try writeAtomically(foreign.ca.certificatePEM + pki.ca.certificatePEM, to: bundle)
            running.signal(SIGHUP)
            // Within the first backoff (15-30 s): the SIGHUP read the bundle again and retried.
            #expect(await eventually(within: 30) { events(running, "refreshed").contains { $0["id"] == "v-1" } },
                    "\(running.stdout)\n\(running.stderr)")
            #expect(Date() < nextAttempt, "refreshed by the backoff's end, not by the reload")
            #expect(events(running, "reload_failed").isEmpty)
            #expect(running.isRunning)
            running.signal(SIGTERM)
            #expect(await running.wait(upTo: 20) == 0, "\(running.stderr)")
        }
    }

    // MARK: --exit-on-permanent-error

    @Test("--exit-on-permanent-error: 403 to every subject, twice in a row, ends the agent with 78 and says why")
    func exitOnPermanentError() async throws {
        let pki = try TestPKI()
        defer { pki.removeFiles() }
        let server = try TLSTokenServer(pki: pki, answer: Self.forbidden)
        try await server.whileRunning {
            let scratch = Scratch()
            let started = Date()
            let running = try startRefusedAgent(server, pki, scratch, ["--exit-on-permanent-error"])
            let status = await running.wait(upTo: 30)
            #expect(status == 78, "\(running.stderr)")
            #expect(Date().timeIntervalSince(started) < 30)
            #expect(running.stderr.contains(" critical "), "a critical log line: \(running.stderr)")
            #expect(running.stderr.contains("refused every subject"), "\(running.stderr)")
            #expect(running.stderr.contains("--exit-on-permanent-error"), "\(running.stderr)")
            for subject in ["a", "b"] {
                #expect(server.requests.filter { $0.lastPathComponent == subject }.count >= 2, "\(server.requests.map(\.uri))")
            }
        }
    }

    @Test("without --exit-on-permanent-error the same refusals are retried: the agent is still running after 3 per subject")
    func noExitWithoutTheFlag() async throws {
        let pki = try TestPKI()
        defer { pki.removeFiles() }
        let server = try TLSTokenServer(pki: pki, answer: Self.forbidden)
        try await server.whileRunning {
            let scratch = Scratch()
            let running = try startRefusedAgent(server, pki, scratch, [])
            #expect(await eventually(within: 30) {
                ["a", "b"].allSatisfy { subject in events(running, "failed").filter { $0["id"] == subject }.count >= 3 }
            }, "\(running.stdout)\n\(running.stderr)")
            #expect(await running.wait(upTo: 1) == nil, "\(running.stderr)")
            running.signal(SIGTERM)
            #expect(await running.wait(upTo: 20) == 0, "\(running.stderr)")
        }
    }

    @Test("--exit-on-permanent-error with one subject refused and the other served: the agent keeps running")
    func noExitWhileOneSubjectIsServed() async throws {
        let pki = try TestPKI()
        defer { pki.removeFiles() }
        let tokens = TLSTokenServer.anyKindToken()
        let server = try TLSTokenServer(pki: pki, answer: { request in
            request.lastPathComponent == "a" ? await Self.forbidden(request) : await tokens(request)
        })
        try await server.whileRunning {
            let scratch = Scratch()
            let running = try startRefusedAgent(server, pki, scratch, ["--exit-on-permanent-error"])
            #expect(await eventually(within: 30) { events(running, "failed").filter { $0["id"] == "a" }.count >= 3 },
                    "\(running.stdout)\n\(running.stderr)")
            #expect(await running.wait(upTo: 1) == nil, "\(running.stderr)")
            #expect(events(running, "refreshed").contains { $0["id"] == "b" })
            #expect(server.requests.filter { $0.lastPathComponent == "b" }.count == 1)
            running.signal(SIGTERM)
            #expect(await running.wait(upTo: 20) == 0, "\(running.stderr)")
        }
    }

    @Test("exit-on-permanent-error and permanent-error-attempts from the config file: one 403 per subject ends the agent with 78")
    func exitOnPermanentErrorFromConfigFile() async throws {
        let pki = try TestPKI()
        defer { pki.removeFiles() }
        let server = try TLSTokenServer(pki: pki, answer: Self.forbidden)
        try await server.whileRunning {
            let scratch = Scratch()
            let config = scratch.file("token-agent.yaml")
            try writeAtomically("""
                db: "\(scratch.file("tokens.sqlite"))"
                provider-url: "\(server.baseURL)/token/{kind}/{id}"
                ca-file: ["\(pki.caPath)"]
                vehicle: [a, b]
                exit-on-permanent-error: true
                permanent-error-attempts: 1

                """, to: config)
            let started = Date()
            let running = try AgentFixture.launchDirect(["--config", config, "--json"], scratch)
            #expect(await running.wait(upTo: 30) == 78, "\(running.stderr)")
            #expect(Date().timeIntervalSince(started) < 30)
            #expect(running.stderr.contains("refused every subject"), "\(running.stderr)")
            #expect(running.stderr.contains("1 times in a row"), "\(running.stderr)")
            for subject in ["a", "b"] {
                #expect(server.requests.filter { $0.lastPathComponent == subject }.count >= 1, "\(server.requests.map(\.uri))")
            }
        }
    }

    // MARK: support

    /// 403 with a small JSON body, for every request.
    static let forbidden: TLSTokenServer.Respond = { _ in
        .init(status: .forbidden, body: #"{"error":"forbidden"}"#)
    }
}

/// The agent of the refusal tests: subjects `a` and `b`, two refusals in a row count as
/// permanent, and backoffs short enough that they come within a second.
private func startRefusedAgent(_ server: TLSTokenServer, _ pki: TestPKI, _ scratch: Scratch, _ extra: [String]) throws -> RunningProcess {
    try AgentFixture.launchDirect(["--db", scratch.file("tokens.sqlite"), "--provider-url", server.baseURL + "/token/{kind}/{id}",
                    "--ca-file", pki.caPath, "--vehicle", "a", "--vehicle", "b", "--json",
                    "--permanent-error-attempts", "2", "--failure-backoff", "0.2"] + extra, scratch)
}

/// The `--json` events named `event` that the agent printed so far, in order.
private func events(_ running: RunningProcess, _ event: String) -> [[String: String]] {
    running.stdout.split(separator: "\n").compactMap { line -> [String: String]? in
        guard line.hasPrefix("{"), let object = try? JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: String] else { return nil }
        return object["event"] == event ? object : nil
    }
}

/// Writes `text` to `path` through a temporary file and a rename, as an editor or a
/// configuration tool does, so the agent's file watcher never sees half a file.
private func writeAtomically(_ text: String, to path: String) throws {
    let temporary = path + ".tmp-\(UUID().uuidString.prefix(8))"
    try Data(text.utf8).write(to: URL(fileURLWithPath: temporary))
    guard rename(temporary, path) == 0 else {
        try? FileManager.default.removeItem(atPath: temporary)
        throw ProcessFailure(message: "cannot rename \(temporary) to \(path): errno \(errno)")
    }
}
