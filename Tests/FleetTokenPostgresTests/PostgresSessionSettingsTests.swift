// The record of which pooled connections have their session settings (search_path, statement
// timeout): per pool generation, so a call finishing on the old host's pool after a move cannot
// mark a new pool's connection of the same number as set; and bounded, so months of reconnects
// do not grow it.
@testable import FleetTokenPostgres
import Testing

@Suite("PostgreSQL session settings record", .paced)
struct PostgresSessionSettingsTests {
    @Test("a newer pool forgets the older one's connections; a late record of the old pool is ignored")
    func generations() {
        var prepared = PreparedConnections()
        prepared.insert(1, generation: 0)
        #expect(prepared.contains(1, generation: 0))
        prepared.insert(1, generation: 1)
        #expect(prepared.contains(1, generation: 1))
        #expect(!prepared.contains(1, generation: 0))
        prepared.insert(2, generation: 0) // a call of the old pool ends after the move
        #expect(!prepared.contains(2, generation: 1))
        #expect(prepared.ids == [1])
    }

    @Test("at most the limit of connections are remembered, the oldest forgotten first")
    func bounded() {
        var prepared = PreparedConnections()
        for id in 1...10_000 { prepared.insert(id, generation: 0) }
        #expect(prepared.ids.count == PreparedConnections.limit)
        #expect(prepared.contains(10_000, generation: 0))
        #expect(!prepared.contains(1, generation: 0))
    }
}
