import FleetTokenStore
import Foundation
import GRDBSQLite
import Logging
import Synchronization

/// A realistic Fleet Engine JWT: RS256 header with kid, the service-account claims, a 256-byte
/// signature; about 900 bytes.
public func realisticJWT(for key: TokenKey, issuedAt: Date, lifetime: TimeInterval = 3600) -> String {
    let encode = { (data: Data) in
        data.base64EncodedString().replacingOccurrences(of: "+", with: "-").replacingOccurrences(of: "/", with: "_")
            .replacingOccurrences(of: "=", with: "")
    }
    let header = #"{"alg":"RS256","typ":"JWT","kid":"4d1f2a0b9c8e7d6f5a4b3c2d1e0f9a8b7c6d5e4f"}"#
    let account = "fleet-engine-consumer@my-fleet-project-123456.iam.gserviceaccount.com"
    let iat = Int(issuedAt.timeIntervalSince1970)
    let payload = #"{"iss":"\#(account)","sub":"\#(account)","aud":"https://fleetengine.googleapis.com/","iat":\#(iat),"exp":\#(iat + Int(lifetime)),"authorization":{"\#(key.kind.authorizationClaim)":"\#(key.subjectID)"}}"#
    var signature = [UInt8](repeating: 0, count: 256)
    for index in signature.indices { signature[index] = UInt8.random(in: 0...255) }
    return [Data(header.utf8), Data(payload.utf8), Data(signature)].map(encode).joined(separator: ".")
}

/// A fresh directory under the temporary directory.
public func scratchDirectory(_ label: String) -> String {
    let path = FileManager.default.temporaryDirectory.appendingPathComponent("fts-bench-\(label)-\(UUID().uuidString.prefix(8))").path
    try! FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: true)
    return path
}

public let quietLogger: Logger = {
    var logger = Logger(label: "bench")
    logger.logLevel = .error
    return logger
}()

/// Vehicle keys `v0`…`v(n-1)`.
public func vehicleKeys(_ count: Int, prefix: String = "v") -> [TokenKey] {
    (0..<count).map { try! TokenKey.vehicle("\(prefix)\($0)") }
}

/// Fills a store with `count` tokens (fresh unless `expired`), in batches of 5,000. Given an
/// ``EncryptedTokenRepository``, the rows are stored sealed.
public func seed(_ store: any TokenRepository, keys: [TokenKey], now: Date = Date(), expired: Bool = false) async throws {
    let issuedAt = expired ? now.addingTimeInterval(-7200) : now
    let template = realisticJWT(for: keys.first ?? (try! .vehicle("x")), issuedAt: issuedAt)
    var start = 0
    while start < keys.count {
        let chunk = keys[start..<min(start + 5000, keys.count)]
        try await store.upsert(chunk.map {
            // The same signature for speed; values differ by subject.
            StoredToken(key: $0, value: template + $0.subjectID, expiresAt: issuedAt.addingTimeInterval(3600),
                        issuedAt: issuedAt, fetchedAt: issuedAt)
        })
        start += chunk.count
    }
}

/// A fetcher that mints realistic tokens in process and counts calls.
public final class MintingFetcher: TokenFetcher, Sendable {
    private let calls = Mutex(0)
    private let delay: Duration

    public init(delay: Duration = .zero) {
        self.delay = delay
    }

    public var count: Int { calls.withLock { $0 } }

    public func fetchToken(for key: TokenKey) async throws(TokenProviderError) -> FetchedToken {
        calls.withLock { $0 += 1 }
        if delay > .zero { try? await Task.sleep(for: delay) }
        return FetchedToken(value: realisticJWT(for: key, issuedAt: Date()))
    }
}

/// The raw SQLite baseline: the same file, schema and pragmas as the store, prepared statements
/// through the C API.
// @unchecked: one benchmark uses it at a time, from one task; SQLite itself is in serialized mode.
public final class RawSQLite: @unchecked Sendable {
    public let handle: OpaquePointer
    private var upsert: OpaquePointer?

    public init(path: String) {
        var db: OpaquePointer?
        precondition(sqlite3_open_v2(path, &db, SQLITE_OPEN_READWRITE, nil) == SQLITE_OK)
        handle = db!
        exec("PRAGMA journal_mode = WAL; PRAGMA synchronous = NORMAL; PRAGMA busy_timeout = 5000;")
        let sql = """
            INSERT INTO tokens (kind, subject_id, token, expires_at, issued_at, fetched_at, last_used_at)
            VALUES (?, ?, ?, ?, ?, ?, ?)
            ON CONFLICT (kind, subject_id) DO UPDATE SET
              token = excluded.token, expires_at = excluded.expires_at, issued_at = excluded.issued_at,
              fetched_at = excluded.fetched_at, last_used_at = coalesce(excluded.last_used_at, tokens.last_used_at),
              failure_count = 0, next_attempt_at = NULL, last_error_kind = NULL, last_error_message = NULL, last_failure_at = NULL, failure_config_digest = NULL
            WHERE tokens.token IS NULL OR excluded.expires_at >= tokens.expires_at
            """
        precondition(sqlite3_prepare_v2(handle, sql, -1, &upsert, nil) == SQLITE_OK)
    }

