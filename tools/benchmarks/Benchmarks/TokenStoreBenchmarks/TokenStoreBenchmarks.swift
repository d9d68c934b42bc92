// Each figure beside its baseline, measured in the same run (see ../../run for the ratios).

import Benchmark
import BenchmarkSupport
import FleetTokenStore
import Foundation
import Synchronization

/// A store and the raw C-API connection to the same kind of file.
final class PersistFixture: Sendable {
    let store: SQLiteTokenRepository
    let raw: RawSQLite
    let counter = Mutex(0)
    let value = realisticJWT(for: try! .vehicle("p"), issuedAt: Date())

    init(label: String) throws {
        let directory = scratchDirectory(label)
        store = try SQLiteTokenRepository(path: directory + "/tokens.sqlite", logger: quietLogger)
        // The raw baseline gets its own file with the identical schema (migrated the same way).
        try SQLiteTokenRepository(path: directory + "/raw.sqlite", logger: quietLogger).close()
        raw = RawSQLite(path: directory + "/raw.sqlite")
    }

    /// `count` tokens for `key`, each expiring later than the last, so every upsert replaces.
    func tokens(repeating key: TokenKey, _ count: Int) -> [StoredToken] {
        (0..<count).map { _ in tokens([key])[0] }
    }

    /// Tokens that each expire later than the last, so every upsert really replaces.
    func tokens(_ keys: [TokenKey]) -> [StoredToken] {
        let n = counter.withLock { $0 += 1; return $0 }
        let now = Date(timeIntervalSince1970: 1_800_000_000 + Double(n))
        return keys.map { StoredToken(key: $0, value: value, expiresAt: now + 3600, issuedAt: now, fetchedAt: now) }
    }
}

let persistKey = [try! TokenKey.vehicle("persisted")]
let batchKeys = vehicleKeys(1000, prefix: "batch-")

