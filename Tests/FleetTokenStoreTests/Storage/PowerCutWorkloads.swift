// The workloads the power is cut under besides the engine's refreshes (issue 30 item 1):
// `tokenctl purge --expired` on a second connection beside the engine, a schema migration of
// an old store, `tokenctl rekey` of an encrypted store, and the engine's retention sweep of
// finished trips. Each says what it promised; PowerCutCampaign checks the rest.

import FleetTokenMigrations
import FleetTokenStoreTesting
import Foundation
import GRDB
import TestSupportKit
@testable import FleetTokenStore

/// `tokenctl purge --expired` (``TokenStoreAdmin/purge(_:scope:)`` on an `adminReadWrite`
/// connection of its own) while the engine refreshes every key it tracks, in two sessions
/// (open, refresh, purge, close), so a cut in the second tests what the first promised.
struct PurgeBesideEngineWorkload: PowerCutWorkload {
    static let tracked = (0..<6).map { try! TokenKey.vehicle("truck-\($0)") }
    /// Finished trips expired before the first session's purge; those expired before the second's.
    static let expired = ["a", "b"].map { group in (0..<40).map { try! TokenKey.trip(String(format: "done-\(group)-%03d", $0)) } }

    struct Promise: Sendable {
        /// Tokens committed before the engine's store last closed cleanly.
        var tokens: [TokenKey: Date] = [:]
        /// Per session: the purge returned and its connection closed cleanly before the cut.
        var purged = [false, false]
    }

    private let directory: Scratch
    let template: String

    init() async throws {
        directory = Scratch()
        template = directory.file("tokens.sqlite")
        let store = try openStore(template, logger: powerCutLogger)
        // Expired ten minutes before the first purge (at +3000 s), and 300 s after it; well
        // inside the retention period, so the engine's sweep leaves them to the purge.
        try await store.upsert(Self.expired[0].map { token($0, expiresIn: -600) } + Self.expired[1].map { token($0, expiresIn: 3300) },
                               clearFailure: true)
        store.close()
    }

    func run(path: String) async throws -> (Promise, stalls: [String]) {
        var promise = Promise()
        var stalls: [String] = []
        let time = TestTime()
        var seen: [TokenKey: Date] = [:]
        for session in 0..<2 {
            let ran = try await engineSession(path, time: time, tracked: Self.tracked) { store, engine -> Bool in
                if session == 0 {
                    if let first = await committedNewer(store, Self.tracked, than: [:]) { seen = first } else { stalls.append("session 0: no first tokens") }
                }
                // Past every key's soft point: the engine refreshes them all while the purge runs.
                await settledOrCut(engine)
                await time.advance(by: 3000)
                let purgedAt = time.now
                let purge = Task { () -> Bool in
                    do {
                        let admin = try openStore(path, mode: .adminReadWrite, configure: { $0.integrityCheck = .never }, logger: powerCutLogger)
                        let purged = try? await admin.purge(TokenFilter(validity: .expired(asOf: purgedAt)), scope: .tokens)
                        // Closed whatever happened: a connection left open past the cut would keep
                        // the pre-cut wal-index (-shm) alive for the checks, which no real cut does.
                        admin.close()
                        return purged == Self.expired[session].count && !powerIsCut
                    } catch {
                        return false
                    }
                }
                let refreshed = await committedNewer(store, Self.tracked, than: seen)
                if refreshed == nil && !powerIsCut { stalls.append("session \(session): no refreshed tokens") }
                seen = refreshed ?? seen
                let purged = await purge.value
                if !purged && !powerIsCut { stalls.append("session \(session): the purge did not remove its \(Self.expired[session].count) expired tokens") }
                return purged
            }
            guard let purged = ran, !powerIsCut else { break }
            promise.tokens = seen
            promise.purged[session] = purged
        }
        return (promise, stalls)
    }

    func check(_ store: SQLiteTokenRepository, promise: Promise) async throws -> [String] {
        var findings = try await lostTokens(store, promised: promise.tokens)
        let trips = Set(try await store.list(TokenFilter(kind: .trip), page: .everything).map(\.key))
        for (session, group) in Self.expired.enumerated() {
            // One transaction: all of a purge's expired tokens or none of them.
            let left = group.filter(trips.contains).count
            if left != 0 && left != group.count { findings.append("session \(session)'s purge is half applied: \(left) of \(group.count) left") }
            if promise.purged[session] && left != 0 { findings.append("\(left) tokens purged in session \(session) came back after the purge returned and closed") }
        }
        return findings
    }
}

