// The PostgreSQL figures, against the server `--url` names (../../run starts a private cluster on
// loopback for it). Prints one JSON object on stdout; ../../run takes three figures from it:
//
// - `pg_persist_vs_raw_postgres_nio`: a refreshed token persisted through
//   `PostgresTokenRepository.upsert(token)` against the same upsert through raw postgres-nio: a
//   `PostgresPreparedStatement` with the repository's SQL text (`UpsertClearingFailure`, copied
//   below) run by `PostgresClient.execute` on a client with the repository's pool settings, into
//   the tables of a second schema (`raw_baseline`) that a second repository migrated, so tables,
//   trigger and indexes are identical. Alternating blocks of writes, median of the rounds' ratios,
//   as token-store-persist-pair does for SQLite. A third side, the raw upsert inside a deadline
//   task group of the repository's shape, tells what that wrapper costs (reported without a goal).
// - `pg_batch_vs_raw_transaction`: 1,000 tokens through `repository.upsert([tokens])` (the
//   engine's group commit: one statement over unnested arrays) against the same 1,000 prepared
//   upserts in one raw transaction (`client.withTransaction`), alternating, median of ratios.
// - `pg_fetches_3_replicas_1000_keys`: three `TokenSyncEngine`s, each on its own repository (its
//   own pool, as three hosts), on one database, one shared counting provider; all three run,
//   track the same 1,000 keys and ask for every key at once; fetches per key per token lifetime
//   over two lifetimes (see `measureReplicas`).
//
//   token-store-postgres-measurements --url postgres://USER@HOST:PORT/DB?sslmode=disable
//       [--rounds 201] [--writes 100] [--batch-rounds 31] [--keys 1000] [--lifetime 20]
//       [--fetch-delay-ms 20] [--only persist|batch|replicas]
//
// The password comes from the URL or PGPASSWORD. It drops and recreates its own schemas
// (fleet_bench_repository, raw_baseline, fleet_bench_replicas) in that database, so that every
// run writes into empty tables; nothing else is touched.

import BenchmarkSupport
import FleetTokenPostgres
import FleetTokenStore
import FleetTokenStoreTesting
import Foundation
import Logging
import PostgresNIO
import Synchronization

let arguments = CommandLine.arguments
func value(of name: String) -> String? {
    arguments.firstIndex(of: name).flatMap { $0 + 1 < arguments.count ? arguments[$0 + 1] : nil }
}
func option(_ name: String, _ fallback: Int) -> Int { value(of: name).flatMap { Int($0) } ?? fallback }

func fail(_ message: String, status: Int32 = 1) -> Never {
    FileHandle.standardError.write(Data("token-store-postgres-measurements: \(message)\n".utf8))
    exit(status)
}

guard let baseURL = value(of: "--url") else {
    fail("--url postgres://USER@HOST:PORT/DATABASE is required (the password from the URL or PGPASSWORD)", status: 64)
}
let rounds = option("--rounds", 201)
let writes = option("--writes", 100)
let batchRounds = option("--batch-rounds", 31)
let keyCount = option("--keys", 1000)
let lifetime = TimeInterval(option("--lifetime", 20))
let fetchDelay = Duration.milliseconds(option("--fetch-delay-ms", 20))
let only = value(of: "--only")
let warmUpRounds = 20, batchWarmUpRounds = 3, batchSize = 1000

let repositorySchema = "fleet_bench_repository", rawSchema = "raw_baseline", replicaSchema = "fleet_bench_replicas"

/// `baseURL` with its `schema` parameter set to `schema`.
func url(schema: String) -> String {
    guard var components = URLComponents(string: baseURL) else { fail("--url \(baseURL.prefix(12))… is not a URL", status: 64) }
    components.queryItems = (components.queryItems ?? []).filter { $0.name != "schema" } + [URLQueryItem(name: "schema", value: schema)]
    return components.string!
}

func storeConfiguration(schema: String) throws -> PostgresStoreConfiguration {
    do { return try PostgresStoreConfiguration(url: url(schema: schema)) } catch { fail("--url: \(error)", status: 64) }
}

