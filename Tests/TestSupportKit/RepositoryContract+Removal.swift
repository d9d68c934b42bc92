// Shared by the test targets: the repository contract's check of removal by value
// (TokenSealingStore's removeToken(for:ifValue:)), the compare-and-delete that a value found
// not to open is removed with: what another process wrote since the read must stay.

import FleetTokenStore
import Foundation
import Testing

extension RepositoryContract {
    func removeTokenIfValue(_ store: any ContractRepository, _ other: any ContractRepository) async throws {
        let key = try TokenKey.vehicle("truck-1"), failing = try TokenKey.vehicle("truck-2")
        let absent = try TokenKey.vehicle("absent")
        let read = token(key, expiresIn: 600, value: fakeToken("read"))
        try await store.upsert(read)

        // Another value: nothing changes.
        #expect(try await store.removeToken(for: key, ifValue: fakeToken("another")) == false)
        #expect(try await store.entry(for: key)?.token == read)
        #expect(try await store.removeToken(for: absent, ifValue: read.value) == false)
        #expect(try await store.entry(for: absent) == nil)

        // Another process writes a newer token after the read: the removal of the read value
        // leaves it, whichever view removes.
        let written = token(key, expiresIn: 1800, value: fakeToken("written meanwhile"))
        try await other.upsert(written)
        #expect(try await store.removeToken(for: key, ifValue: read.value) == false)
        #expect(try await store.entry(for: key)?.token == written)
        #expect(try await other.entry(for: key)?.token == written)

        // The value still stored: the entry goes (it has no failure state).
        #expect(try await store.removeToken(for: key, ifValue: written.value))
        #expect(try await store.entry(for: key) == nil)
        #expect(try await other.entry(for: key) == nil)

        // With failure state the token goes and the failure state stays.
        let stored = token(failing, expiresIn: 600)
        let failure = Self.failure(2, retryIn: 30)
        try await store.upsert(stored)
        try await store.recordFailure(failure, for: failing)
        #expect(try await store.removeToken(for: failing, ifValue: stored.value))
        #expect(try await store.entry(for: failing) == TokenEntry(key: failing, token: nil, failure: failure))
        #expect(try await store.removeToken(for: failing, ifValue: stored.value) == false)
        #expect(try await store.entry(for: failing) == TokenEntry(key: failing, token: nil, failure: failure))
    }
}