/// Opening a store made by the first schema (V0001): this build migrates it (one transaction
/// per migration) and writes a token under the new schema, then closes; a second session
/// opens it again and writes another.
struct MigrationWorkload: PowerCutWorkload {
    static let old = (0..<300).map { try! TokenKey.vehicle(String(format: "old-%03d", $0)) }
    static let written = (0..<2).map { try! TokenKey.vehicle("written-in-session-\($0)") }

    struct Promise: Sendable {
        /// Per session: the store closed cleanly before the cut (after the first, migrated).
        var closed = [false, false]
        var migrated: Bool { closed[0] }
    }

    private let directory: Scratch
    let template: String
    /// What `sqlite_master` holds at each schema version, from the migrations alone.
    private let schemas: [Int: [String]]
    private let identifiers = EmbeddedMigrations.all.map(\.identifier).sorted()

    init() async throws {
        directory = Scratch()
        template = directory.file("tokens.sqlite")
        // As a build of the first schema left it (see Fixtures/README.md), with enough rows
        // that the migrations' indexes write many pages.
        let queue = try DatabaseQueue(path: template)
        try await queue.writeWithoutTransaction { db in
            try db.execute(sql: "PRAGMA journal_mode = WAL")
            try db.inTransaction {
                try SchemaMigrator(migrations: EmbeddedMigrations.all.filter { $0.version == 1 }).migrate(queue: db)
                for key in Self.old {
                    let stored = token(key, expiresIn: 1800)
                    try db.execute(sql: "INSERT INTO tokens (kind, subject_id, token, expires_at, issued_at, fetched_at) VALUES (?, ?, ?, ?, ?, ?)",
                                   arguments: [key.kind.rawValue, key.subjectID, stored.value, stored.expiresAt.timeIntervalSince1970,
                                               stored.issuedAt?.timeIntervalSince1970, stored.fetchedAt.timeIntervalSince1970])
                }
                return .commit
            }
            try db.checkpoint(.truncate)
        }
        try queue.close()
        var schemas: [Int: [String]] = [:]
        for version in 1...EmbeddedMigrations.latestVersion {
            let reference = directory.file("v\(version).sqlite")
            try FileManager.default.copyItem(atPath: template, toPath: reference)
            let queue = try DatabaseQueue(path: reference)
            try SchemaMigrator(migrations: EmbeddedMigrations.all.filter { $0.version <= version }).migrate(queue)
            schemas[version] = try await queue.read(Self.schema)
            try queue.close()
        }
        self.schemas = schemas
    }

    /// Every schema object but SQLite's own, with its SQL.
    static func schema(_ db: Database) throws -> [String] {
        try String.fetchAll(db, sql: "SELECT type || ' ' || name || ': ' || coalesce(sql, '') FROM sqlite_master WHERE name NOT LIKE 'sqlite_%' ORDER BY type, name")
    }

    func run(path: String) async throws -> (Promise, stalls: [String]) {
        var promise = Promise()
        for session in 0..<2 {
            do {
                let store = try openStore(path, configure: { $0.integrityCheck = .never }, logger: powerCutLogger)
                do {
                    try await store.upsert(token(Self.written[session], expiresIn: 600))
                } catch {
                    // Closed whatever happens (see PurgeBesideEngineWorkload.run).
                    store.close()
                    throw error
                }
                store.close()
            } catch where powerIsCut {
                break
            }
            if powerIsCut { break }
            promise.closed[session] = true
        }
        return (promise, [])
    }

    func checkRaw(_ db: Database, promise: Promise) throws -> [String] {
        // Never between versions: the recorded migrations are the first k, and the schema is
        // exactly what those k make (no migration half applied).
        let applied = try SchemaMigrator.appliedIdentifiers(db).sorted()
        guard !applied.isEmpty, applied == Array(identifiers.prefix(applied.count)) else {
            return ["recorded migrations \(applied), not a prefix of \(identifiers)"]
        }
        var findings: [String] = []
        let version = applied.count
        let schema = try Self.schema(db)
        if schema != schemas[version] {
            findings.append("schema at version \(version) is not that version's: \(Set(schema).symmetricDifference(schemas[version] ?? []).sorted().prefix(3))")
        }
        if promise.migrated && version != EmbeddedMigrations.latestVersion {
            findings.append("back at version \(version) after a migration that closed cleanly")
        }
        return findings
    }

    func check(_ store: SQLiteTokenRepository, promise: Promise) async throws -> [String] {
        let entries = try await store.entries(for: Self.old)
        let lost = Self.old.filter { entries[$0]?.token?.value != token($0, expiresIn: 1800).value }
        var findings = lost.isEmpty ? [] : ["\(lost.count) tokens of the old store lost or changed, first \(lost[0])"]
        for (session, key) in Self.written.enumerated() where promise.closed[session] {
            if try await store.entry(for: key)?.token == nil {
                findings.append("the token written in session \(session) is lost although the store closed cleanly")
            }
        }
        return findings
    }
}

