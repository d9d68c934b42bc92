import FleetTokenStoreTesting
import Foundation
import GRDB
import Logging
import Testing
import TestSupportKit
@testable import FleetTokenStore

/// The stores the encryption layer is checked on here (PostgreSQL: FleetTokenPostgresTests).
enum SealedStoreKind: String, CaseIterable, CustomTestStringConvertible, Sendable {
    case sqlite, memory
    var testDescription: String { rawValue }

    func make(_ dir: Scratch) throws -> any TokenRepository & RefreshLeaseStore & TokenSealingStore & TokenStoreAdmin {
        switch self {
        case .sqlite: try openStore(dir.file("tokens.sqlite"))
        case .memory: InMemoryTokenRepository()
        }
    }
}

@Suite("EncryptedTokenRepository: values sealed on the way in, opened on the way out, never served when they do not open", .paced)
struct EncryptedRepositoryTests {
    let dir = Scratch()
    let key = TokenEncryptionKey.random()
    var keyring: TokenKeyring { TokenKeyring(primary: key) }
    let log = LogRecorder()

    func value(_ key: TokenKey) -> String { jwtLike(key) }

    /// `key`'s token, with a real JWT value.
    func stored(_ key: TokenKey) -> StoredToken { token(key, expiresIn: 1800, value: value(key)) }

    func sealedStore(_ kind: SealedStoreKind) throws -> (any TokenRepository & RefreshLeaseStore & TokenSealingStore & TokenStoreAdmin, EncryptedTokenRepository) {
        let base = try kind.make(dir)
        return (base, EncryptedTokenRepository(base: base, keyring: keyring, logger: log.logger))
    }

    @Test("the store holds the sealed value under the key's id; reads give the token", arguments: SealedStoreKind.allCases)
    func roundTrip(_ kind: SealedStoreKind) async throws {
        let (base, sealed) = try sealedStore(kind)
        let keys = try (1...3).map { try TokenKey.vehicle("truck-\($0)") }
        try await sealed.upsert(stored(keys[0]))
        try await sealed.upsert(keys.dropFirst().map(stored))
        for key in keys {
            let raw = try #require(try await base.entry(for: key)?.token?.value)
            #expect(raw.hasPrefix("sealed:v1:\(self.key.id):") && !raw.contains(value(key)))
            #expect(try await sealed.entry(for: key)?.token == stored(key))
        }
        #expect(try await sealed.entries(for: keys).mapValues { $0.token?.value } == Dictionary(uniqueKeysWithValues: keys.map { ($0, value($0)) }))
        #expect(try await base.valueKeyIDs() == [self.key.id])
        #expect(try await base.valueKeyCounts() == [self.key.id: 3])
    }

    @Test("an altered value reads as missing, is logged with its key and key id, and is removed; failure state stays",
          arguments: SealedStoreKind.allCases)
    func tamperedValue(_ kind: SealedStoreKind) async throws {
        let (base, sealed) = try sealedStore(kind)
        let truck = try TokenKey.vehicle("truck-1"), failing = try TokenKey.vehicle("truck-2")
        try await sealed.upsert([stored(truck), stored(failing)])
        let failure = RefreshFailureState(consecutiveFailures: 2, nextAttemptAt: referenceNow.addingTimeInterval(60),
                                          lastErrorKind: "httpStatus", lastFailureAt: referenceNow)
        try await base.recordFailure(failure, for: failing)
        for key in [truck, failing] { try await tamper(base, key) }

        #expect(try await sealed.entry(for: truck) == TokenEntry(key: truck, token: nil, failure: nil))
        #expect(try await sealed.entries(for: [failing])[failing] == TokenEntry(key: failing, token: nil, failure: failure))
        let errors = log.errorLines
        #expect(errors.filter { $0.contains("does not open") && $0.contains(self.key.id) }.count == 2, "\(errors)")
        #expect(errors.contains { $0.contains("vehicle/truck-1") })
        // Removed, so the refetched token is stored whatever expiry the altered row claimed.
        #expect(try await base.entry(for: truck) == nil)
        #expect(try await base.entry(for: failing) == TokenEntry(key: failing, token: nil, failure: failure))
        #expect(!errors.joined().contains(value(truck)))
    }

