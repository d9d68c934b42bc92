import Foundation
import Testing

/// The README's promise that agents sharing a store fetch each key once between them, with real
/// `token-agent` processes (issue 12, items 1-3).
@Suite("Single flight between real agent processes", .serialized)
struct SingleFlightProcessTests {
    @Test("two long-lived agents, 40 vehicles, a provider slower than the lease: each key fetched exactly once")
    func twoAgentsFetchEachKeyOnce() async throws {
        let scratch = Scratch()
        let issuer = try await IssuerProcess(scratch: scratch)
        let db = scratch.file("tokens.sqlite")
        let subjects = (0..<40).flatMap { ["--vehicle", "truck-\($0)"] }
        // Each answer takes 1.5 s; the lease lasts 1 s, so it must be renewed while the fetch runs,
        // and 40 keys queue for 8 fetch slots in each agent.
        let url = issuer.template + "?fault=slow&delay_ms=1500"
        let arguments = ["--db", db, "--provider-url", url, "--lease-duration", "1", "--log-level", "debug"] + subjects
        let first = try RunningProcess("token-agent", arguments, in: scratch)
        let second = try RunningProcess("token-agent", arguments, in: scratch)
        defer {
            first.signal(SIGTERM)
            second.signal(SIGTERM)
        }
        #expect(await poll(within: 60) { (try? sqlite3(db, "SELECT count(*) FROM tokens WHERE token IS NOT NULL")) == "40" })
        try await Task.sleep(for: .seconds(3)) // room for a wrongful second fetch to show
        let stats = try await issuer.stats()
        #expect(stats.requests == 40, "the provider saw \(stats.requests) requests for 40 keys")
        for agent in [first, second] {
            #expect(!agent.stderr.contains("noProgress") && !agent.stderr.contains("expires no later than"))
        }
        first.signal(SIGTERM)
        second.signal(SIGTERM)
        #expect(await first.wait(upTo: 10) == 0)
        #expect(await second.wait(upTo: 10) == 0)
    }
}
