import FleetTokenStoreTesting
import TestSupportKit
import Foundation
import GRDB
import Logging
import Testing
@testable import FleetTokenStore

@Suite("WriterStatements: the write path's prepared statements and its remembered change-log sequence", .paced)
struct WriterStatementsTests {
    let dir = Scratch()
    var path: String { dir.file("tokens.sqlite") }

    /// What a write transaction on `store`'s writer connection takes as the change log's
    /// sequence at its start, beside what the file holds then; committed, as writes are.
    func sequenceAtStart(_ store: SQLiteTokenRepository) throws -> (remembered: Int64, actual: Int64) {
        let statements = store.runner.statements
        return try store.pool.writeWithoutTransaction { db in
            try statements.run(.begin, db)
            let remembered = try statements.sequenceAtStart(db)
            let actual = try ChangeLog.lastSequence(db)
            try statements.run(.commit, db)
            return (remembered, actual)
        }
    }

    @Test("a sequence remembered at commit serves only while no other connection has committed")
    func otherConnectionsCommits() async throws {
        let store = try openStore(path)
        let other = try openStore(path)
        defer { store.close(); other.close() }
        try await store.upsert(token(try .vehicle("own-1"), expiresIn: 600))
        let unchanged = try sequenceAtStart(store)
        #expect(unchanged.remembered == unchanged.actual)

        try await store.upsert(token(try .vehicle("own-2"), expiresIn: 600))
        try await other.upsert(token(try .vehicle("theirs"), expiresIn: 600))
        let afterOther = try sequenceAtStart(store)
        #expect(afterOther.remembered == afterOther.actual)
        #expect(afterOther.actual == 3)

        // Another process (a stock sqlite3 shell), and a write of this connection that
        // bypasses the inline path, must not be mistaken for no change either.
        try await store.upsert(token(try .vehicle("own-3"), expiresIn: 600))
        _ = try await sqlite3(path, "UPDATE tokens SET token = 'by.shell', expires_at = expires_at + 1 WHERE subject_id = 'own-1'")
        let afterShell = try sequenceAtStart(store)
        #expect(afterShell.remembered == afterShell.actual)
        try await store.upsert(token(try .vehicle("own-4"), expiresIn: 600))
        try await store.pool.write { db in
            try db.execute(sql: "UPDATE tokens SET token = 'direct', expires_at = expires_at + 1 WHERE subject_id = 'own-2'")
        }
        let afterDirect = try sequenceAtStart(store)
        #expect(afterDirect.remembered == afterDirect.actual)
    }

    @Test("closing finalizes the prepared statements, so the store closes cleanly; writes after fail as closed")
    func closeFinalizes() async throws {
        let log = LogRecorder()
        let store = try openStore(path, logger: log.logger)
        try await store.upsert(token(try .vehicle("v"), expiresIn: 600))
        try await store.upsert([token(try .vehicle("w"), expiresIn: 600)], clearFailure: false)
        store.close()
        #expect(log.messages(at: .warning).isEmpty, "\(log.messages(at: .warning))")
        await #expect(throws: TokenStoreError.self) { try await store.upsert(token(try .vehicle("x"), expiresIn: 600)) }
        #expect(try await sqlite3(path, "SELECT count(*) FROM tokens") == "2")
    }
}
