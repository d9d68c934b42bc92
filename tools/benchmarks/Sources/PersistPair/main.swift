// The persist ratios' figures, each measured in alternating blocks so that both sides see the
// same machine. Prints one JSON object on stdout; ../../run takes the figure from it.
//
//   token-store-persist-pair [--rounds 301] [--writes 200]
//       persist_vs_raw_sqlite: a refreshed token persisted through `SQLiteTokenRepository.upsert`
//       against the raw C-API upsert of the same row shape into a file with the identical schema.
//   token-store-persist-pair --encrypted-vs-plain [--rounds 301] [--writes 200]
//       persist_encrypted_vs_plain: the same refreshed tokens through an `EncryptedTokenRepository`
//       over a `SQLiteTokenRepository` (sealed with AES-GCM on the way) against
//       `SQLiteTokenRepository.upsert` alone, each into its own file migrated the same way.
//
// Why not package-benchmark's two separate benchmarks (still reported, without a goal): they run
// seconds apart, and on these shared 2-core machines the speed drifts between them. Two runs
// minutes apart with the same code gave 1.023 (44 against 43 µs) and 1.357 (57 against 42 µs).
// Here each round times one block of writes through each side, in alternating order (so neither
// side always runs second); the figure is the median of the rounds' ratios, so a round disturbed
// by another process is an outlier.

import BenchmarkSupport
import FleetTokenStore
import Foundation

let arguments = CommandLine.arguments
func option(_ name: String, _ fallback: Int) -> Int {
    arguments.firstIndex(of: name).flatMap { Int(arguments[$0 + 1]) } ?? fallback
}
let rounds = option("--rounds", 301)
let writes = option("--writes", 200)
let encryptedVsPlain = arguments.contains("--encrypted-vs-plain")
let warmUpRounds = 20

let key = try TokenKey.vehicle("persisted")
let value = realisticJWT(for: key, issuedAt: Date())
/// `writes` tokens for the key, numbered from `first`, each expiring later than the last, so
/// every upsert replaces.
func tokens(from first: Int) -> [StoredToken] {
    (first..<(first + writes)).map { n in
        let at = Date(timeIntervalSince1970: 1_800_000_000 + Double(n))
        return StoredToken(key: key, value: value, expiresAt: at + 3600, issuedAt: at, fetchedAt: at)
    }
}

/// One side of a pair: writes its block of tokens one after another, each its own transaction.
typealias Side = @Sendable ([StoredToken]) async throws -> Void

/// Times `measured` against `baseline` in alternating blocks, both off the main actor, as the
/// engine's group commit and a server's tasks are: a main-actor caller would hop to the
/// cooperative pool and back on every write (it doubled the figure).
func pair(measured: @escaping Side, baseline: @escaping Side) async throws -> PairedRounds {
    try await Task.detached { () async throws -> PairedRounds in
        var figures = PairedRounds()
        for round in 0..<(warmUpRounds + rounds) {
            let mine = tokens(from: round * 2 * writes), theirs = tokens(from: (round * 2 + 1) * writes)
            func time(_ side: Side, _ block: [StoredToken]) async throws -> Duration {
                let start = ContinuousClock.now
                try await side(block)
                return ContinuousClock.now - start
            }
            let persist: Duration, base: Duration
            if round.isMultiple(of: 2) {
                persist = try await time(measured, mine)
                base = try await time(baseline, theirs)
            } else {
                base = try await time(baseline, theirs)
                persist = try await time(measured, mine)
            }
            guard round >= warmUpRounds else { continue }
            figures.record(persist, against: base, units: writes)
        }
        return figures
    }.value
}

let directory = scratchDirectory(encryptedVsPlain ? "persist-encrypted-pair" : "persist-pair")
let output: [String: Any]
if encryptedVsPlain {
    // Two files migrated alike; the encrypted side's prepared as token-agent prepares a store
    // it opens with a key.
    let sealedStore = try SQLiteTokenRepository(path: directory + "/sealed.sqlite", logger: quietLogger)
    try await TokenValueResealer(store: sealedStore, logger: quietLogger).prepare(keyring: benchmarkKeyring)
    let encrypted = EncryptedTokenRepository(base: sealedStore, keyring: benchmarkKeyring, logger: quietLogger)
    let plainStore = try SQLiteTokenRepository(path: directory + "/plain.sqlite", logger: quietLogger)
    let figures = try await pair(
        measured: { block in for token in block { try await encrypted.upsert(token) } },
        baseline: { block in for token in block { try await plainStore.upsert(token) } })
    // Each side wrote what it should: sealed values under the benchmark key, plaintext ones.
    let sealedIDs = try await sealedStore.valueKeyIDs(), plainIDs = try await plainStore.valueKeyIDs()
    guard sealedIDs == [benchmarkKeyring.primary.id], plainIDs == [plaintextKeyID],
          try await encrypted.entry(for: key)?.token?.value == value else {
        FileHandle.standardError.write(Data("token-store-persist-pair: the encrypted side stored \(sealedIDs.sorted()), the plain side \(plainIDs.sorted())\n".utf8))
        exit(1)
    }
    sealedStore.close()
    plainStore.close()
    output = [
        "persist_encrypted_vs_plain": figures.ratio,
        "persist_encrypted_ratio_p25": figures.ratioQuartiles[0],
        "persist_encrypted_ratio_p75": figures.ratioQuartiles[1],
        "persist_encrypted_p50_us": figures.measuredMedian,
        "persist_plain_p50_us": figures.baselineMedian,
        "rounds": rounds,
        "writes_per_block": writes,
    ]
} else {
    let store = try SQLiteTokenRepository(path: directory + "/tokens.sqlite", logger: quietLogger)
    // The raw side gets its own file with the identical schema (migrated the same way).
    try SQLiteTokenRepository(path: directory + "/raw.sqlite", logger: quietLogger).close()
    let raw = RawSQLite(path: directory + "/raw.sqlite")
    let figures = try await pair(
        measured: { block in for token in block { try await store.upsert(token) } },
        baseline: { block in for token in block { raw.upsert(token) } })
    store.close()
    output = [
        "persist_vs_raw_sqlite": figures.ratio,
        "persist_ratio_p25": figures.ratioQuartiles[0],
        "persist_ratio_p75": figures.ratioQuartiles[1],
        "persist_p50_us": figures.measuredMedian,
        "persist_raw_p50_us": figures.baselineMedian,
        "rounds": rounds,
        "writes_per_block": writes,
    ]
}
let json = try JSONSerialization.data(withJSONObject: output, options: [.sortedKeys])
print(String(decoding: json, as: UTF8.self))