/// The raw side's client: the settings `PostgresStoreConfiguration` gives the repository's pool
/// (internal there, so restated here from the same public values): pool size, no idle minimum,
/// connect timeout, and the startup parameters search_path, statement_timeout and an
/// application_name of the same length as the repository's (it is in every notification).
func rawClientConfiguration(_ configuration: PostgresStoreConfiguration) -> PostgresClient.Configuration {
    let location = configuration.location
    let password = URLComponents(string: baseURL)?.password.map { $0.removingPercentEncoding ?? $0 }
        ?? ProcessInfo.processInfo.environment["PGPASSWORD"]
    var pool: PostgresClient.Configuration
    if let socketPath = location.socketPath {
        pool = .init(unixSocketPath: socketPath, username: location.user, password: password, database: location.database)
    } else {
        let tls: PostgresClient.Configuration.TLS
        switch location.sslMode {
        case .disable:
            tls = .disable
        case .prefer:
            var settings = TLSConfiguration.makeClientConfiguration()
            settings.certificateVerification = .none
            tls = .prefer(settings)
        default:
            fail("the raw baseline connects with sslmode=disable or prefer only (the run's server is on loopback)", status: 64)
        }
        pool = .init(host: location.host ?? "localhost", port: location.port, username: location.user, password: password,
                     database: location.database, tls: tls)
    }
    let timeout = configuration.statementTimeout.components
    pool.options.connectTimeout = configuration.connectTimeout
    pool.options.maximumConnections = max(2, configuration.maximumConnections)
    pool.options.minimumConnections = 0
    pool.options.additionalStartupParameters = [
        ("search_path", location.schema),
        ("statement_timeout", String(timeout.seconds * 1000 + timeout.attoseconds / 1_000_000_000_000_000)),
        ("application_name", "fleet-token-store/rawbench"),
    ]
    return pool
}

/// The repository's `UpsertClearingFailure` (FleetTokenPostgres/PostgresTokenSQL.swift, internal
/// there): the identical SQL text, parameter types and bindings.
struct RawUpsertClearingFailure: PostgresPreparedStatement {
    static let name = "raw_baseline_upsert_clearing_failure"
    static let sql = """
        INSERT INTO tokens (kind, subject_id, token, expires_at, issued_at, fetched_at, last_used_at)
        VALUES ($1, $2, $3, $4, $5, $6, $7)
        ON CONFLICT (kind, subject_id) DO UPDATE SET
          token = excluded.token, expires_at = excluded.expires_at, issued_at = excluded.issued_at,
          fetched_at = excluded.fetched_at,
          last_used_at = coalesce(excluded.last_used_at, tokens.last_used_at), failure_count = 0, next_attempt_at = NULL, last_error_kind = NULL, last_error_message = NULL, last_failure_at = NULL, failure_config_digest = NULL
        WHERE tokens.token IS NULL OR excluded.expires_at >= tokens.expires_at
        """
    static let bindingDataTypes: [PostgresDataType] = [.text, .text, .text, .float8, .float8, .float8, .float8]
    typealias Row = Void

    let token: StoredToken

    func makeBindings() throws -> PostgresBindings {
        var bindings = PostgresBindings(capacity: 7)
        bindings.append(token.key.kind.rawValue)
        bindings.append(token.key.subjectID)
        bindings.append(token.value)
        bindings.append(token.expiresAt.timeIntervalSince1970)
        bindings.append(token.issuedAt?.timeIntervalSince1970)
        bindings.append(token.fetchedAt.timeIntervalSince1970)
        bindings.append(token.lastUsedAt?.timeIntervalSince1970)
        return bindings
    }

    func decodeRow(_ row: PostgresRow) throws {}
}

/// One raw upsert, its rows consumed as the repository consumes them.
@Sendable func rawUpsert(_ client: PostgresClient, _ token: StoredToken) async throws {
    _ = try await client.execute(RawUpsertClearingFailure(token: token), logger: quietLogger).reduce(()) { _, _ in }
}

