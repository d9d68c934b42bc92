// From a review of the PostgreSQL store: a schema named by an SQL reserved word, and two
// replicas writing the same keys in one batch each at once.

import FleetTokenStoreTesting
import Foundation
import Logging
import Testing
import TestSupportKit
@testable import FleetTokenPostgres
@testable import FleetTokenStore

@Suite("PostgreSQL: reserved-word schemas and concurrent batch writes", .paced, .enabled(if: PostgresServer.testsEnabled))
struct PostgresWriteOrderTests {
    let logger = Logger(label: "write-order")

    // The URL's rule admits `user` and `order`; unquoted, CREATE SCHEMA user is a syntax error.
    @Test("a schema named by a reserved word (user, order) is created, migrated and used", arguments: ["user", "order"])
    func reservedWordSchema(_ schema: String) async throws {
        let (server, database, configuration) = try await freshDatabase(schema: schema)
        let key = try TokenKey.vehicle("truck-7")
        try await PostgresTokenRepository.withRepository(configuration, mode: .agent, logger: logger) { store in
            try await store.upsert(token(key, expiresIn: 600))
        }
        let stored = try await PostgresTokenRepository.withRepository(configuration, mode: .readOnly, logger: logger) { store in
            try await store.entry(for: key)
        }
        #expect(stored?.token?.key == key)
        let rows = try await server.psql("SELECT count(*) FROM \"\(schema)\".tokens", database: database)
        #expect(rows.trimmingCharacters(in: .whitespacesAndNewlines) == "1")
    }

    // Each batch locks its rows in its arrays' order; built from a dictionary, that order was
    // each process's own, and two replicas flushing the same keys deadlocked (40P01).
    @Test("two stores writing the same 400 keys in one batch each, at once, over and over: no deadlock, every write lands")
    func concurrentBatchesDoNotDeadlock() async throws {
        let (_, _, configuration) = try await freshDatabase()
        let keys = try (0..<400).map { try TokenKey.vehicle("v-\($0)") }
        try await PostgresTokenRepository.withRepository(configuration, mode: .agent, logger: logger) { first in
            try await PostgresTokenRepository.withRepository(configuration, mode: .agent, logger: logger) { second in
                try await first.upsert(keys.map { token($0, expiresIn: 60) }, clearFailure: true)
                for round in 1...6 {
                    // Each side's batch in another order, and a later expiry each round, so
                    // every row is updated (and locked) by both.
                    let a = keys.map { token($0, expiresIn: 60 + Double(round) * 10) }
                    let b = keys.reversed().map { token($0, expiresIn: 65 + Double(round) * 10) }
                    async let one: Void = first.upsert(a, clearFailure: true)
                    async let two: Void = second.upsert(b, clearFailure: true)
                    _ = try await (one, two)
                }
                let last = try await first.entry(for: keys[123])
                #expect(last?.token?.expiresAt == referenceNow.addingTimeInterval(125))
            }
        }
    }
}
