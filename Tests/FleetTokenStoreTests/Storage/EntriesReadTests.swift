import FleetTokenStoreTesting
import Foundation
import Testing
import TestSupportKit
@testable import FleetTokenStore

/// `entries(for:)`, the read behind an engine's start and its re-reads of what it holds: one
/// primary-key probe per key, whatever the store's size.
@Suite("SQLite entries(for:): probes by key, never a scan of the table", .paced)
struct EntriesReadTests {
    let dir = Scratch()

    @Test("the statement is planned as primary-key probes (it was a scan of every row: 100,000 subjects took 150 ms a read, 200 reads at a start)")
    func plannedAsProbes() async throws {
        let path = dir.file("tokens.sqlite")
        try openStore(path).close()
        let plan = try await sqlite3(path, "EXPLAIN QUERY PLAN " + TokenRow.entriesSQL(keys: 3), readOnly: true)
        #expect(plan.contains("USING PRIMARY KEY"), "\(plan)")
        #expect(!plan.contains("SCAN tokens"), "\(plan)")
    }

    @Test("1,200 keys over three statements: present ones found once each, missing and repeated ones as the store has them")
    func findsWhatIsStored() async throws {
        let store = try openStore(dir.file("tokens.sqlite"))
        defer { store.close() }
        let now = Date()
        let stored = try (0..<600).map { try TokenKey.vehicle("v\($0)") } + [try TokenKey.trip("v1")]
        let values = Dictionary(uniqueKeysWithValues: stored.map { ($0, TestJWT.make(for: $0, issuedAt: now)) })
        try await store.upsert(stored.map {
            StoredToken(key: $0, value: values[$0]!, expiresAt: now.addingTimeInterval(3600), issuedAt: now, fetchedAt: now)
        })
        let missing = try (600..<1199).map { try TokenKey.vehicle("v\($0)") }
        let asked = stored + missing + [stored[7]]
        #expect(asked.count == 1201)
        let found = try await store.entries(for: asked)
        #expect(found.count == stored.count)
        #expect(found.allSatisfy { key, entry in entry.key == key && entry.token?.value == values[key] })
        let trip = try TokenKey.trip("v1"), absent = try TokenKey.vehicle("v600")
        #expect(found[trip] != nil && found[absent] == nil)
    }
}