/// The shape every repository call runs in (its `perform`, internal there): the operation and a
/// sleeping deadline task in a task group, the first to finish wins.
func withDeadline<T: Sendable>(_ limit: Duration, _ operation: @escaping @Sendable () async throws -> T) async throws -> T {
    try await withThrowingTaskGroup(of: T?.self) { group in
        group.addTask { try await operation() }
        group.addTask {
            try await Task.sleep(for: limit)
            return nil
        }
        defer { group.cancelAll() }
        guard let first = try await group.next(), let value = first else { throw CancellationError() }
        return value
    }
}

/// Fails unless the repository's single upsert sends exactly ``RawUpsertClearingFailure/sql``:
/// after one upsert through `store`, the server's own record of its connection's last statement
/// (pg_stat_activity.query) must be that text.
func checkIdenticalSQL(_ store: PostgresTokenRepository, _ raw: PostgresClient) async throws {
    let key = try TokenKey.vehicle("sql-check")
    try await store.upsert(StoredToken(key: key, value: realisticJWT(for: key, issuedAt: Date()), expiresAt: Date() + 3600,
                                       issuedAt: Date(), fetchedAt: Date()))
    var seen: [String] = []
    for try await query in try await raw.query("""
        SELECT query FROM pg_stat_activity
        WHERE application_name LIKE 'fleet-token-store/%' AND application_name <> 'fleet-token-store/rawbench'
          AND query LIKE 'INSERT INTO tokens%'
        """, logger: quietLogger).decode(String.self) {
        seen.append(query)
    }
    guard !seen.isEmpty, seen.allSatisfy({ $0 == RawUpsertClearingFailure.sql }) else {
        fail("the raw baseline's SQL is not the repository's: copy UpsertClearingFailure.sql from "
             + "Sources/FleetTokenPostgres/PostgresTokenSQL.swift again. The repository sent:\n\(seen.joined(separator: "\n---\n"))")
    }
}

// MARK: - Persisting one token

/// `count` tokens for `key`, numbered from `first`, each expiring later than the last, so every
/// upsert replaces.
func tokens(for key: TokenKey, value: String, from first: Int, count: Int) -> [StoredToken] {
    (first..<(first + count)).map { n in
        let at = Date(timeIntervalSince1970: 1_800_000_000 + Double(n))
        return StoredToken(key: key, value: value, expiresAt: at + 3600, issuedAt: at, fetchedAt: at)
    }
}

struct PersistFigures: Sendable {
    /// Repository against raw.
    var pair = PairedRounds()
    /// Raw inside the deadline task group against raw.
    var deadline = PairedRounds()
}

/// Three sides per round, in rotating order (each goes first, second and third alike): the
/// repository; raw; raw inside the deadline task group. Each side writes its own key (the
/// repository into its schema, the two raw sides into raw_baseline), so every write replaces.
func measurePersist(_ store: PostgresTokenRepository, _ raw: PostgresClient, statementTimeout: Duration) async throws -> PersistFigures {
    let storeKey = try TokenKey.vehicle("persisted"), rawKey = try TokenKey.vehicle("persisted"),
        guardedKey = try TokenKey.vehicle("persisted-deadline")
    let value = realisticJWT(for: storeKey, issuedAt: Date())
    var figures = PersistFigures()
    for round in 0..<(warmUpRounds + rounds) {
        let first = round * writes
        let mine = tokens(for: storeKey, value: value, from: first, count: writes)
        let theirs = tokens(for: rawKey, value: value, from: first, count: writes)
        let guarded = tokens(for: guardedKey, value: value, from: first, count: writes)
        func timeStore() async throws -> Duration {
            let start = ContinuousClock.now
            for token in mine { try await store.upsert(token) }
            return ContinuousClock.now - start
        }
        func timeRaw() async throws -> Duration {
            let start = ContinuousClock.now
            for token in theirs { try await rawUpsert(raw, token) }
            return ContinuousClock.now - start
        }
        func timeGuarded() async throws -> Duration {
            let start = ContinuousClock.now
            for token in guarded { try await withDeadline(statementTimeout + .seconds(1)) { try await rawUpsert(raw, token) } }
            return ContinuousClock.now - start
        }
        var persist = Duration.zero, baseline = Duration.zero, withDeadlineGroup = Duration.zero
        switch round % 3 {
        case 0:
            persist = try await timeStore(); baseline = try await timeRaw(); withDeadlineGroup = try await timeGuarded()
        case 1:
            baseline = try await timeRaw(); withDeadlineGroup = try await timeGuarded(); persist = try await timeStore()
        default:
            withDeadlineGroup = try await timeGuarded(); persist = try await timeStore(); baseline = try await timeRaw()
        }
        guard round >= warmUpRounds else { continue }
        figures.pair.record(persist, against: baseline, units: writes)
        figures.deadline.record(withDeadlineGroup, against: baseline, units: writes)
    }
    return figures
}