    deinit {
        for statement in transactionShape { sqlite3_finalize(statement) }
        sqlite3_finalize(upsert)
        sqlite3_close_v2(handle)
    }

    public func exec(_ sql: String) {
        precondition(sqlite3_exec(handle, sql, nil, nil, nil) == SQLITE_OK, String(cString: sqlite3_errmsg(handle)))
    }

    private static let transient = unsafeBitCast(-1, to: sqlite3_destructor_type.self)

    /// One upsert, autocommitted.
    public func upsert(_ token: StoredToken) {
        sqlite3_reset(upsert)
        sqlite3_bind_text(upsert, 1, token.key.kind.rawValue, -1, Self.transient)
        sqlite3_bind_text(upsert, 2, token.key.subjectID, -1, Self.transient)
        sqlite3_bind_text(upsert, 3, token.value, -1, Self.transient)
        sqlite3_bind_double(upsert, 4, token.expiresAt.timeIntervalSince1970)
        sqlite3_bind_double(upsert, 5, token.issuedAt?.timeIntervalSince1970 ?? 0)
        sqlite3_bind_double(upsert, 6, token.fetchedAt.timeIntervalSince1970)
        sqlite3_bind_null(upsert, 7)
        precondition(sqlite3_step(upsert) == SQLITE_DONE, String(cString: sqlite3_errmsg(handle)))
    }

    /// One upsert in the repository's transaction shape (BEGIN IMMEDIATE, the change log's
    /// sequence read before and after, COMMIT), all prepared: the SQLite work the repository
    /// cannot avoid, for telling it apart from the Swift around it when profiling.
    public func upsertInTransactionShape(_ token: StoredToken) {
        if transactionShape.isEmpty {
            for sql in ["BEGIN IMMEDIATE", "SELECT seq FROM sqlite_sequence WHERE name = 'token_changes'", "COMMIT"] {
                var statement: OpaquePointer?
                precondition(sqlite3_prepare_v2(handle, sql, -1, &statement, nil) == SQLITE_OK)
                transactionShape.append(statement)
            }
        }
        func step(_ statement: OpaquePointer?) {
            sqlite3_reset(statement)
            let code = sqlite3_step(statement)
            precondition(code == SQLITE_DONE || code == SQLITE_ROW, String(cString: sqlite3_errmsg(handle)))
            sqlite3_reset(statement)
        }
        step(transactionShape[0])
        step(transactionShape[1])
        upsert(token)
        step(transactionShape[1])
        step(transactionShape[2])
    }
    private var transactionShape: [OpaquePointer?] = []

    /// Many upserts in one transaction.
    public func upsert(_ tokens: [StoredToken]) {
        exec("BEGIN IMMEDIATE")
        for token in tokens { upsert(token) }
        exec("COMMIT")
    }

    /// `DELETE ... WHERE expires_at < ?`, returning the count.
    public func deleteExpired(before date: Date) -> Int {
        var statement: OpaquePointer?
        precondition(sqlite3_prepare_v2(handle, "DELETE FROM tokens WHERE expires_at < ?", -1, &statement, nil) == SQLITE_OK)
        defer { sqlite3_finalize(statement) }
        sqlite3_bind_double(statement, 1, date.timeIntervalSince1970)
        precondition(sqlite3_step(statement) == SQLITE_DONE)
        return Int(sqlite3_changes(handle))
    }
}

/// A store file, a repository and an engine holding fresh tokens for `key` and 1,000 other keys,
/// beside the hit baseline: a locked dictionary of token strings as large, the seed samples'
/// approach. Shared by the package-benchmark pair and `token-store-hit-pair`. With `encrypted`
/// (the default) the engine sits on an ``EncryptedTokenRepository`` over the store, prepared
/// with ``benchmarkKeyring`` as an agent given a key file prepares it, so every token it holds
/// was sealed on its way to the file.
public final class HitFixture: Sendable {
    public let engine: TokenSyncEngine
    public let key = try! TokenKey.vehicle("hot-vehicle")
    public let store: SQLiteTokenRepository
    public let dictionary: Mutex<[TokenKey: String]>

    public init(encrypted: Bool = true) async throws {
        store = try SQLiteTokenRepository(path: scratchDirectory("hit") + "/tokens.sqlite", logger: quietLogger)
        if encrypted {
            try await TokenValueResealer(store: store, logger: quietLogger).prepare(keyring: benchmarkKeyring)
            engine = BenchmarkSupport.engine(on: EncryptedTokenRepository(base: store, keyring: benchmarkKeyring, logger: quietLogger),
                                             over: store, fetcher: MintingFetcher())
        } else {
            engine = TokenSyncEngine(repository: store, fetcher: MintingFetcher(), logger: quietLogger)
        }
        let token = try await engine.token(for: key)
        precondition(!token.value.hasPrefix(SealedTokenValue.prefix), "the engine handed out a sealed value")
        var map: [TokenKey: String] = [key: token.value]
        for other in vehicleKeys(1000) { map[other] = token.value }
        dictionary = Mutex(map)
        for other in vehicleKeys(1000) { _ = try await engine.token(for: other) }
    }
}
