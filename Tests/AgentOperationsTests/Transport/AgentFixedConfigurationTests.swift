// Issue 27 item 7 from the outside: a persisted failure is bound to the provider configuration
// that made it. Real token-agent `--once` runs against real TLS servers (a private CA, mutual
// TLS) on one store: a run whose configuration was fixed (--ca-file, --client-cert added) tries
// at once; a run with the same configuration honours the backoff, sends nothing, and says that
// the failure is an earlier attempt's, when it was, the next attempt, and how to retry now.

import FleetTokenStoreTesting
import FleetTokenStore
import Foundation
import TestSupportKit
import Testing

@Suite("token-agent tries a fixed configuration at once", .paced, .serialized, .exclusive)
struct AgentFixedConfigurationTests {
    @Test("--ca-file added after a refused run: the next run fetches at once, though the refused run's backoff still runs")
    func caFileAddedIsTriedAtOnce() async throws {
        let pki = try TestPKI()
        defer { pki.removeFiles() }
        let server = try TLSTokenServer(pki: pki, answer: TLSTokenServer.anyKindToken())
        try await server.whileRunning {
            let scratch = Scratch()
            let db = scratch.file("tokens.sqlite")
            let base = ["--db", db, "--provider-url", server.baseURL + "/token/{kind}/{id}", "--vehicle", "v-tls", "--once"]
            let refused = try await AgentFixture.runDirect(base, scratch)
            #expect(refused.status == 1)
            #expect(refused.stderr.contains("TLS certificate problem"), "\(refused.stderr)")
            // The refused run's backoff is stored and still runs (30 s for a certificate error).
            #expect(try await sqlite3(db, "SELECT failure_count FROM tokens WHERE subject_id = 'v-tls'") == "1")
            #expect(try await sqlite3(db, "SELECT next_attempt_at > (julianday('now') - 2440587.5) * 86400 + 5 FROM tokens WHERE subject_id = 'v-tls'") == "1")

            let trusted = try await AgentFixture.runDirect(base + ["--ca-file", pki.caPath, "--json"], scratch)
            #expect(trusted.status == 0, "the fixed configuration was not tried: \(trusted.stderr)")
            #expect(try onceResults(trusted.stdout).map { $0["source"] } == ["provider"])
            #expect(server.requests.count == 1)
            #expect(try await sqlite3(db, "SELECT failure_count FROM tokens WHERE subject_id = 'v-tls'") == "0")
        }
    }

    @Test("--client-cert added after the server refused the run without one: the next run is accepted at once")
    func clientCertificateAddedIsTriedAtOnce() async throws {
        let pki = try TestPKI()
        defer { pki.removeFiles() }
        let client = try pki.issueClient(commonName: "gateway-7")
        let server = try TLSTokenServer(pki: pki, requireClientCertificate: true, answer: TLSTokenServer.anyKindToken())
        try await server.whileRunning {
            let scratch = Scratch()
            let db = scratch.file("tokens.sqlite")
            let base = ["--db", db, "--provider-url", server.baseURL + "/token/{kind}/{id}", "--ca-file", pki.caPath,
                        "--vehicle", "v-tls", "--once"]
            let refused = try await AgentFixture.runDirect(base, scratch)
            #expect(refused.status == 1)
            #expect(refused.stderr.contains("--client-cert"), "\(refused.stderr)")
            #expect(try await sqlite3(db, "SELECT failure_count FROM tokens WHERE subject_id = 'v-tls'") == "1")

            let accepted = try await AgentFixture.runDirect(base + ["--client-cert", client.chainPath, "--client-key", client.keyPath], scratch)
            #expect(accepted.status == 0, "the fixed configuration was not tried: \(accepted.stderr)")
            #expect(server.requests.map(\.clientCommonName) == ["gateway-7"])
        }
    }

    @Test("the same configuration again: the backoff holds, nothing is sent, and the run reports the earlier attempt, its time, the next attempt and how to retry now (text and JSON)")
    func unchangedConfigurationHoldsTheBackoff() async throws {
        let pki = try TestPKI()
        defer { pki.removeFiles() }
        let server = try TLSTokenServer(pki: pki, requireClientCertificate: true, answer: TLSTokenServer.anyKindToken())
        try await server.whileRunning {
            let scratch = Scratch()
            let db = scratch.file("tokens.sqlite")
            let base = ["--db", db, "--provider-url", server.baseURL + "/token/{kind}/{id}", "--ca-file", pki.caPath,
                        "--vehicle", "v-tls", "--once"]
            let refused = try await AgentFixture.runDirect(base, scratch)
            #expect(refused.status == 1)
            let connections = server.connectionCount
            #expect(connections >= 1)
            #expect(!refused.stderr.contains("not tried now"), "this run's own attempt is not an earlier one: \(refused.stderr)")

            let again = try await AgentFixture.runDirect(base, scratch)
            #expect(again.status == 1)
            #expect(server.connectionCount == connections, "the unchanged configuration was tried during its backoff")
            #expect(again.stderr.contains("not tried now, an earlier attempt still backs off"), "\(again.stderr)")
            #expect(again.stderr.contains("TLS certificate problem"), "\(again.stderr)")
            #expect(again.stderr.contains("--client-cert and --client-key"), "the flag that fixes it: \(again.stderr)")
            #expect(again.stderr.contains("next attempt at"), "\(again.stderr)")
            let retry = "tokenctl --db \(db) purge --vehicle v-tls --include-failures"
            #expect(again.stderr.contains(retry), "\(again.stderr)")

            let json = try await AgentFixture.runDirect(base + ["--json"], scratch)
            #expect(json.status == 1)
            #expect(server.connectionCount == connections)
            let objects = try onceResults(json.stdout)
            #expect(objects.count == 1)
            let failed = try #require(objects.first)
            #expect(failed["id"] == "v-tls" && failed["kind"] == "vehicle")
            #expect(failed["attempt"] == "earlier")
            #expect(failed["error_kind"] == "tlsCertificate")
            #expect(failed["retry_now"] == retry)
            let stored = try await sqlite3(db, "SELECT last_failure_at || ' ' || next_attempt_at FROM tokens WHERE subject_id = 'v-tls'")
                .split(separator: " ").compactMap { Double($0) }
            let failedAt = try #require(failed["failed_at"].flatMap { try? Date($0, strategy: .iso8601) })
            let nextAttempt = try #require(failed["next_attempt_at"].flatMap { try? Date($0, strategy: .iso8601) })
            #expect(stored.count == 2)
            #expect(abs(failedAt.timeIntervalSince1970 - (stored.first ?? 0)) < 1.5)
            #expect(abs(nextAttempt.timeIntervalSince1970 - (stored.last ?? 0)) < 1.5)

            // The command it names clears the backoff: the next run tries (and is refused) again.
            let purge = try await runToEnd("tokenctl", ["--db", db, "purge", "--vehicle", "v-tls", "--include-failures"], in: scratch)
            #expect(purge.status == 0, "\(purge.stderr)")
            let retried = try await AgentFixture.runDirect(base, scratch)
            #expect(retried.status == 1)
            #expect(server.connectionCount > connections, "after the purge the subject was not tried")
        }
    }
}