// MARK: - 1,000 tokens at once

/// The repository's group-commit statement (`PostgresTokenSQL.batchUpsertSQL(clearingFailure:
/// true)`, internal there), restated for the reported raw-unnest side.
let rawBatchUpsertSQL = """
    INSERT INTO tokens (kind, subject_id, token, expires_at, issued_at, fetched_at, last_used_at)
    SELECT k, s, t, e, nullif(i, 'NaN'::float8), f, nullif(u, 'NaN'::float8)
    FROM unnest($1::text[], $2::text[], $3::text[], $4::float8[], $5::float8[], $6::float8[], $7::float8[])
         AS batch(k, s, t, e, i, f, u)
    ON CONFLICT (kind, subject_id) DO UPDATE SET
      token = excluded.token, expires_at = excluded.expires_at, issued_at = excluded.issued_at,
      fetched_at = excluded.fetched_at,
      last_used_at = coalesce(excluded.last_used_at, tokens.last_used_at), failure_count = 0, next_attempt_at = NULL, last_error_kind = NULL, last_error_message = NULL, last_failure_at = NULL, failure_config_digest = NULL
    WHERE tokens.token IS NULL OR excluded.expires_at >= tokens.expires_at
    """

struct BatchFigures: Sendable {
    /// The repository against 1,000 prepared upserts in one raw transaction (the goal's figure).
    var pair = PairedRounds()
    /// The repository against its own statement sent raw (`client.query`): what the
    /// repository adds to the statement itself (reported without a goal).
    var unnest = PairedRounds()
}