    @Test("a value copied onto another subject does not open there; the original still does", arguments: SealedStoreKind.allCases)
    func movedValue(_ kind: SealedStoreKind) async throws {
        let (base, sealed) = try sealedStore(kind)
        let source = try TokenKey.vehicle("truck-1"), target = try TokenKey.vehicle("truck-2")
        try await sealed.upsert([stored(source), stored(target)])
        let sourceValue = try #require(try await base.entry(for: source)?.token?.value)
        let targetValue = try #require(try await base.entry(for: target)?.token?.value)
        #expect(try await base.replaceValues([TokenValueReplacement(key: target, old: targetValue, new: sourceValue)]) == [target])

        #expect(try await sealed.entry(for: target)?.token == nil)
        #expect(try await sealed.entry(for: source)?.token?.value == value(source))
        #expect(log.errorLines.contains { $0.contains("vehicle/truck-2") && $0.contains("does not open") })
    }

    @Test("a value under a key this process lacks, or not sealed, reads as missing and is left in place (another process's)",
          arguments: SealedStoreKind.allCases)
    func missingKeyAndPlaintext(_ kind: SealedStoreKind) async throws {
        let (base, sealed) = try sealedStore(kind)
        let other = TokenEncryptionKey.random()
        let foreign = try TokenKey.vehicle("foreign"), plain = try TokenKey.vehicle("plain")
        try await EncryptedTokenRepository(base: base, keyring: TokenKeyring(primary: other), logger: log.logger).upsert(stored(foreign))
        try await base.upsert(stored(plain))

        #expect(try await sealed.entries(for: [foreign, plain]).values.map(\.token) == [nil, nil])
        #expect(try await base.entry(for: foreign)?.token != nil)
        #expect(try await base.entry(for: plain)?.token == stored(plain))
        let errors = log.errorLines
        #expect(errors.contains { $0.contains("vehicle/foreign") && $0.contains(other.id) && $0.contains("does not hold") })
        #expect(errors.contains { $0.contains("vehicle/plain") && $0.contains("not sealed") })
    }

    @Test("a lease request reads the key's entry too: through the wrapper it comes back opened, or without a token that does not open",
          arguments: SealedStoreKind.allCases)
    func leaseEntriesOpened(_ kind: SealedStoreKind) async throws {
        let (base, sealed) = try sealedStore(kind)
        let truck = try TokenKey.vehicle("truck-1"), altered = try TokenKey.vehicle("truck-2")
        try await sealed.upsert([stored(truck), stored(altered)])
        try await tamper(base, altered)
        let lease = try await sealed.acquireRefreshLease(for: truck, holder: "a", now: referenceNow, duration: 30)
        #expect(lease == .acquired(current: TokenEntry(key: truck, token: stored(truck), failure: nil)))
        let elsewhere = try await sealed.acquireRefreshLease(for: truck, holder: "b", now: referenceNow, duration: 30)
        #expect(elsewhere == .heldElsewhere(holder: "a", until: referenceNow.addingTimeInterval(30),
                                            current: TokenEntry(key: truck, token: stored(truck), failure: nil)))
        let takenOver = try await sealed.takeOverRefreshLease(for: altered, from: "gone", holder: "b", now: referenceNow, duration: 30)
        #expect(takenOver == .acquired(current: TokenEntry(key: altered, token: nil, failure: nil)))
        try await sealed.releaseRefreshLeases(for: [truck, altered], holder: "a")
        let free = try await base.acquireRefreshLease(for: truck, holder: "c", now: referenceNow, duration: 30)
        #expect(free != RefreshLease.acquired(current: nil))
        // Expired leases are swept in the wrapped store (truck's, now c's, and altered's, b's).
        #expect(try await sealed.deleteExpiredRefreshLeases(before: referenceNow.addingTimeInterval(31), limit: 10) == 2)
    }

    @Test("replacing values changes only those still as read", arguments: SealedStoreKind.allCases)
    func conditionalReplace(_ kind: SealedStoreKind) async throws {
        let base = try kind.make(dir)
        let a = try TokenKey.vehicle("a"), b = try TokenKey.vehicle("b")
        try await base.upsert([stored(a), stored(b)])
        let replaced = try await base.replaceValues([
            TokenValueReplacement(key: a, old: value(a), new: "new-a"),
            TokenValueReplacement(key: b, old: "stale", new: "new-b"),
        ])
        #expect(replaced == [a])
        #expect(try await base.entry(for: a)?.token?.value == "new-a")
        #expect(try await base.entry(for: b)?.token == stored(b))
        // Nothing else of the row changed.
        var expected = stored(a)
        expected.value = "new-a"
        #expect(try await base.entry(for: a)?.token == expected)
    }

    /// Flips one character of `key`'s stored ciphertext, as an attacker editing the file would.
    func tamper(_ base: any TokenRepository & TokenSealingStore, _ key: TokenKey) async throws {
        let stored = try #require(try await base.entry(for: key)?.token?.value)
        var characters = Array(stored)
        let index = characters.count - 20
        characters[index] = characters[index] == "A" ? "B" : "A"
        #expect(try await base.replaceValues([TokenValueReplacement(key: key, old: stored, new: String(characters))]) == [key])
    }
}