extension SchemaMigrator {
    /// Applies the migrations inside the caller's transaction (building a template store).
    func migrate(queue db: Database) throws {
        try db.execute(sql: "CREATE TABLE IF NOT EXISTS grdb_migrations (identifier TEXT NOT NULL PRIMARY KEY)")
        for migration in migrations {
            try db.execute(sql: migration.sql)
            try db.execute(sql: "INSERT INTO grdb_migrations (identifier) VALUES (?)", arguments: [migration.identifier])
        }
    }
}

/// `tokenctl rekey` (``TokenValueResealer/rekey(_:)`` on an `adminReadWrite` connection) of a
/// store whose values are sealed with the old key, some still plaintext from before encryption
/// (so the rekey also VACUUMs), under a keyring of the new key then the old one; then, the old
/// key dropped, a second rekey to a third key.
struct RekeyWorkload: PowerCutWorkload {
    static let sealed = (0..<200).map { try! TokenKey.vehicle(String(format: "sealed-%03d", $0)) }
    static let plain = (0..<20).map { try! TokenKey.trip(String(format: "plain-%02d", $0)) }
    static var all: [TokenKey] { sealed + plain }

    struct Promise: Sendable {
        /// Per rekey: it returned, every value resealed, and its connection closed before the
        /// cut: the operator may now drop the key it rekeyed from.
        var completed = [false, false]
    }

    private let directory: Scratch
    let template: String
    let oldKey = TokenEncryptionKey.random()
    let newKey = TokenEncryptionKey.random()
    let thirdKey = TokenEncryptionKey.random()
    /// Each rekey's keyring: the key to seal with first, then the one the values are under.
    var keyrings: [TokenKeyring] { [TokenKeyring(primary: newKey, others: [oldKey]), TokenKeyring(primary: thirdKey, others: [newKey])] }

    static func stored(_ key: TokenKey) -> StoredToken { token(key, expiresIn: 1800, value: jwtLike(key)) }

    init() async throws {
        directory = Scratch()
        template = directory.file("tokens.sqlite")
        let store = try openStore(template, logger: powerCutLogger)
        try await EncryptedTokenRepository(base: store, keyring: TokenKeyring(primary: oldKey), logger: powerCutLogger)
            .upsert(Self.sealed.map(Self.stored))
        try await store.upsert(Self.plain.map(Self.stored))
        store.close()
    }

    func run(path: String) async throws -> (Promise, stalls: [String]) {
        var promise = Promise()
        var stalls: [String] = []
        for (session, keyring) in keyrings.enumerated() {
            do {
                let admin = try openStore(path, mode: .adminReadWrite, configure: { $0.integrityCheck = .never }, logger: powerCutLogger)
                let report: TokenValueResealer.Report
                do {
                    report = try await TokenValueResealer(store: admin, logger: powerCutLogger, batchSize: 50).rekey(keyring)
                } catch {
                    // Closed whatever happens (see PurgeBesideEngineWorkload.run).
                    admin.close()
                    throw error
                }
                admin.close()
                if powerIsCut { break }
                guard report.resealedTotal == Self.all.count else {
                    stalls.append("rekey \(session) resealed \(report.resealedTotal) of \(Self.all.count)")
                    break
                }
                promise.completed[session] = true
            } catch where powerIsCut {
                break
            }
        }
        return (promise, stalls)
    }

    func check(_ store: SQLiteTokenRepository, promise: Promise) async throws -> [String] {
        let entries = try await store.entries(for: Self.all)
        // Every key ever used opens every value; once a rekey completed, its keyring without the
        // key it rekeyed from does, and once both did, the third key alone.
        let every = TokenKeyring(primary: thirdKey, others: [newKey, oldKey])
        let after = [TokenKeyring(primary: thirdKey, others: [newKey]), TokenKeyring(primary: thirdKey)]
        // A plaintext value is whole only while no rekey has completed (each seals them all).
        func opens(_ key: TokenKey, with keyring: TokenKeyring, plaintext: Bool) -> Bool {
            guard let value = entries[key]?.token?.value else { return false }
            switch SealedTokenValue.open(value, for: key, with: keyring) {
            case .opened(let plain, _): return plain == jwtLike(key)
            case .plaintext(let plain): return plaintext && plain == jwtLike(key)
            case .missingKey, .failed: return false
            }
        }
        var findings: [String] = []
        let lost = Self.all.filter { !opens($0, with: every, plaintext: true) }
        if !lost.isEmpty { findings.append("\(lost.count) tokens lost or not opening with any key, first \(lost[0])") }
        for (session, keyring) in after.enumerated() where promise.completed[session] {
            let stuck = Self.all.filter { !opens($0, with: keyring, plaintext: false) }
            if !stuck.isEmpty { findings.append("\(stuck.count) tokens need a dropped key after rekey \(session) returned and closed, first \(stuck[0])") }
        }
        return findings
    }
}