let benchmarks: @Sendable () -> Void = {
    Benchmark.defaultConfiguration = .init(metrics: [.wallClock, .throughput, .mallocCountTotal], warmupIterations: 20,
                                           maxDuration: .seconds(3), maxIterations: 100_000)

    // MARK: hit path
    // 1,000 calls per measured iteration, so clock reads do not swamp a tens-of-nanoseconds call.
    // Mallocs per hit come from here; the hit ratio's goal figure from token-store-hit-pair,
    // which alternates the two on one fixture (see the README's "The hit ratio"). The fixture's
    // engine runs with encryption at rest on, as the goal's figure does.
    Benchmark("hit: token(for:) fresh", configuration: .init(warmupIterations: 100, scalingFactor: .kilo, maxIterations: 20_000)) { benchmark, fixture in
        for _ in benchmark.scaledIterations { blackHole(try await fixture.engine.token(for: fixture.key)) }
    } setup: {
        try await HitFixture()
    }

    Benchmark("hit baseline: Mutex<[Key: String]> lookup", configuration: .init(warmupIterations: 100, scalingFactor: .kilo, maxIterations: 20_000)) { benchmark, fixture in
        for _ in benchmark.scaledIterations { blackHole(fixture.dictionary.withLock { $0[fixture.key] }) }
    } setup: {
        try await HitFixture()
    }

    // MARK: persistence
    // The goal figures: 1,000 refreshed tokens persisted one after another per measured
    // iteration (each its own transaction), reported per write, as the hit path is measured.
    Benchmark("persist: repository upsert of one token", configuration: .init(metrics: [.wallClock, .throughput], scalingFactor: .kilo, maxIterations: 2_000)) { benchmark, fixture in
        let tokens = fixture.tokens(repeating: persistKey[0], benchmark.scaledIterations.count)
        benchmark.startMeasurement()
        for token in tokens { try await fixture.store.upsert(token) }
        benchmark.stopMeasurement()
    } setup: {
        try PersistFixture(label: "persist")
    }

    Benchmark("persist baseline: raw C API upsert", configuration: .init(metrics: [.wallClock, .throughput], scalingFactor: .kilo, maxIterations: 2_000)) { benchmark, fixture in
        let tokens = fixture.tokens(repeating: persistKey[0], benchmark.scaledIterations.count)
        benchmark.startMeasurement()
        for token in tokens { fixture.raw.upsert(token) }
        benchmark.stopMeasurement()
    } setup: {
        try PersistFixture(label: "persist-raw")
    }

    // Reported without a goal: one write alone in a fresh task, caches cold (the way a
    // sporadic refresh meets the store), and the SQLite work of the repository's transaction
    // shape (BEGIN IMMEDIATE, the change log's sequence read before and after, COMMIT).
    Benchmark("persist cold: repository upsert of one token in a fresh task", configuration: .init(metrics: [.wallClock, .throughput], maxIterations: 20_000)) { benchmark, fixture in
        let tokens = fixture.tokens(persistKey)
        benchmark.startMeasurement()
        try await fixture.store.upsert(tokens[0])
        benchmark.stopMeasurement()
    } setup: {
        try PersistFixture(label: "persist-cold")
    }

    Benchmark("persist cold baseline: raw C API upsert in a fresh task", configuration: .init(metrics: [.wallClock, .throughput], maxIterations: 20_000)) { benchmark, fixture in
        let tokens = fixture.tokens(persistKey)
        benchmark.startMeasurement()
        fixture.raw.upsert(tokens[0])
        benchmark.stopMeasurement()
    } setup: {
        try PersistFixture(label: "persist-cold-raw")
    }

    Benchmark("persist shape: raw C API upsert in the repository's transaction shape", configuration: .init(metrics: [.wallClock, .throughput], scalingFactor: .kilo, maxIterations: 2_000)) { benchmark, fixture in
        let tokens = fixture.tokens(repeating: persistKey[0], benchmark.scaledIterations.count)
        benchmark.startMeasurement()
        for token in tokens { fixture.raw.upsertInTransactionShape(token) }
        benchmark.stopMeasurement()
    } setup: {
        try PersistFixture(label: "persist-shape")
    }

    Benchmark("batch: repository upsert of 1,000 tokens", configuration: .init(metrics: [.wallClock, .throughput], maxIterations: 300)) { benchmark, fixture in
        let tokens = fixture.tokens(batchKeys)
        benchmark.startMeasurement()
        try await fixture.store.upsert(tokens)
        benchmark.stopMeasurement()
    } setup: {
        try PersistFixture(label: "batch")
    }

    Benchmark("batch baseline: 1,000 raw upserts in one transaction", configuration: .init(metrics: [.wallClock, .throughput], maxIterations: 300)) { benchmark, fixture in
        let tokens = fixture.tokens(batchKeys)
        benchmark.startMeasurement()
        fixture.raw.upsert(tokens)
        benchmark.stopMeasurement()
    } setup: {
        try PersistFixture(label: "batch-raw")
    }

    // MARK: purge of 100,000 expired rows
    // Each iteration measures one purge, then (unmeasured) puts the 100,000 expired rows back
    // into the same file, the repository's through the repository, the baseline's raw.
    let purgeKeys = vehicleKeys(100_000, prefix: "expired-")
    Benchmark("purge: repository purge --expired of 100,000 rows", configuration: .init(metrics: [.wallClock, .throughput], warmupIterations: 0, maxDuration: .seconds(120), maxIterations: 10)) { benchmark, fixture in
        let purged = try await fixture.store.purge(TokenFilter(validity: .expired(asOf: Date())))
        benchmark.stopMeasurement()
        guard purged == purgeKeys.count else { return benchmark.error("purged \(purged) rows, expected \(purgeKeys.count)") }
        try await fixture.store.upsert(expiredTokens(purgeKeys))
    } setup: {
        try await PersistFixture.holdingExpired(purgeKeys, label: "purge", throughRepository: true)
    }

    Benchmark("purge baseline: raw DELETE WHERE expires_at < ?", configuration: .init(metrics: [.wallClock, .throughput], warmupIterations: 0, maxDuration: .seconds(120), maxIterations: 10)) { benchmark, fixture in
        let purged = fixture.raw.deleteExpired(before: Date())
        benchmark.stopMeasurement()
        guard purged == purgeKeys.count else { return benchmark.error("deleted \(purged) rows, expected \(purgeKeys.count)") }
        fixture.raw.upsert(expiredTokens(purgeKeys))
    } setup: {
        try await PersistFixture.holdingExpired(purgeKeys, label: "purge-raw", throughRepository: false)
    }

    // MARK: start-up: open + ready to serve the first token
    for size in [1_000, 100_000] {
        Benchmark("startup: open and serve the first token, \(size) entries", configuration: .init(metrics: [.wallClock, .throughput], warmupIterations: 1, maxDuration: .seconds(20), maxIterations: 20)) { benchmark, path in
            benchmark.startMeasurement()
            let store = try SQLiteTokenRepository(path: path, logger: quietLogger)
            let engine = TokenSyncEngine(repository: store, fetcher: MintingFetcher(), logger: quietLogger)
            blackHole(try await engine.token(for: .vehicle("v\(size / 2)")))
            benchmark.stopMeasurement()
            store.close()
        } setup: {
            let path = scratchDirectory("startup-\(size)") + "/tokens.sqlite"
            let store = try SQLiteTokenRepository(path: path, logger: quietLogger)
            try await seed(store, keys: vehicleKeys(size))
            store.close()
            return path
        }
    }
}

extension PersistFixture {
    /// A fixture whose measured file (the repository's or the raw one) holds expired rows for `keys`.
    static func holdingExpired(_ keys: [TokenKey], label: String, throughRepository: Bool) async throws -> PersistFixture {
        let fixture = try PersistFixture(label: label)
        if throughRepository {
            try await fixture.store.upsert(expiredTokens(keys))
        } else {
            fixture.raw.upsert(expiredTokens(keys))
        }
        return fixture
    }
}

func expiredTokens(_ keys: [TokenKey]) -> [StoredToken] {
    let issued = Date().addingTimeInterval(-7200)
    let value = realisticJWT(for: keys[0], issuedAt: issued)
    return keys.map { StoredToken(key: $0, value: value, expiresAt: issued + 3600, issuedAt: issued, fetchedAt: issued) }
}
