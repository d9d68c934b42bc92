// The retention sweep's deletion of expired refresh leases against another host's claim of the
// same key at the same moment. The delete picked the expired keys in a subquery and deleted by key
// alone: when a claim renewed the row while the delete waited for its lock, PostgreSQL re-checked
// the new row (read committed) against the key only, and deleted a lease that had just been taken
// (found by review). A third host could then fetch the key beside the holder.

import FleetTokenStoreTesting
import Foundation
import Logging
import Testing
import TestSupportKit
@testable import FleetTokenPostgres
@testable import FleetTokenStore

@Suite("Sweeping expired leases on PostgreSQL", .paced, .enabled(if: PostgresServer.testsEnabled))
struct PostgresLeaseSweepTests {
    @Test("a lease claimed again while the sweep waits for its row is kept; the sweep deletes nothing")
    func claimDuringSweepIsKept() async throws {
        let (server, database, configuration) = try await freshDatabase()
        let key = try TokenKey.trip("crashed-then-asked")
        let start = referenceNow.timeIntervalSince1970
        try await PostgresTokenRepository.withRepository(configuration, logger: Logger(label: "lease-sweep")) { store in
            // A holder that died: its lease ended at start + 30.
            #expect(try await store.acquireRefreshLease(for: key, holder: "dead", now: referenceNow, duration: 30) == .acquired(current: nil))
            // Another host claims the key (its lease until start + 500) in a transaction held
            // open, after its update, by an advisory lock a third session keeps until the sweep
            // waits for the row.
            let table = "fleet_token_store.refresh_leases"
            let gate = Task { try? await server.psql("SELECT pg_advisory_lock(4242); SELECT pg_sleep(120);", database: database) }
            let advisory = "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objid = 4242"
            try #require(await eventually(within: 30) { (try? await server.psql(advisory + " AND granted", database: database)) == "1" })
            let claimer = Task {
                try? await server.psql("""
                    BEGIN;
                    UPDATE \(table) SET holder = 'alive', acquired_at = \(start + 200), expires_at = \(start + 500)
                      WHERE kind = 'trip' AND subject_id = 'crashed-then-asked';
                    SELECT pg_advisory_lock(4242);
                    COMMIT;
                    """, database: database)
            }
            try #require(await eventually(within: 30) { (try? await server.psql(advisory + " AND NOT granted", database: database)) == "1" },
                         "the claim never reached its wait")
            let sweep = Task { try await store.deleteExpiredRefreshLeases(before: referenceNow.addingTimeInterval(100), limit: 10) }
            let rowWait = "SELECT count(*) FROM pg_locks WHERE locktype = 'transactionid' AND NOT granted"
            try #require(await eventually(within: 30) { (try? await server.psql(rowWait, database: database)) == "1" },
                         "the sweep never waited for the claimed row")
            // The gate goes, the claim commits, the sweep goes on.
            _ = try await server.psql("SELECT pg_terminate_backend(pid) FROM pg_locks WHERE locktype = 'advisory' AND objid = 4242 AND granted",
                                      database: database)
            _ = await gate.value
            _ = await claimer.value
            let deleted = try await sweep.value
            #expect(deleted == 0, "the sweep deleted a lease claimed while it waited")
            #expect(try await store.acquireRefreshLease(for: key, holder: "third", now: referenceNow.addingTimeInterval(201), duration: 30)
                    == .heldElsewhere(holder: "alive", until: referenceNow.addingTimeInterval(500), current: nil))
        }
    }
}