/// Three sides per round, in rotating order: the repository's group commit of 1,000 tokens
/// (one statement over unnested arrays); 1,000 prepared upserts in one raw transaction (the
/// goal's baseline); the repository's statement sent raw. The repository writes its schema; the
/// raw sides write raw_baseline, one after the other, each with later tokens than the last.
func measureBatch(_ store: PostgresTokenRepository, _ raw: PostgresClient) async throws -> BatchFigures {
    let keys = vehicleKeys(batchSize, prefix: "batch-")
    let values = keys.map { realisticJWT(for: $0, issuedAt: Date()) }
    func batch(_ n: Int) -> [StoredToken] {
        let at = Date(timeIntervalSince1970: 1_800_000_000 + Double(n))
        return zip(keys, values).map { StoredToken(key: $0, value: $1, expiresAt: at + 3600, issuedAt: at, fetchedAt: at) }
    }
    var figures = BatchFigures()
    for round in 0..<(batchWarmUpRounds + batchRounds) {
        // The raw sides share the table: whichever runs second writes the later tokens.
        let mine = batch(2 * round), theirs = batch(2 * round + (round % 3 == 2 ? 1 : 0)),
            unnested = batch(2 * round + (round % 3 == 2 ? 0 : 1))
        func timeStore() async throws -> Duration {
            let start = ContinuousClock.now
            try await store.upsert(mine)
            return ContinuousClock.now - start
        }
        func timeRaw() async throws -> Duration {
            let start = ContinuousClock.now
            try await raw.withTransaction(logger: quietLogger) { connection in
                for token in theirs {
                    _ = try await connection.execute(RawUpsertClearingFailure(token: token), logger: quietLogger).reduce(()) { _, _ in }
                }
            }
            return ContinuousClock.now - start
        }
        func timeUnnest() async throws -> Duration {
            var kinds: [String] = [], subjects: [String] = [], values: [String] = []
            var expiries: [Double] = [], issued: [Double] = [], fetched: [Double] = [], used: [Double] = []
            for token in unnested {
                kinds.append(token.key.kind.rawValue)
                subjects.append(token.key.subjectID)
                values.append(token.value)
                expiries.append(token.expiresAt.timeIntervalSince1970)
                issued.append(token.issuedAt?.timeIntervalSince1970 ?? .nan)
                fetched.append(token.fetchedAt.timeIntervalSince1970)
                used.append(token.lastUsedAt?.timeIntervalSince1970 ?? .nan)
            }
            var bindings = PostgresBindings(capacity: 7)
            bindings.append(kinds)
            bindings.append(subjects)
            bindings.append(values)
            bindings.append(expiries)
            bindings.append(issued)
            bindings.append(fetched)
            bindings.append(used)
            let start = ContinuousClock.now
            for try await _ in try await raw.query(PostgresQuery(unsafeSQL: rawBatchUpsertSQL, binds: bindings), logger: quietLogger) {}
            return ContinuousClock.now - start
        }
        var persist = Duration.zero, baseline = Duration.zero, unnest = Duration.zero
        switch round % 3 {
        case 0:
            persist = try await timeStore(); baseline = try await timeRaw(); unnest = try await timeUnnest()
        case 1:
            baseline = try await timeRaw(); unnest = try await timeUnnest(); persist = try await timeStore()
        default:
            unnest = try await timeUnnest(); persist = try await timeStore(); baseline = try await timeRaw()
        }
        guard round >= batchWarmUpRounds else { continue }
        figures.pair.record(persist, against: baseline, units: 1)
        figures.unnest.record(persist, against: unnest, units: 1)
    }
    return figures
}

// MARK: - Three replicas, one database

/// When each key was fetched (through any engine), for the figure's honesty checks.
///
/// A key's lifetimes, as one engine alone would live them: the first fetch begins the first;
/// the first fetch at least `softPoint` after a lifetime's beginning begins the next. Any other
/// fetch came before the soft point of the token in hand: a duplicate.
final class FetchLog: Sendable {
    private let times = Mutex<[TokenKey: [ContinuousClock.Instant]]>([:])
    let softPoint: Duration

    init(softPoint: Duration) { self.softPoint = softPoint }

    func note(_ key: TokenKey) {
        let now = ContinuousClock.now
        times.withLock { $0[key, default: []].append(now) }
    }

    /// When each of `key`'s lifetimes began, given its fetch times.
    func lifetimes(_ fetched: [ContinuousClock.Instant]) -> [ContinuousClock.Instant] {
        var begun: [ContinuousClock.Instant] = []
        for time in fetched where begun.last.map({ time - $0 >= softPoint }) ?? true { begun.append(time) }
        return begun
    }

    /// The fewest lifetimes begun of any of `keys`.
    func fewestLifetimes(of keys: [TokenKey]) -> Int {
        times.withLock { times in keys.map { lifetimes(times[$0] ?? []).count }.min() ?? 0 }
    }

    /// The earliest moment a third lifetime of any of `keys` could begin: a second begun at b₂
    /// ends at b₂ + `softPoint` at the earliest; a first begun at b₁, at b₁ + 2 × `softPoint`.
    func earliestThirdLifetime(of keys: [TokenKey]) -> ContinuousClock.Instant {
        times.withLock { times in
            keys.compactMap { key -> ContinuousClock.Instant? in
                let begun = lifetimes(times[key] ?? [])
                guard let first = begun.first else { return nil }
                return begun.count >= 2 ? begun[1] + softPoint : first + softPoint + softPoint
            }.min() ?? .now + softPoint + softPoint
        }
    }

    var snapshot: [TokenKey: [ContinuousClock.Instant]] { times.withLock { $0 } }
}

/// One replica's view of the shared provider: counts its own fetches.
final class ReplicaFetcher: TokenFetcher, Sendable {
    let shared: ScriptedFetcher
    private let calls = Atomic<Int>(0)

