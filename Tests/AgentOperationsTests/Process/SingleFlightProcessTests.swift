import FleetTokenStoreTesting
import FleetTokenStore
import Foundation
import TestSupportKit
import Logging
import Testing

/// The README's promise that agents sharing a store fetch each key once between them, with real
/// `token-agent` processes (issue 12, items 1-3).
@Suite("Single flight between real agent processes", .paced, .serialized)
struct SingleFlightProcessTests {
    @Test("two long-lived agents, 100 vehicles, a provider slower than the lease: each key fetched exactly once")
    func twoAgentsFetchEachKeyOnce() async throws {
        let scratch = Scratch()
        let issuer = try await IssuerProcess(scratch: scratch)
        let db = scratch.file("tokens.sqlite")
        let subjects = (0..<100).flatMap { ["--vehicle", "truck-\($0)"] }
        // Each answer takes 1.5 s; the lease lasts 1 s, so it must be renewed while the fetch runs,
        // and 100 keys queue for 8 fetch slots in each agent.
        let url = issuer.template + "?fault=slow&delay_ms=1500"
        let arguments = ["--db", db, "--provider-url", url, "--lease-duration", "1", "--log-level", "debug"] + subjects
        let first = try AgentFixture.launch(arguments, in: scratch)
        let second = try AgentFixture.launch(arguments, in: scratch)
        defer {
            first.signal(SIGTERM)
            second.signal(SIGTERM)
        }
        #expect(await eventually(within: 60) { (try? await sqlite3(db, "SELECT count(*) FROM tokens WHERE token IS NOT NULL")) == "100" })
        try await Task.sleep(for: .seconds(3)) // room for a wrongful second fetch to show
        let stats = try await issuer.stats()
        #expect(stats.requests == 100, "the provider saw \(stats.requests) requests for 100 keys")
        for agent in [first, second] {
            #expect(!agent.stderr.contains("noProgress") && !agent.stderr.contains("expires no later than"))
        }
        first.signal(SIGTERM)
        second.signal(SIGTERM)
        #expect(await first.wait(upTo: 10) == 0)
        #expect(await second.wait(upTo: 10) == 0)
    }

    @Test("--retention: the agent deletes the row of a subject nobody tracks once expired that long; tracked rows stay")
    func retention() async throws {
        let scratch = Scratch()
        let issuer = try await IssuerProcess(scratch: scratch)
        let db = scratch.file("tokens.sqlite")
        // A trip another agent finished hours ago, and one that ended a minute ago.
        let store = try SQLiteTokenRepository(path: db, logger: Logger(label: "seed"))
        for (id, issued) in [("finished-trip", Date() - 3 * 3600), ("recent-trip", Date() - 3660)] {
            let key = try TokenKey.trip(id)
            try await store.upsert(StoredToken(key: key, value: TestJWT.make(for: key, issuedAt: issued), expiresAt: issued + 3600,
                                               issuedAt: issued, fetchedAt: issued))
        }
        store.close()
        let agent = try AgentFixture.launch(["--db", db, "--provider-url", issuer.template, "--vehicle", "truck-1",
                                                       "--retention", "1h"], in: scratch)
        defer { agent.signal(SIGTERM) }
        #expect(await eventually(within: 30) { (try? await sqlite3(db, "SELECT count(*) FROM tokens WHERE subject_id = 'finished-trip'")) == "0" })
        #expect(try await sqlite3(db, "SELECT count(*) FROM tokens WHERE subject_id = 'recent-trip'") == "1")
        #expect(try await sqlite3(db, "SELECT count(*) FROM tokens WHERE subject_id = 'truck-1' AND token IS NOT NULL") == "1")
        agent.signal(SIGTERM)
        #expect(await agent.wait(upTo: 10) == 0)
    }

    @Test("--retention takes 90s, 30m, 24h, 7d and 0; anything else is a usage error", arguments: ["24x", "-1h", "1.5h", "h", "99999d"])
    func retentionUsage(value: String) async throws {
        let scratch = Scratch()
        let result = try await AgentFixture.run(["--db", scratch.file("t.sqlite"), "--vehicle", "v1", "--retention", value], in: scratch)
        #expect(result.status == 64, "\(value): \(result.stderr)")
        #expect(result.stderr.contains("retention"), "\(result.stderr)")
    }

    @Test("--retention accepts its documented forms", arguments: ["90s", "30m", "24h", "7d", "0", "3600"])
    func retentionForms(value: String) async throws {
        let scratch = Scratch()
        let result = try await AgentFixture.run(["--db", scratch.file("t.sqlite"), "--vehicle", "v1", "--retention", value, "--once"], in: scratch)
        #expect(result.status == 0, "\(value): \(result.stderr)")
    }
}
