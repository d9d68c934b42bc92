// Issue 27 item 9: a value that does not open is removed by compare-and-delete. Between the
// read that found it altered and its removal, another process (a second connection to the same
// SQLite file) stores a valid sealed token: the removal must leave that token.

import FleetTokenStoreTesting
import Foundation
import Testing
import TestSupportKit
@testable import FleetTokenStore

@Suite("EncryptedTokenRepository removes only the value that failed to open (SQLite)", .paced)
struct SealedRemovalRaceTests {
    let dir = Scratch()
    let keyring = TokenKeyring(primary: .random())
    let log = LogRecorder()

    @Test("an altered value is read; another process stores a valid token before the removal: the valid token stays, for this process and the other")
    func validTokenWrittenBeforeRemovalStays() async throws {
        let storeA = try openStore(dir.file("tokens.sqlite")), storeB = try openStore(dir.file("tokens.sqlite"))
        defer { storeA.close(); storeB.close() }
        let truck = try TokenKey.vehicle("truck-1")
        let otherProcess = EncryptedTokenRepository(base: storeB, keyring: keyring, logger: log.logger)
        try await otherProcess.upsert(token(truck, expiresIn: 1800, value: jwtLike(truck)))
        try await tamper(storeA, truck)
        let valid = token(truck, expiresIn: 3600, value: TestJWT.make(for: truck, issuedAt: referenceNow, lifetime: 3600))
        let racing = RacingRemovalStore(base: storeA) { _ in try await otherProcess.upsert(valid) }
        let sealed = EncryptedTokenRepository(base: racing, keyring: keyring, logger: log.logger)

        #expect(try await sealed.entry(for: truck)?.token == nil, "an altered value was handed out")
        #expect(racing.removals == 1, "the altered value was not removed")
        #expect(try await otherProcess.entry(for: truck)?.token == valid, "the removal deleted the token written after the read")
        #expect(try await sealed.entry(for: truck)?.token == valid)
        // Still removed when nothing was written meanwhile (the value read is the one stored).
        let untouched = try TokenKey.vehicle("truck-2")
        try await otherProcess.upsert(token(untouched, expiresIn: 1800, value: jwtLike(untouched)))
        try await tamper(storeA, untouched)
        #expect(try await EncryptedTokenRepository(base: storeA, keyring: keyring, logger: log.logger).entry(for: untouched)?.token == nil)
        #expect(try await storeB.entry(for: untouched) == nil)
    }

    /// Flips one character of `key`'s stored ciphertext, as an attacker editing the file would.
    func tamper(_ base: SQLiteTokenRepository, _ key: TokenKey) async throws {
        let stored = try #require(try await base.entry(for: key)?.token?.value)
        var characters = Array(stored)
        let index = characters.count - 20
        characters[index] = characters[index] == "A" ? "B" : "A"
        #expect(try await base.replaceValues([TokenValueReplacement(key: key, old: stored, new: String(characters))]) == [key])
    }
}