    init(shared: ScriptedFetcher) { self.shared = shared }

    var count: Int { calls.load(ordering: .relaxed) }

    func fetchToken(for key: TokenKey) async throws(TokenProviderError) -> FetchedToken {
        calls.add(1, ordering: .relaxed)
        return try await shared.fetchToken(for: key)
    }
}

struct ReplicaFigures: Sendable {
    /// Fetches in the window, and the lifetimes its keys began in it (as one engine alone would
    /// live them: 2 per key when the window is complete).
    var total = 0, lifetimes = 0, totalAfterShutdown = 0
    var windowComplete = true
    var perEngine: [Int] = []
    var perKeyCounts: [Int: Int] = [:], perKeyLifetimes: [Int: Int] = [:]
    var fetchesBeforeSoftPoint = 0
    var callerFailures = 0
    var servedSeconds = 0.0, refreshRoundDoneSeconds = 0.0, stoppedSeconds = 0.0, stopMarginSeconds = 0.0
}

/// Three engines, each on its own repository (its own pool and change feed, as three hosts),
/// one provider counting fetches. All run, track the same keys and ask for every key at once.
///
/// Lifetimes: a token is refreshed at its soft point, 0.75–0.8 of its lifetime L after its `iat`
/// (the default 0.8 less up to 5 % jitter; `iat` is whole seconds, so up to 1 s before the
/// fetch), so one engine alone fetches each key at 0, ~0.8 L, ~1.6 L, …: after 1.9 L it would
/// have fetched three times, not two. The window therefore ends once every key has begun its
/// second lifetime (the first refresh round; see `FetchLog`), plus a settling tenth of a lifetime
/// for stragglers, and in any case half a second before the earliest moment any key's third could
/// begin (its second's beginning + 0.75 L − 1 s). In that window one engine alone makes exactly
/// two fetches per key: two lifetimes observed per key, and the figure is total fetches / (keys
/// × 2). The lifetimes are counted per key from the fetch times (`FetchLog`), so a key fetched
/// twice in one lifetime adds a fetch and no lifetime: the figure exceeds 1.00, and those fetches
/// (before the soft point of the token in hand) are counted beside it,
/// `fetches_before_soft_point`. When the refresh round does not complete in that window (a busy
/// machine), the keys' lifetimes differ, the figure is still fetches over lifetimes observed, and
/// `window_complete` says so. L is 20 s by default: the first answers to 3,000 callers took up to
/// 5 s on a busy machine, and the window between the last key's first refresh and the first
/// key's second is about 0.7 L − 2 s less that.
func measureReplicas() async throws -> ReplicaFigures {
    let keys = vehicleKeys(keyCount, prefix: "replica-")
    let delay = fetchDelay, tokenLifetime = lifetime
    // The earliest soft point of a token fetched at f: f + 0.75 L − 1 s (iat is whole seconds).
    let softPoint = Duration.seconds(0.75 * tokenLifetime - 1)
    let log = FetchLog(softPoint: softPoint)
    let provider = ScriptedFetcher { key, _ in
        log.note(key)
        if delay > .zero { try? await Task.sleep(for: delay) }
        return FetchedToken(value: TestJWT.make(for: key, issuedAt: Date(), lifetime: tokenLifetime))
    }
    let fetchers = (0..<3).map { _ in ReplicaFetcher(shared: provider) }
    let configuration = try storeConfiguration(schema: replicaSchema)
    return try await PostgresTokenRepository.withRepository(configuration, logger: quietLogger) { first in
        try await PostgresTokenRepository.withRepository(configuration, logger: quietLogger) { second in
            try await PostgresTokenRepository.withRepository(configuration, logger: quietLogger) { third in
                let engines = zip([first, second, third], fetchers).map { repository, fetcher in
                    TokenSyncEngine(repository: repository, fetcher: fetcher, logger: quietLogger)
                }
                return try await withThrowingTaskGroup(of: Void.self, returning: ReplicaFigures.self) { group in
                    for engine in engines { group.addTask { try await engine.run() } }
                    var figures = ReplicaFigures()
                    let start = ContinuousClock.now
                    figures.callerFailures = await withTaskGroup(of: Int.self, returning: Int.self) { callers in
                        for engine in engines {
                            callers.addTask {
                                await engine.track(keys)
                                return 0
                            }
                            for key in keys {
                                callers.addTask {
                                    do {
                                        _ = try await engine.token(for: key)
                                        return 0
                                    } catch {
                                        return 1
                                    }
                                }
                            }
                        }
                        return await callers.reduce(0, +)
                    }
                    figures.servedSeconds = seconds(ContinuousClock.now - start)
                    // Until every key has begun its second lifetime, then a settling tenth of a
                    // lifetime; always half a second before the earliest moment any key's third
                    // could begin (see above).
                    while log.fewestLifetimes(of: keys) < 2 {
                        guard ContinuousClock.now < log.earliestThirdLifetime(of: keys) - .milliseconds(500) else {
                            figures.windowComplete = false
                            FileHandle.standardError.write(Data(("token-store-postgres-measurements: the refresh round did not "
                                + "complete before any key's next refresh could be due (after \(seconds(ContinuousClock.now - start)) s): "
                                + "lifetimes observed differ between keys; the machine is too busy, or use a longer --lifetime\n").utf8))
                            break
                        }
                        try await Task.sleep(for: .milliseconds(50))
                    }
                    figures.refreshRoundDoneSeconds = seconds(ContinuousClock.now - start)
                    let stopBy = log.earliestThirdLifetime(of: keys) - .milliseconds(500)
                    figures.stopMarginSeconds = seconds(stopBy - ContinuousClock.now)
                    if figures.windowComplete {
                        let settled = min(ContinuousClock.now + .seconds(0.1 * tokenLifetime), stopBy)
                        if settled > ContinuousClock.now { try await Task.sleep(until: settled, clock: .continuous) }
                    }
                    figures.stoppedSeconds = seconds(ContinuousClock.now - start)
                    let times = log.snapshot
                    figures.perEngine = fetchers.map(\.count)
                    group.cancelAll()
                    try await group.waitForAll()
                    figures.totalAfterShutdown = provider.total
                    for key in keys {
                        let fetched = times[key] ?? [], lifetimes = log.lifetimes(fetched).count
                        figures.total += fetched.count
                        figures.lifetimes += lifetimes
                        figures.perKeyCounts[fetched.count, default: 0] += 1
                        figures.perKeyLifetimes[lifetimes, default: 0] += 1
                        figures.fetchesBeforeSoftPoint += fetched.count - lifetimes
                    }
                    return figures
                }
            }
        }
    }
}