/// The engine's retention sweep deleting finished trips (dead two days, past the 24 h period),
/// 500 rows a transaction, beside the tokens of the keys it tracks.
struct RetentionWorkload: PowerCutWorkload {
    static let tracked = (0..<6).map { try! TokenKey.vehicle("truck-\($0)") }
    static let trips = (0..<1_200).map { try! TokenKey.trip(String(format: "trip-%04d", $0)) }

    struct Promise: Sendable {
        /// The sweep deleted every trip and the store closed cleanly before the cut.
        var completed = false
        /// The tracked keys' tokens committed before the store last closed cleanly (the
        /// template's, then the second session's refreshes).
        var tokens = Dictionary(uniqueKeysWithValues: RetentionWorkload.tracked.map { ($0, token($0, expiresIn: 3600).expiresAt) })
    }

    private let directory: Scratch
    let template: String

    init() async throws {
        directory = Scratch()
        template = directory.file("tokens.sqlite")
        let store = try openStore(template, logger: powerCutLogger)
        try await store.upsert(Self.tracked.map { token($0, expiresIn: 3600) } + Self.trips.map { token($0, expiresIn: -2 * 86_400) },
                               clearFailure: true)
        store.close()
    }

    /// Session 0 sweeps; session 1 refreshes the tracked keys past their soft point.
    func run(path: String) async throws -> (Promise, stalls: [String]) {
        var promise = Promise()
        var stalls: [String] = []
        let time = TestTime()
        for session in 0..<2 {
            let ran = try await engineSession(path, time: time, tracked: Self.tracked) { store, engine -> [TokenKey: Date]? in
                var refreshed: [TokenKey: Date]?
                if session == 0 {
                    // The sweep runs a few seconds of engine time after start; the clock moves a second a poll.
                    let swept = await eventually(within: 30) {
                        if powerIsCut { return true }
                        await time.advance(by: 1)
                        return (try? await store.count(TokenFilter(kind: .trip))) == 0
                    }
                    if !swept { stalls.append("session 0: the sweep did not delete the finished trips") }
                } else {
                    await settledOrCut(engine)
                    await time.advance(by: 3000)
                    refreshed = await committedNewer(store, Self.tracked, than: promise.tokens)
                    if refreshed == nil && !powerIsCut { stalls.append("session 1: no refreshed tokens") }
                }
                return refreshed
            }
            guard let refreshed = ran, !powerIsCut, stalls.isEmpty else { break }
            if session == 0 { promise.completed = true }
            promise.tokens = refreshed ?? promise.tokens
        }
        return (promise, stalls)
    }

    func check(_ store: SQLiteTokenRepository, promise: Promise) async throws -> [String] {
        // The tracked tokens were durable before the round began.
        var findings = try await lostTokens(store, promised: promise.tokens)
        let left = try await store.list(TokenFilter(kind: .trip), page: .everything).map(\.key)
        // Batches of whole transactions in key order: what is left is the trips after a batch boundary.
        let deleted = Self.trips.count - left.count
        if left != Array(Self.trips.suffix(left.count)) || (left.count > 0 && deleted % RetentionSweeper.batch != 0) {
            findings.append("the sweep is half applied: \(deleted) trips deleted, not whole batches of \(RetentionSweeper.batch) in key order")
        }
        if promise.completed && !left.isEmpty { findings.append("\(left.count) swept trips came back after the store closed cleanly") }
        return findings
    }
}

/// Opens the store at `path` and runs an engine on it (on `time`, tracking `tracked`) for the
/// length of `body`, then stops the engine and closes the store: one session of a workload.
/// Nil when the store could not be opened because the power is cut.
func engineSession<T>(_ path: String, time: TestTime, tracked: [TokenKey],
                      _ body: (SQLiteTokenRepository, TokenSyncEngine) async -> T) async throws -> T? {
    let store: SQLiteTokenRepository
    do {
        store = try openStore(path, configure: { $0.integrityCheck = .never }, logger: powerCutLogger)
    } catch where powerIsCut { return nil }
    let engine = TokenSyncEngine(repository: store, fetcher: ScriptedFetcher.minting(time), logger: powerCutLogger,
                                 clock: time.clock, now: time.wall, random: { 0.5 })
    let running = Task { try await engine.run() }
    await engine.track(tracked)
    let result = await body(store, engine)
    running.cancel()
    _ = try? await running.value
    store.close()
    return result
}
