// Issue 27 item 8 with a real agent: the first retention sweep runs when the earliest row
// becomes eligible. It used to run 5 s after start and then only a minute later (an hour for
// periods of an hour or more), so rows that became eligible just after the first sweep stayed.

import FleetTokenStoreTesting
import FleetTokenStore
import Foundation
import TestSupportKit
import Logging
import Testing

@Suite("Retention in a real agent", .paced, .serialized)
struct RetentionProcessTests {
    @Test("--retention 10s: 20 finished trips whose tokens expire 3 s after start are deleted once eligible (13 s), not at the next fixed sweep")
    func firstSweepWhenEarliestRowIsEligible() async throws {
        let scratch = Scratch()
        let issuer = try await IssuerProcess(scratch: scratch)
        let db = scratch.file("tokens.sqlite")
        // The store made by the tools under test, the rows written by a stock sqlite3 shell.
        let created = try await runToEnd("tokenctl", ["--db", db, "migrate"], in: scratch)
        #expect(created.status == 0, "\(created.stderr)")
        let expiry = Date().addingTimeInterval(3)
        let (expires, issued) = (expiry.timeIntervalSince1970, expiry.timeIntervalSince1970 - 60)
        let rows = (0..<20).map { index in
            let key = try! TokenKey.trip("finished-\(index)")
            return "('trip', 'finished-\(index)', '\(TestJWT.make(for: key, issuedAt: expiry - 60))', \(expires), \(issued), \(issued))"
        }
        _ = try await sqlite3(db, "INSERT INTO tokens (kind, subject_id, token, expires_at, issued_at, fetched_at) VALUES \(rows.joined(separator: ", "))")
        let agent = try AgentFixture.launch(["--db", db, "--provider-url", issuer.template, "--vehicle", "truck-1",
                                                       "--retention", "10s"], in: scratch)
        defer { agent.signal(SIGTERM) }
        let trips = "SELECT count(*) FROM tokens WHERE kind = 'trip'"
        // Watched until gone: the old schedule's second sweep came 65 s after start, well after
        // this bound; the rows must still be there until the retention period has passed.
        // A probe that reads none proves the rows were deleted before it returned, so the time
        // it returned bounds the deletion from above; the time a probe saw rows proves nothing
        // about the deletion when probes are far apart (a loaded machine starting sqlite3).
        var goneBy: Date?
        let gone = await eventually(within: 40) {
            let count = try? await sqlite3(db, trips, readOnly: true)
            if count == "0" { goneBy = Date() }
            return count == "0"
        }
        #expect(gone, "rows eligible since 13 s after start still stored 40 s after it: \(agent.stderr)")
        // Kept until eligible (a bound, with a second for the clocks' grain).
        #expect((goneBy ?? .distantFuture) >= expiry.addingTimeInterval(10 - 1), "deleted before the retention period passed")
        #expect(try await sqlite3(db, "SELECT count(*) FROM tokens WHERE subject_id = 'truck-1' AND token IS NOT NULL") == "1")
        agent.signal(SIGTERM)
        #expect(await agent.wait(upTo: 10) == 0)
    }
}