func seconds(_ duration: Duration) -> Double { round3(nanoseconds(duration) / 1e9) }

// MARK: - The run

struct Figures: Sendable {
    var persist: PersistFigures?
    var batch: BatchFigures?
    var replicas: ReplicaFigures?
    var server: [String: String] = [:]
}

// Off the main actor, as the engine's group commit and a server's tasks are (a main-actor caller
// would hop to the cooperative pool and back on every write).
let figures = try await Task.detached { () async throws -> Figures in
    let storeSettings = try storeConfiguration(schema: repositorySchema)
    let rawSettings = try storeConfiguration(schema: rawSchema)
    let raw = PostgresClient(configuration: rawClientConfiguration(rawSettings), backgroundLogger: quietLogger)
    return try await withThrowingTaskGroup(of: Void.self, returning: Figures.self) { group in
        group.addTask { await raw.run() }
        defer { group.cancelAll() }
        var figures = Figures()
        for setting in ["server_version", "fsync", "synchronous_commit", "wal_sync_method", "shared_buffers"] {
            for try await value in try await raw.query(PostgresQuery(unsafeSQL: "SHOW \(setting)"), logger: quietLogger).decode(String.self) {
                figures.server[setting] = value
            }
        }
        // Empty tables every run: the benchmark's own schemas only.
        try await raw.query("DROP SCHEMA IF EXISTS fleet_bench_repository, raw_baseline, fleet_bench_replicas CASCADE", logger: quietLogger)
        if only == nil || only == "persist" || only == "batch" {
            // The raw side's tables: the repository's own migrations, in the schema raw_baseline.
            try await PostgresTokenRepository.withRepository(rawSettings, logger: quietLogger) { _ in }
            try await PostgresTokenRepository.withRepository(storeSettings, logger: quietLogger) { store in
                try await checkIdenticalSQL(store, raw)
                if only == nil || only == "persist" {
                    figures.persist = try await measurePersist(store, raw, statementTimeout: storeSettings.statementTimeout)
                }
                if only == nil || only == "batch" { figures.batch = try await measureBatch(store, raw) }
            }
        }
        if only == nil || only == "replicas" { figures.replicas = try await measureReplicas() }
        return figures
    }
}.value