@Suite("The engine on an encrypted store: a value that does not open is refetched, never served", .paced)
struct EncryptedEngineTests {
    let dir = Scratch()
    let time = TestTime()
    let log = LogRecorder()
    let keyring = TokenKeyring(primary: .random())
    let fetcher: ScriptedFetcher

    init() { fetcher = .minting(time) }

    /// An hour-long token of `key` issued now.
    func fresh(_ key: TokenKey, _ value: String) -> StoredToken {
        StoredToken(key: key, value: value, expiresAt: time.now.addingTimeInterval(3600), issuedAt: time.now, fetchedAt: time.now)
    }

    /// An engine on `repository` (its lease store too) with the test's clock and fetcher.
    func makeEngine(on repository: any TokenRepository & RefreshLeaseStore) -> TokenSyncEngine {
        TokenSyncEngine(repository: repository, leases: repository, fetcher: fetcher, logger: log.logger,
                        clock: time.clock, now: time.wall, random: { 0.5 })
    }

    @Test("an altered value is fetched anew; an intact one is served from the store without a fetch")
    func engineRefetches() async throws {
        let store = try openStore(dir.file("tokens.sqlite"))
        defer { store.close() }
        let sealed = EncryptedTokenRepository(base: store, keyring: keyring, logger: log.logger)
        let intact = try TokenKey.vehicle("intact"), altered = try TokenKey.vehicle("altered")
        let values = [intact, altered].map { TestJWT.make(for: $0, issuedAt: time.now, lifetime: 3600) }
        try await sealed.upsert(zip([intact, altered], values).map(fresh))
        let stored = try #require(try await store.entry(for: altered)?.token?.value)
        _ = try await store.replaceValues([TokenValueReplacement(key: altered, old: stored, new: String(stored.dropLast(4)) + "AAAA")])

        let engine = makeEngine(on: sealed)
        let served = try await engine.token(for: intact)
        #expect(served.value == values[0] && fetcher.count(intact) == 0)
        let refetched = try await engine.token(for: altered)
        #expect(fetcher.count(altered) == 1 && refetched.value != values[1])
        // The refetched token is stored sealed and opens.
        #expect(await eventually { (try? await sealed.entry(for: altered)?.token?.value) == refetched.value })
        #expect(try await store.entry(for: altered)?.token?.value.hasPrefix("sealed:v1:\(keyring.primary.id):") == true)
        await engine.shutdown()
    }

    @Test("an engine given an encrypted store without its key never hands out a sealed value: it fetches, and says why")
    func engineWithoutKey() async throws {
        let store = try openStore(dir.file("tokens.sqlite"))
        defer { store.close() }
        let truck = try TokenKey.vehicle("truck")
        try await EncryptedTokenRepository(base: store, keyring: keyring, logger: log.logger).upsert(fresh(truck, jwtLike(truck)))

        let engine = makeEngine(on: store)
        let served = try await engine.token(for: truck)
        #expect(!served.value.hasPrefix(SealedTokenValue.prefix), "\(served.value.prefix(40)) \(log.allText)")
        #expect(fetcher.count(truck) == 1)
        #expect(log.errorLines.contains { $0.contains("no key") && $0.contains(keyring.primary.id) && $0.contains("vehicle/truck") })
        await engine.shutdown()
    }
}
