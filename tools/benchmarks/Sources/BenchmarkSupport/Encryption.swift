// The encryption-at-rest side of the fixtures: one fixed key, and a store opened the way
// token-agent opens it when given a key file.

import FleetTokenStore
import Foundation

/// The key every encrypted benchmark seals with: fixed, so a store one process seeds opens in
/// another (`token-store-profile seed-sealed`, then `open-encrypted`).
public let benchmarkKeyring = TokenKeyring(primary: try! TokenEncryptionKey(bytes: [UInt8](repeating: 0x5a, count: 32)))

/// An engine on `repository`, an ``EncryptedTokenRepository`` over `store`, as token-agent
/// builds it. A lease call also reads the key's entry, so the leases go through `repository`
/// when it is a `RefreshLeaseStore` (its lease calls open that entry); otherwise (the first cut
/// of encryption at rest) through `store`.
public func engine(on repository: EncryptedTokenRepository, over store: SQLiteTokenRepository,
                   fetcher: any TokenFetcher) -> TokenSyncEngine {
    let leases: any RefreshLeaseStore = ((repository as Any) as? any RefreshLeaseStore) ?? store
    return TokenSyncEngine(repository: repository, leases: leases, fetcher: fetcher, logger: quietLogger)
}

/// A store and an engine as token-agent starts them with a key: the store opened,
/// `TokenValueResealer.prepare(keyring:)` run on it (the key check, and sealing of plaintext
/// values when there are any), and the engine built on an ``EncryptedTokenRepository`` over it.
public struct EncryptedStart: Sendable {
    public let store: SQLiteTokenRepository
    public let engine: TokenSyncEngine
    public let fetcher: MintingFetcher

    public init(path: String, keyring: TokenKeyring = benchmarkKeyring) async throws {
        store = try SQLiteTokenRepository(path: path, logger: quietLogger)
        try await TokenValueResealer(store: store, logger: quietLogger).prepare(keyring: keyring)
        fetcher = MintingFetcher()
        engine = BenchmarkSupport.engine(on: EncryptedTokenRepository(base: store, keyring: keyring, logger: quietLogger),
                                         over: store, fetcher: fetcher)
    }
}

/// Fails unless `token` came from the store opened: not fetched (`fetcher` never called) and
/// not handed out still sealed.
public func requireOpenedFromStore(_ token: StoredToken, fetcher: MintingFetcher) throws {
    guard fetcher.count == 0 else { throw BenchmarkCheckFailed(description: "the first token was fetched, not opened from the store") }
    guard !token.value.hasPrefix(SealedTokenValue.prefix) else {
        throw BenchmarkCheckFailed(description: "the engine handed out a sealed value as the token")
    }
}

/// A store file at `path` holding fresh tokens for `vehicleKeys(count)`, every value sealed with
/// `keyring`'s primary key (written through an ``EncryptedTokenRepository``). Fails unless the
/// store then reports that one key id alone.
public func seedSealed(path: String, count: Int, keyring: TokenKeyring = benchmarkKeyring) async throws {
    let store = try SQLiteTokenRepository(path: path, logger: quietLogger)
    defer { store.close() }
    try await seed(EncryptedTokenRepository(base: store, keyring: keyring, logger: quietLogger), keys: vehicleKeys(count))
    let ids = try await store.valueKeyIDs()
    guard ids == [keyring.primary.id] else {
        throw BenchmarkCheckFailed(description: "seeded store holds values under \(ids.sorted()), expected only \(keyring.primary.id)")
    }
}

/// A benchmark's fixture or result is not what the figure assumes.
public struct BenchmarkCheckFailed: Error, CustomStringConvertible {
    public let description: String
}