var output: [String: Any] = ["server": figures.server]
if let persist = figures.persist {
    output["pg_persist_vs_raw_postgres_nio"] = persist.pair.ratio
    output["pg_persist_ratio_p25_p75"] = persist.pair.ratioQuartiles
    output["pg_persist_p50_us"] = persist.pair.measuredMedian
    output["pg_persist_raw_p50_us"] = persist.pair.baselineMedian
    output["pg_persist_raw_in_deadline_group_vs_raw"] = persist.deadline.ratio
    output["pg_persist_raw_in_deadline_group_p50_us"] = persist.deadline.measuredMedian
    output["pg_persist_rounds"] = rounds
    output["pg_persist_writes_per_block"] = writes
}
if let batch = figures.batch {
    output["pg_batch_vs_raw_transaction"] = batch.pair.ratio
    output["pg_batch_ratio_p25_p75"] = batch.pair.ratioQuartiles
    output["pg_batch_1000_p50_us"] = batch.pair.measuredMedian
    output["pg_batch_1000_raw_p50_us"] = batch.pair.baselineMedian
    output["pg_batch_vs_raw_unnest_statement"] = batch.unnest.ratio
    output["pg_batch_1000_raw_unnest_p50_us"] = batch.unnest.baselineMedian
    output["pg_batch_rounds"] = batchRounds
}
if let replicas = figures.replicas {
    // Fetches per key per lifetime: never below 1 (every lifetime begins with a fetch), above 1
    // by every fetch before the soft point of the token in hand.
    output["pg_fetches_3_replicas_1000_keys"] = round3(Double(replicas.total) / Double(max(1, replicas.lifetimes)))
    output["pg_replica_fetches"] = replicas.total
    output["pg_replica_fetches_after_shutdown"] = replicas.totalAfterShutdown
    output["pg_replica_fetches_by_engine"] = replicas.perEngine
    output["pg_replica_keys"] = keyCount
    output["pg_replica_lifetimes_observed"] = replicas.lifetimes
    output["pg_replica_window_complete"] = replicas.windowComplete
    output["pg_replica_keys_by_fetch_count"] = Dictionary(uniqueKeysWithValues: replicas.perKeyCounts.map { (String($0.key), $0.value) })
    output["pg_replica_keys_by_lifetimes_observed"] = Dictionary(uniqueKeysWithValues: replicas.perKeyLifetimes.map { (String($0.key), $0.value) })
    output["pg_replica_fetches_before_soft_point"] = replicas.fetchesBeforeSoftPoint
    output["pg_replica_caller_failures"] = replicas.callerFailures
    output["pg_replica_token_lifetime_seconds"] = lifetime
    output["pg_replica_fetch_delay_ms"] = Int(nanoseconds(fetchDelay) / 1e6)
    output["pg_replica_seconds"] = ["all_served": replicas.servedSeconds, "refresh_round_done": replicas.refreshRoundDoneSeconds,
                                    "stopped": replicas.stoppedSeconds,
                                    "margin_to_earliest_next_refresh_at_round_end": replicas.stopMarginSeconds]
}
let json = try JSONSerialization.data(withJSONObject: output, options: [.sortedKeys])
print(String(decoding: json, as: UTF8.self))
