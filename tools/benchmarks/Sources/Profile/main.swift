// Loops one path so valgrind's callgrind can count its instructions (repeatable on a noisy,
// shared machine, unlike wall time). Used to find what a missed goal costs:
//
//   valgrind --tool=callgrind .build/release/token-store-profile hit 100000
//
// (see the README's "Profiling a missed goal" for the debug-information step valgrind 3.19 needs).
// Modes: hit, hit-baseline, persist, persist-raw, persist-raw-shape, persist-encrypted,
// seal and seal-baseline (upserts through an EncryptedTokenRepository over a store that discards
// them, and into that store directly: the sealing alone), open <path>, open-encrypted <path> (a
// store of `seed-sealed <path> <count>`, sealed with the benchmark key).

import BenchmarkSupport
import FleetTokenStore
import Foundation
import Synchronization

let arguments = CommandLine.arguments.dropFirst()
guard let mode = arguments.first else {
    FileHandle.standardError.write(Data("usage: token-store-profile hit|hit-baseline|persist|persist-raw|persist-encrypted|seal|seal-baseline N | open|open-encrypted PATH | seed-sealed PATH N\n".utf8))
    exit(64)
}
let count = arguments.dropFirst().first.flatMap(Int.init) ?? 10_000
let key = try! TokenKey.vehicle("hot-vehicle")

// A synchronous main that blocks on a semaphore, not an async one: once an async main awaits,
// the main thread parks in libdispatch's `rt_sigsuspend` with its mask in read-only memory,
// and valgrind 3.19, which writes to that mask, crashes (VALGRIND INTERNAL ERROR, SIGSEGV).
let finished = DispatchSemaphore(value: 0)
Task.detached {
    do {
        try await profile(mode: mode, count: count)
    } catch {
        FileHandle.standardError.write(Data("token-store-profile: \(error)\n".utf8))
        exit(1)
    }
    finished.signal()
}
finished.wait()

func profile(mode: String, count: Int) async throws {
    switch mode {
    case "hit", "hit-baseline":
        let store = try SQLiteTokenRepository(path: scratchDirectory("profile-hit") + "/tokens.sqlite", logger: quietLogger)
        let engine = TokenSyncEngine(repository: store, fetcher: MintingFetcher(), logger: quietLogger)
        let first = try await engine.token(for: key)
        let dictionary = Mutex([key: first.value])
        // Off the main actor, as a server's tasks are: a main-actor caller would hop on every call.
        try await Task.detached {
            let start = ContinuousClock.now
            if mode == "hit" {
                for _ in 0..<count { blackHoleValue(try await engine.token(for: key)) }
            } else {
                for _ in 0..<count { blackHoleValue(dictionary.withLock { $0[key] }) }
            }
            let elapsed = ContinuousClock.now - start
            print("\(mode): \(Double(elapsed.components.attoseconds) / 1e9 / Double(count) + Double(elapsed.components.seconds) * 1e9 / Double(count)) ns per call")
        }.value
    case "persist-harness", "persist-raw-harness":
        // Each write in a fresh task started from a dispatch thread, timed inside the task, the way
        // package-benchmark runs an async benchmark's iterations.
        let directory = scratchDirectory("profile-harness")
        let store = try SQLiteTokenRepository(path: directory + "/tokens.sqlite", logger: quietLogger)
        try SQLiteTokenRepository(path: directory + "/raw.sqlite", logger: quietLogger).close()
        let raw = RawSQLite(path: directory + "/raw.sqlite")
        let value = realisticJWT(for: key, issuedAt: Date())
        let total = Accumulator()
        let throughRepository = mode == "persist-harness"
        for n in 0..<count {
            let now = Date(timeIntervalSince1970: 1_800_000_000 + Double(n))
            let token = StoredToken(key: key, value: value, expiresAt: now + 3600, issuedAt: now, fetchedAt: now)
            let done = DispatchSemaphore(value: 0)
            DispatchQueue.global(qos: .userInitiated).async {
                Task {
                    let start = ContinuousClock.now
                    if throughRepository { try? await store.upsert(token) } else { raw.upsert(token) }
                    let elapsed = ContinuousClock.now - start
                    total.value.withLock { $0 += elapsed }
                    total.samples.withLock { $0.append(elapsed) }
                    done.signal()
                }
            }
            done.wait()
        }
        let sorted = total.samples.withLock { $0.sorted() }
        print("\(mode): p50 \(sorted[sorted.count / 2])")
        let elapsed = total.value.withLock { $0 }
        print("\(mode): \(Double(elapsed.components.seconds) * 1e6 / Double(count) + Double(elapsed.components.attoseconds) / 1e12 / Double(count)) µs per upsert")
    case "persist", "persist-raw", "persist-raw-shape", "persist-encrypted":
        let directory = scratchDirectory("profile-persist")
        let store = try SQLiteTokenRepository(path: directory + "/tokens.sqlite", logger: quietLogger)
        try await TokenValueResealer(store: store, logger: quietLogger).prepare(keyring: benchmarkKeyring)
        let encrypted = EncryptedTokenRepository(base: store, keyring: benchmarkKeyring, logger: quietLogger)
        let raw = RawSQLite(path: directory + "/tokens.sqlite")
        let value = realisticJWT(for: key, issuedAt: Date())
        try await Task.detached {
            let start = ContinuousClock.now
            for n in 0..<count {
                let now = Date(timeIntervalSince1970: 1_800_000_000 + Double(n))
                let token = StoredToken(key: key, value: value, expiresAt: now + 3600, issuedAt: now, fetchedAt: now)
                switch mode {
                case "persist": try await store.upsert(token)
                case "persist-encrypted": try await encrypted.upsert(token)
                case "persist-raw": raw.upsert(token)
                default: raw.upsertInTransactionShape(token)
                }
            }
            let elapsed = ContinuousClock.now - start
            print("\(mode): \(Double(elapsed.components.seconds) * 1e6 / Double(count) + Double(elapsed.components.attoseconds) / 1e12 / Double(count)) µs per upsert")
        }.value
    case "open":
        let path = String(arguments.dropFirst().first ?? "tokens.sqlite")
        for _ in 0..<3 {
            let store = try SQLiteTokenRepository(path: path, logger: quietLogger)
            let engine = TokenSyncEngine(repository: store, fetcher: MintingFetcher(), logger: quietLogger)
            blackHoleValue(try await engine.token(for: .vehicle("v500")))
            store.close()
        }
    case "seal", "seal-baseline":
        let discarding = DiscardingStore()
        let encrypted = EncryptedTokenRepository(base: discarding, keyring: benchmarkKeyring, logger: quietLogger)
        let value = realisticJWT(for: key, issuedAt: Date())
        try await Task.detached {
            let start = ContinuousClock.now
            for n in 0..<count {
                let now = Date(timeIntervalSince1970: 1_800_000_000 + Double(n))
                let token = StoredToken(key: key, value: value, expiresAt: now + 3600, issuedAt: now, fetchedAt: now)
                if mode == "seal" { try await encrypted.upsert(token) } else { try await discarding.upsert(token) }
            }
            let elapsed = ContinuousClock.now - start
            print("\(mode): \(Double(elapsed.components.seconds) * 1e6 / Double(count) + Double(elapsed.components.attoseconds) / 1e12 / Double(count)) µs per upsert")
        }.value
    case "open-encrypted":
        let path = String(arguments.dropFirst().first ?? "tokens.sqlite")
        var times: [Double] = []
        for _ in 0..<(arguments.dropFirst(2).first.flatMap(Int.init) ?? 3) {
            let began = ContinuousClock.now
            let start = try await EncryptedStart(path: path)
            blackHoleValue(try await start.engine.token(for: .vehicle("v500")))
            times.append(nanoseconds(ContinuousClock.now - began) / 1e6)
            start.store.close()
        }
        print("open-encrypted: \(times.map { (($0 * 1000).rounded() / 1000) }) ms")
    case "seed-sealed":
        let path = String(arguments.dropFirst().first ?? "tokens.sqlite")
        try await seedSealed(path: path, count: arguments.dropFirst(2).first.flatMap(Int.init) ?? 1000)
    default:
        FileHandle.standardError.write(Data("unknown mode \(mode)\n".utf8))
        exit(64)
    }
}

