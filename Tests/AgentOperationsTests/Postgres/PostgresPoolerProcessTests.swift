// Issue 30 item 3: token-agent and tokenctl through PgBouncer (the tests' own, in front of the
// shared private server). In session mode replicas share one database as they do directly: each
// key fetched once per lifetime between them, a change by one (or by tokenctl) reaching the
// other through LISTEN/NOTIFY. In transaction mode both programs refuse to start, saying why.
// Every process is stopped by its pid.

import Foundation
import Testing
import TestSupportKit
#if canImport(Glibc)
import Glibc
#endif

@Suite("token-agent and tokenctl through PgBouncer", .paced, .serialized, .exclusive, .enabled(if: PgBouncer.testsEnabled))
struct PostgresPoolerProcessTests {
    @Test("PgBouncer in session mode: two token-agents, 20 keys of 10 s tokens over 2+ lifetimes: each key fetched once per lifetime between them, each replica holds the other's fetches, a purge reaches both within 2 s")
    func replicasThroughSessionPooling() async throws {
        let (server, database) = try await PostgresServer.makeDatabase()
        let bouncer = try await PgBouncer.make(in: server, mode: .session)
        defer { bouncer.stop() }
        let scratch = Scratch()
        let lifetime = 10.0
        let issuer = try await IssuerProcess(scratch: scratch, lifetime: Int(lifetime))
        defer { issuer.process.signal(SIGTERM) }
        let ids = (0..<20).map { "bounced-\($0)" }
        let url = bouncer.url(database: database)
        let environment = ["PGPASSWORD": server.password]
        let sinks = (0..<2).map { scratch.file("sink-\($0)") }
        let replicas = try sinks.map { sink in
            try AgentFixture.launch(["--db", url, "--provider-url", issuer.template, "--sink", sink, "--log-level", "debug"]
                                    + ids.flatMap { ["--vehicle", $0] }, environment: environment, in: scratch)
        }
        defer { for replica in replicas { replica.signal(SIGTERM) } }
        func tails() -> String { replicas.enumerated().map { "[\($0.offset)] \($0.element.stderr.suffix(1500))" }.joined(separator: "\n") }
        func stored() async -> [String: String] {
            let rows = (try? await server.psql("SELECT subject_id || ' ' || token FROM fleet_token_store.tokens WHERE token IS NOT NULL",
                                         database: database)) ?? ""
            return Dictionary(rows.split(separator: "\n").compactMap { row -> (String, String)? in
                let fields = row.split(separator: " ", maxSplits: 1)
                return fields.count == 2 ? (String(fields[0]), String(fields[1])) : nil
            }, uniquingKeysWith: { first, _ in first })
        }
        func held(_ sink: String, _ id: String) -> String? {
            (try? String(contentsOfFile: "\(sink)/vehicle/\(id).jwt", encoding: .utf8))?.trimmingCharacters(in: .whitespacesAndNewlines)
        }
        /// Every replica's sink holds the database's token of every key.
        func converged() async -> Bool {
            let tokens = await stored()
            return tokens.count == ids.count && sinks.allSatisfy { sink in ids.allSatisfy { held(sink, $0) == tokens[$0] } }
        }
        // (Ends early when both replicas exited: the store refused to open.)
        _ = await eventually(within: 60) { await converged() || replicas.allSatisfy { !$0.isRunning } }
        try #require(await converged(), "the replicas did not both hold all \(ids.count) keys: \(tails())")

        // Two lifetimes and a bit: every key refreshed at least twice, by one replica or the other.
        let firstIssue = try await issuer.issuedTimes().values.compactMap(\.first).min() ?? Date().timeIntervalSince1970
        while Date().timeIntervalSince1970 < firstIssue + 2.3 * lifetime { try await Task.sleep(for: .milliseconds(500)) }
        for replica in replicas { #expect(replica.isRunning, "a replica exited: \(replica.stderr.suffix(2000))") }
        let times = try await issuer.issuedTimes()
        var twice: [String] = [], tooFew: [String] = []
        for id in ids {
            let issued = (times["vehicle/\(id)"] ?? []).sorted()
            if issued.count < 2 { tooFew.append("\(id): \(issued.count)") }
            for (earlier, gap) in IssuerProcess.refetchesTooSoon(issued, lifetime: lifetime) {
                twice.append("\(id): \(String(format: "%.2f", gap)) s apart at +\(String(format: "%.1f", earlier - firstIssue)) s")
            }
        }
        #expect(tooFew.isEmpty, "keys issued fewer than twice in 2.3 lifetimes: \(tooFew.prefix(10))")
        #expect(twice.isEmpty, "keys issued twice within one lifetime (single flight across replicas broken through PgBouncer): \(twice.prefix(10))")
        // Each key's refresh is done by one replica; the other holds it only by the change feed.
        #expect(await eventually(within: 5) { await converged() }, "the replicas' sinks do not both hold the database's tokens: \(tails())")

        // A change from outside: tokenctl purges one key through PgBouncer too; both replicas
        // refetch it (once between them) within 2 s. Purged in a later second than the last
        // issue, so the new token differs from the old (whole-second claims, deterministic RS256).
        let target = ids[0]
        let old = await stored()[target]
        let issuedBefore = (try await issuer.issuedTimes())["vehicle/\(target)"]?.count ?? 0
        let lastIssue = try await issuer.issuedTimes().values.flatMap { $0 }.max() ?? 0
        #expect(await eventually(within: 30) { Date().timeIntervalSince1970 >= lastIssue.rounded(.down) + 1.05 })
        let purge = try await runToEnd("tokenctl", ["purge", "--vehicle", target, "--db", url], environment: environment, in: scratch)
        try #require(purge.status == 0, "\(purge.stdout) \(purge.stderr)")
        let refetched = await eventually(within: 2) {
            guard let new = await stored()[target], new != old else { return false }
            return sinks.allSatisfy { held($0, target) == new }
        }
        #expect(refetched, "within 2 s of the purge the replicas did not both hold a new token for \(target): \(tails())")
        try await Task.sleep(for: .seconds(1))
        let issuedAfter = (try await issuer.issuedTimes())["vehicle/\(target)"]?.count ?? 0
        #expect(issuedAfter - issuedBefore <= 2, "the purge made \(issuedAfter - issuedBefore) fetches of \(target)")
        #expect(!bouncer.log.contains("unsupported startup parameter"), "\(bouncer.log.suffix(2000))")

        for replica in replicas { replica.signal(SIGTERM) }
        for replica in replicas { #expect(await replica.wait(upTo: 15) == 0, "\(replica.stderr.suffix(2000))") }
    }

    @Test("PgBouncer in transaction mode: token-agent exits 1 at start saying it needs session pooling; tokenctl refuses the same way; the database is left untouched")
    func transactionPoolingRefusedAtStart() async throws {
        let (server, database) = try await PostgresServer.makeDatabase()
        let bouncer = try await PgBouncer.make(in: server, mode: .transaction)
        defer { bouncer.stop() }
        let scratch = Scratch()
        let url = bouncer.url(database: database)
        let environment = ["PGPASSWORD": server.password]
        let expected = "in transaction or statement mode"
        let remedy = "the store needs session pooling (pool_mode = session) for LISTEN/NOTIFY"

        let agent = try await AgentFixture.run(["--db", url, "--provider-url", "http://127.0.0.1:1/token/{id}", "--vehicle", "v1"],
                                               environment: environment, in: scratch, timeout: 60)
        #expect(agent.status == 1, "token-agent exited \(agent.status): \(agent.stderr)")
        #expect(agent.stderr.contains(expected) && agent.stderr.contains(remedy), "\(agent.stderr)")
        #expect(agent.stderr.contains("postgres://fleet@127.0.0.1:\(bouncer.port)/\(database)"), "the message names the URL: \(agent.stderr)")

        for command in [["migrate"], ["list"], ["purge", "--vehicle", "v1"]] {
            let tokenctl = try await runToEnd("tokenctl", command + ["--db", url], environment: environment, in: scratch)
            #expect(tokenctl.status != 0, "tokenctl \(command[0]) exited 0 through transaction pooling: \(tokenctl.stdout)")
            #expect(tokenctl.stderr.contains(expected) && tokenctl.stderr.contains(remedy), "tokenctl \(command[0]): \(tokenctl.stderr)")
        }
        for output in [agent.stdout, agent.stderr] { #expect(!output.contains(server.password)) }
        #expect(try await server.psql("SELECT count(*) FROM pg_namespace WHERE nspname = 'fleet_token_store'", database: database) == "0",
                "a refused start created the schema")
    }
}
