// Whole-process figures that package-benchmark's per-iteration model does not fit. Prints one
// JSON object on stdout; ../../run merges it into results.json.
//
//   token-store-measurements [--idle-seconds 30]

import BenchmarkSupport
import DevTokenIssuer
import FleetTokenHTTP
import FleetTokenStore
import Foundation
import Logging
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

final class Flag: Sendable {
    private let value = Mutex(false)
    func set() { value.withLock { $0 = true } }
    var isSet: Bool { value.withLock { $0 } }
}

func cpuSeconds() -> Double {
    var usage = rusage()
    getrusage(RUSAGE_SELF.rawValue, &usage)
    return Double(usage.ru_utime.tv_sec) + Double(usage.ru_utime.tv_usec) / 1e6
        + Double(usage.ru_stime.tv_sec) + Double(usage.ru_stime.tv_usec) / 1e6
}

func residentBytes() -> Int {
    let fields = procFile("/proc/self/statm").split(separator: " ")
    return (Int(fields.count > 1 ? fields[1] : "0") ?? 0) * Int(sysconf(Int32(_SC_PAGESIZE)))
}

let arguments = CommandLine.arguments
let idleSeconds = arguments.firstIndex(of: "--idle-seconds").flatMap { Double(arguments[$0 + 1]) } ?? 30
var results: [String: Any] = [:]

// 1,000 concurrent token(for:) on one missing key.
do {
    let store = try SQLiteTokenRepository(path: scratchDirectory("flight") + "/tokens.sqlite", logger: quietLogger)
    let fetcher = MintingFetcher(delay: .milliseconds(50))
    let engine = TokenSyncEngine(repository: store, fetcher: fetcher, logger: quietLogger)
    let key = try TokenKey.vehicle("missing")
    try await withThrowingTaskGroup(of: Void.self) { group in
        for _ in 0..<1000 { group.addTask { _ = try await engine.token(for: key) } }
        try await group.waitForAll()
    }
    results["fetches_for_1000_concurrent_callers"] = fetcher.count
    await engine.shutdown()
    store.close()
}

// Memory per tracked key and idle CPU: 10,000 fresh keys tracked, nothing due.
do {
    let path = scratchDirectory("idle") + "/tokens.sqlite"
    let keys = vehicleKeys(10_000)
    let seeding = try SQLiteTokenRepository(path: path, logger: quietLogger)
    try await seed(seeding, keys: keys)
    seeding.close()

    let store = try SQLiteTokenRepository(path: path, logger: quietLogger)
    let fetcher = MintingFetcher()
    let engine = TokenSyncEngine(repository: store, fetcher: fetcher, logger: quietLogger)
    let running = Task { try await engine.run() }
    try await Task.sleep(for: .milliseconds(500))
    let before = residentBytes()
    await engine.track(keys)
    for key in keys { _ = try await engine.token(for: key) } // every key loaded and used once
    let after = residentBytes()
    results["bytes_per_tracked_key"] = max(0, after - before) / keys.count

    try await Task.sleep(for: .seconds(1))
    let cpuStart = cpuSeconds()
    let wallStart = ContinuousClock.now
    try await Task.sleep(for: .seconds(idleSeconds))
    let wall = ContinuousClock.now - wallStart
    let cpu = cpuSeconds() - cpuStart
    let wallSeconds = Double(wall.components.seconds) + Double(wall.components.attoseconds) / 1e18
    results["idle_cpu_percent_10k_tracked"] = (cpu / wallSeconds * 100 * 1000).rounded() / 1000
    results["idle_fetches_10k_tracked"] = fetcher.count
    running.cancel()
    _ = try? await running.value
    store.close()
}

// The longest stall a reader sees while another connection purges 100,000 expired rows.
do {
    let path = scratchDirectory("stall") + "/tokens.sqlite"
    let seeding = try SQLiteTokenRepository(path: path, logger: quietLogger)
    try await seed(seeding, keys: vehicleKeys(100_000, prefix: "old-"), expired: true)
    try await seed(seeding, keys: vehicleKeys(100, prefix: "live-"))
    seeding.close()
    let reader = try SQLiteTokenRepository(path: path, logger: quietLogger)
    let admin = try SQLiteTokenRepository(path: path, mode: .adminReadWrite, logger: quietLogger)
    let liveKey = try TokenKey.vehicle("live-7")
    let finished = Flag()
    let purging = Task {
        defer { finished.set() }
        return try await admin.purge(TokenFilter(validity: .expired(asOf: Date())))
    }
    var longest: Duration = .zero
    var reads = 0
    while !finished.isSet {
        let start = ContinuousClock.now
        _ = try await reader.entry(for: liveKey)
        longest = max(longest, ContinuousClock.now - start)
        reads += 1
    }
    let purged = try await purging.value
    results["purge_reader_longest_stall_ms"] = Double(longest.components.attoseconds) / 1e15 + Double(longest.components.seconds) * 1000
    results["purge_reader_reads_during_purge"] = reads
    results["purge_rows"] = purged
    reader.close()
    admin.close()
}

// Refresh throughput against the in-process development issuer over HTTP.
do {
    let issuer = try await DevTokenIssuer.start(logger: quietLogger)
    let fetcher = try HTTPTokenFetcher(configuration: HTTPTokenFetcherConfiguration(urlTemplate: issuer.urlTemplate), logger: quietLogger)
    let store = try SQLiteTokenRepository(path: scratchDirectory("throughput") + "/tokens.sqlite", logger: quietLogger)
    let engine = TokenSyncEngine(repository: store, fetcher: fetcher, logger: quietLogger)
    let keys = vehicleKeys(1000, prefix: "fresh-")
    let start = ContinuousClock.now
    try await withThrowingTaskGroup(of: Void.self) { group in
        for key in keys { group.addTask { _ = try await engine.token(for: key) } }
        try await group.waitForAll()
    }
    await engine.shutdown() // waits for the group commits
    let elapsed = ContinuousClock.now - start
    let seconds = Double(elapsed.components.seconds) + Double(elapsed.components.attoseconds) / 1e18
    results["refresh_throughput_per_second"] = (Double(keys.count) / seconds).rounded()
    await fetcher.shutdown()
    store.close()
    await issuer.stop()
}

let data = try JSONSerialization.data(withJSONObject: results, options: [.sortedKeys])
print(String(decoding: data, as: UTF8.self))