@inline(never) func blackHoleValue<T>(_ value: T) { withExtendedLifetime(value) {} }

final class Accumulator: Sendable {
    let value = Mutex(Duration.zero)
    let samples = Mutex([Duration]())
}

/// A store that keeps nothing: what `seal` writes through, so only the sealing is measured.
final class DiscardingStore: TokenRepository, RefreshLeaseStore, TokenSealingStore {
    let written = Mutex(0)
    var storeName: String { "discarding" }
    func entry(for key: TokenKey) async throws(TokenStoreError) -> TokenEntry? { nil }
    func entries(for keys: [TokenKey]) async throws(TokenStoreError) -> [TokenKey: TokenEntry] { [:] }
    @inline(never) func upsert(_ token: StoredToken, clearFailure: Bool) async throws(TokenStoreError) {
        written.withLock { $0 += token.value.utf8.count }
    }
    func upsert(_ tokens: [StoredToken], clearFailure: Bool) async throws(TokenStoreError) {}
    func removeToken(for key: TokenKey) async throws(TokenStoreError) {}
    func recordFailure(_ failure: RefreshFailureState, for key: TokenKey) async throws(TokenStoreError) {}
    func deleteRetired(_ keys: [TokenKey], before cutoff: Date) async throws(TokenStoreError) -> Int { 0 }
    func changes() -> AsyncStream<TokenStoreChange> { AsyncStream { $0.finish() } }
    func runBackgroundWork() async {}
    func followChanges() async {}
    func valueKeyIDs() async throws(TokenStoreError) -> Set<String> { [] }
    func valueKeyCounts() async throws(TokenStoreError) -> [String: Int] { [:] }
    func tokenKeys(valueKeyID: String, matching: Bool, after: TokenKey?, limit: Int) async throws(TokenStoreError) -> [TokenKey] { [] }
    func replaceValues(_ replacements: [TokenValueReplacement]) async throws(TokenStoreError) -> Set<TokenKey> { [] }
    func discardReplacedValues() async throws(TokenStoreError) {}
    func removeToken(for key: TokenKey, ifValue value: String) async throws(TokenStoreError) -> Bool { false }
    func acquireRefreshLease(for key: TokenKey, holder: String, now: Date, duration: TimeInterval) async throws(TokenStoreError) -> RefreshLease {
        .acquired(current: nil)
    }
    func takeOverRefreshLease(for key: TokenKey, from deadHolder: String, holder: String, now: Date,
                              duration: TimeInterval) async throws(TokenStoreError) -> RefreshLease {
        .acquired(current: nil)
    }
    func releaseRefreshLeases(for keys: [TokenKey], holder: String) async throws(TokenStoreError) {}
}
