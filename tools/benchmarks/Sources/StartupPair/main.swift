// The encrypted start-up figure: token-agent's start with a key file, on a store of 100,000
// sealed rows against one of 1,000, measured in alternating order so that both see the same
// machine. Prints one JSON object on stdout; ../../run takes `startup_encrypted_100k_vs_1k`
// from it.
//
//   token-store-startup-pair [--rounds 101]
//
// A start is what the package-benchmark start-up pair measures (open the store, build the
// engine, serve the first token from the store) plus the encryption work of an agent given a
// key: `TokenValueResealer.prepare(keyring:)` (the key check on the value_key_id index), the
// engine on an EncryptedTokenRepository, the first token opened. Both stores are seeded through
// an EncryptedTokenRepository with the benchmark key; a start whose token was fetched instead of
// opened, or handed out still sealed, fails the tool.
//
// Why rounds and not package-benchmark's two benchmarks: a start takes a few milliseconds, and
// on these shared 2-core machines the p50 of 20 starts moved by a factor of two between two
// runs a minute apart (the plain pair read 0.85 and then 1.60). Each round times one start on
// each store, in alternating order; the figure is the median of the rounds' ratios.

import BenchmarkSupport
import FleetTokenStore
import Foundation

let arguments = CommandLine.arguments
func option(_ name: String, _ fallback: Int) -> Int {
    arguments.firstIndex(of: name).flatMap { Int(arguments[$0 + 1]) } ?? fallback
}
let rounds = option("--rounds", 101)
let warmUpRounds = 5
let sizes = (small: 1_000, large: 100_000)

/// One start on the store at `path` holding `size` sealed rows, timed to its first token.
func start(path: String, size: Int) async throws -> Duration {
    let began = ContinuousClock.now
    let start = try await EncryptedStart(path: path)
    let token = try await start.engine.token(for: .vehicle("v\(size / 2)"))
    let elapsed = ContinuousClock.now - began
    start.store.close()
    try requireOpenedFromStore(token, fetcher: start.fetcher)
    return elapsed
}

let directory = scratchDirectory("startup-pair")
defer { try? FileManager.default.removeItem(atPath: directory) }
let small = directory + "/small.sqlite", large = directory + "/large.sqlite"
try await seedSealed(path: small, count: sizes.small)
try await seedSealed(path: large, count: sizes.large)

// Off the main actor, as an agent's start-up is.
let figures = try await Task.detached { () async throws -> PairedRounds in
    var figures = PairedRounds()
    for round in 0..<(warmUpRounds + rounds) {
        let large100k: Duration, small1k: Duration
        if round.isMultiple(of: 2) {
            large100k = try await start(path: large, size: sizes.large)
            small1k = try await start(path: small, size: sizes.small)
        } else {
            small1k = try await start(path: small, size: sizes.small)
            large100k = try await start(path: large, size: sizes.large)
        }
        guard round >= warmUpRounds else { continue }
        figures.record(large100k, against: small1k, units: 1)
    }
    return figures
}.value
let output: [String: Any] = [
    "startup_encrypted_100k_vs_1k": figures.ratio,
    "startup_encrypted_ratio_p25": figures.ratioQuartiles[0],
    "startup_encrypted_ratio_p75": figures.ratioQuartiles[1],
    "startup_encrypted_100k_p50_ms": round3(figures.measuredMedian / 1000),
    "startup_encrypted_1k_p50_ms": round3(figures.baselineMedian / 1000),
    "rounds": rounds,
]
let json = try JSONSerialization.data(withJSONObject: output, options: [.sortedKeys])
print(String(decoding: json, as: UTF8.self))
