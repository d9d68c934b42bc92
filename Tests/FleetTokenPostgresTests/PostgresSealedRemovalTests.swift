// Issue 27 item 9 on PostgreSQL: a value that does not open is removed by compare-and-delete.
// Between the read that found it altered and its removal, another host (a second connection
// pool on the same database) stores a valid sealed token: the removal must leave that token.

import FleetTokenPostgres
import FleetTokenStore
import FleetTokenStoreTesting
import Foundation
import Logging
import Testing
import TestSupportKit

@Suite("EncryptedTokenRepository removes only the value that failed to open (PostgreSQL)", .paced,
       .enabled(if: PostgresServer.testsEnabled))
struct PostgresSealedRemovalTests {
    @Test("an altered value is read; another host stores a valid token before the removal: the valid token stays")
    func validTokenWrittenBeforeRemovalStays() async throws {
        let (_, _, settings) = try await freshDatabase()
        let keyring = TokenKeyring(primary: .random())
        let log = LogRecorder()
        let truck = try TokenKey.vehicle("truck-1")
        let now = referenceNow
        try await PostgresTokenRepository.withRepository(settings, logger: log.logger) { hostA in
            try await PostgresTokenRepository.withRepository(settings, logger: log.logger) { hostB in
                let otherHost = EncryptedTokenRepository(base: hostB, keyring: keyring, logger: log.logger)
                try await otherHost.upsert(token(truck, expiresIn: 1800, now: now, value: TestJWT.make(for: truck, issuedAt: now - 1800)))
                let stored = try #require(try await hostA.entry(for: truck)?.token?.value)
                var characters = Array(stored)
                characters[characters.count - 20] = characters[characters.count - 20] == "A" ? "B" : "A"
                #expect(try await hostA.replaceValues([TokenValueReplacement(key: truck, old: stored, new: String(characters))]) == [truck])
                let valid = token(truck, expiresIn: 3600, now: now, value: TestJWT.make(for: truck, issuedAt: now))
                let racing = RacingRemovalStore(base: hostA) { _ in try await otherHost.upsert(valid) }
                let sealed = EncryptedTokenRepository(base: racing, keyring: keyring, logger: log.logger)

                #expect(try await sealed.entry(for: truck)?.token == nil, "an altered value was handed out")
                #expect(racing.removals == 1, "the altered value was not removed")
                #expect(try await otherHost.entry(for: truck)?.token == valid, "the removal deleted the token written after the read")
                #expect(try await sealed.entry(for: truck)?.token == valid)
            }
        }
    }
}
