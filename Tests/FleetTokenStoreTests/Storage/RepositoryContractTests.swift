// The repository contract (TestSupportKit's RepositoryContract) run against every store in
// this package: SQLite on real files in a temporary directory, and the test kit's in-memory one.

import FleetTokenStoreTesting
import Foundation
import Testing
import TestSupportKit
@testable import FleetTokenStore

/// A subject id the SQLite schema refuses, which `TokenKey`'s validation never builds.
private let refusedKey = TokenKey(uncheckedKind: .vehicle, subjectID: "")

/// Two repositories on one store file, as two processes sharing it would have.
private let sqlite = RepositoryContract.Subject(name: "SQLiteTokenRepository", refusedKey: refusedKey) {
    let dir = Scratch()
    let store = try openStore(dir.file("tokens.sqlite"))
    let other = try openStore(dir.file("tokens.sqlite"))
    return RepositoryContract.Fixture(store: store, otherProcess: other) {
        store.close()
        other.close()
        _ = dir // removed with the last reference, after both closed
    }
}

/// Two views of one in-memory storage.
private let inMemory = RepositoryContract.Subject(name: "InMemoryTokenRepository", refusedKey: refusedKey) {
    let store = InMemoryTokenRepository()
    let other = store.makeView()
    return RepositoryContract.Fixture(store: store, otherProcess: other) {
        store.close()
        other.close()
    }
}

@Suite("The repository contract, run against every store", .paced)
struct RepositoryContractTests {
    @Test("contract", arguments: [sqlite, inMemory], RepositoryContract.Check.allCases)
    func contract(subject: RepositoryContract.Subject, check: RepositoryContract.Check) async throws {
        try await RepositoryContract(subject).run(check)
    }

    @Test("an in-memory view refuses calls once closed, and its change feed ends; other views go on")
    func inMemoryClose() async throws {
        let store = InMemoryTokenRepository(location: "unit")
        let other = store.makeView()
        let feed = store.changes()
        store.close()
        var ended = true
        for await _ in feed { ended = false }
        #expect(ended)
        await #expect(throws: TokenStoreError.closed(path: "unit")) { try await store.entry(for: try .vehicle("v")) }
        await #expect(throws: TokenStoreError.closed(path: "unit")) { try await store.upsert(token(try .vehicle("v"), expiresIn: 60)) }
        #expect(await store.check().problems == [TokenStoreError.closed(path: "unit").description])
        try await other.upsert(token(try .vehicle("v"), expiresIn: 60))
        #expect(try await other.entry(for: try .vehicle("v")) != nil)
        #expect(await other.check().isHealthy)
    }
}
