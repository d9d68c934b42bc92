// FleetTokenPostgres: PostgresTokenRepository, the token store on a PostgreSQL database that
// replicas on several hosts share: the engine's repository, the refresh leases and tokenctl's
// administration, over a postgres-nio client whose run() is a child task of withRepository.
public import FleetTokenStore
public import Foundation
public import Logging
import PostgresNIO
import Synchronization

/// The token store on PostgreSQL, for replicas of an agent on several hosts that share one
/// database: each key is fetched once per token lifetime across all of them, and a purge or a
/// refresh on one host is seen by the others within a second (LISTEN/NOTIFY).
///
/// Open it with ``withRepository(_:mode:logger:_:)``, which runs the connection pool for the
/// length of the closure (structured: nothing outlives it). Inside, hand the repository to a
/// `TokenSyncEngine` as its repository and lease store; its `run()` runs the change feed.
///
/// The same tables serve every host; the configured schema (``PostgresStoreLocation/schema``)
/// lets several fleets share a database. When the database is unreachable, every call fails
/// within the statement timeout with `TokenStoreError/Code/databaseUnavailable`, which the
/// engine reports as `store-degraded` while it goes on serving from memory.
public final class PostgresTokenRepository: TokenRepository, RefreshLeaseStore, TokenStoreAdmin {
    /// Where the store is, without a password: for logs and reports.
    public let storeDescription: String
    /// The schema version this build migrates the database to.
    public static var buildSchemaVersion: Int { PostgresSchemaMigrator(schema: "x", store: "").latestVersion }

    private let client: PostgresClient
    private let configuration: PostgresStoreConfiguration
    private let logger: Logger
    private let feed: PostgresChangeFeed
    private let closed = Atomic<Bool>(false)
    private let migrator: PostgresSchemaMigrator
    private let report = Mutex(PostgresOpenReport(created: false, schemaVersionBefore: 0, schemaVersion: 0))
    private let availability: PostgresAvailability

    private init(client: PostgresClient, direct: PostgresConnection.Configuration, configuration: PostgresStoreConfiguration,
                 origin: String, logger: Logger) {
        self.client = client
        self.availability = PostgresAvailability(direct: direct, store: configuration.location.description,
                                                 statementTimeout: configuration.statementTimeout, logger: logger)
        self.configuration = configuration
        self.logger = logger
        self.storeDescription = configuration.location.description
        self.migrator = PostgresSchemaMigrator(schema: configuration.location.schema, store: configuration.location.description,
                                               migrations: configuration.migrations)
        self.feed = PostgresChangeFeed(client: client, schema: configuration.location.schema, origin: origin,
                                       store: configuration.location.description, configuration: configuration, logger: logger)
    }

    /// Opens the store described by `configuration` as `mode` allows (`StoreOpenMode/agent`
    /// creates and migrates the schema; `StoreOpenMode/readOnly` changes
    /// nothing), runs `body` with it, and closes it: the connection pool runs as a child task
    /// for exactly that long.
    /// - Throws: `TokenStoreError` when the store cannot be opened (unreachable, missing,
    ///   newer than this build, a failed migration), or what `body` throws.
    public static func withRepository<Result: Sendable>(
        _ configuration: PostgresStoreConfiguration, mode: StoreOpenMode = .agent, logger: Logger,
        _ body: (PostgresTokenRepository) async throws -> Result
    ) async throws -> Result {
        let origin = "fleet-token-store/" + UUID().uuidString.prefix(8).lowercased()
        let settings = try configuration.clientConfigurations(applicationName: origin)
        let client = PostgresClient(configuration: settings.pool, backgroundLogger: logger.withLevelAtLeast(.warning))
        let repository = PostgresTokenRepository(client: client, direct: settings.direct, configuration: configuration,
                                                 origin: origin, logger: logger)
        try await repository.open(mode: mode, direct: settings.direct)
        return try await withThrowingTaskGroup(of: Void.self) { group in
            group.addTask { await client.run() }
            defer {
                repository.close()
                group.cancelAll()
            }
            return try await body(repository)
        }
    }

    /// Checks (and as `mode` allows, creates and migrates) the schema over one direct
    /// connection, so that a refused password or an unreachable server is reported at once.
    private func open(mode: StoreOpenMode, direct: PostgresConnection.Configuration) async throws(TokenStoreError) {
        let migrator = self.migrator, logger = self.logger
        let opened: PostgresOpenReport
        do {
            opened = try await PostgresFailure.withDeadline(configuration.connectTimeout + max(configuration.statementTimeout, .seconds(30))) {
                let connection = try await PostgresConnection.connect(configuration: direct, id: 0, logger: logger.withLevelAtLeast(.warning))
                do {
                    let report = try await migrator.prepare(connection, mode: mode, logger: logger)
                    try? await connection.close()
                    return report
                } catch {
                    try? await connection.close()
                    throw error
                }
            }
        } catch {
            throw PostgresFailure.storeError(error, store: storeDescription, statementTimeout: configuration.statementTimeout)
        }
        report.withLock { $0 = opened }
        logger.debug("token database opened", metadata: [
            "store": .string(storeDescription), "schema_version": .stringConvertible(opened.schemaVersion),
        ])
    }

    /// What opening the store found and did (for `tokenctl migrate`).
    public var openReport: PostgresOpenReport { report.withLock { $0 } }

    /// Ends the change feed's streams; later calls fail with `TokenStoreError/Code/closed`.
    /// ``withRepository(_:mode:logger:_:)`` calls it when its closure returns.
    public func close() {
        closed.store(true, ordering: .relaxed)
        feed.close()
    }

    // MARK: - Running operations

    /// Runs `operation` on a pooled connection, with its failure as a store error. It fails at
    /// once while the database is known to be down (see `PostgresAvailability`); a connection
    /// not leased within ``PostgresStoreConfiguration/connectionWait`` makes it find out; the
    /// whole call is bounded by the statement timeout (the server ends the statement then too).
    private func perform<T: Sendable>(_ operation: @escaping @Sendable (PostgresConnection) async throws -> T) async throws(TokenStoreError) -> T {
        guard !closed.load(ordering: .relaxed) else { throw .closed(path: storeDescription) }
        try await availability.admit()
        let client = self.client, availability = self.availability
        let wait = configuration.connectionWait, limit = configuration.statementTimeout + .seconds(1)
        let leased = LeaseFlag()
        do {
            return try await withThrowingTaskGroup(of: T?.self) { group in
                group.addTask {
                    try await client.withConnection { connection in
                        leased.set()
                        return try await operation(connection)
                    }
                }
                group.addTask {
                    let deadline = ContinuousClock.now + limit
                    try await Task.sleep(for: wait)
                    if !leased.isSet, let down = await availability.connectionIsSlow() { throw down }
                    try await Task.sleep(until: deadline, clock: .continuous)
                    return nil
                }
                defer { group.cancelAll() }
                guard let first = try await group.next(), let value = first else { throw PostgresFailure.DeadlinePassed() }
                return value
            }
        } catch {
            throw PostgresFailure.storeError(error, store: storeDescription, statementTimeout: configuration.statementTimeout)
        }
    }

    /// True while the database is judged down and calls fail at once (for tests).
    package var isJudgedDown: Bool { availability.isDown }

    /// Runs `sql` with `bindings`, returning each row through `decode`.
    func rows<T: Sendable>(_ sql: String, _ bindings: PostgresBindings = PostgresBindings(),
                                   _ decode: @escaping @Sendable (PostgresRow) throws -> T?) async throws(TokenStoreError) -> [T] {
        let logger = self.logger
        return try await perform { connection in
            var found: [T] = []
            for try await row in try await connection.query(PostgresQuery(unsafeSQL: sql, binds: bindings), logger: logger) {
                if let value = try decode(row) { found.append(value) }
            }
            return found
        }
    }

    private func count(_ sql: String, _ bindings: PostgresBindings) async throws(TokenStoreError) -> Int {
        try await rows(sql, bindings) { Int(try $0.decode(Int64.self)) }.first ?? 0
    }

    static func keyArrays(_ keys: some Sequence<TokenKey>) -> (kinds: [String], subjects: [String]) {
        var kinds: [String] = [], subjects: [String] = []
        for key in keys {
            kinds.append(key.kind.rawValue)
            subjects.append(key.subjectID)
        }
        return (kinds, subjects)
    }

    // MARK: - Engine reads

    /// The entry for `key`, or nil.
    /// - Throws: `TokenStoreError` when the database cannot be read.
    public func entry(for key: TokenKey) async throws(TokenStoreError) -> TokenEntry? {
        var bindings = PostgresBindings()
        bindings.append(key.kind.rawValue)
        bindings.append(key.subjectID)
        return try await rows("SELECT \(PostgresTokenSQL.entryColumns) FROM tokens WHERE kind = $1 AND subject_id = $2",
                              bindings, PostgresTokenSQL.entry(from:)).first
    }

    /// The entries for `keys`, in one statement.
    /// - Throws: `TokenStoreError` when the database cannot be read.
    public func entries(for keys: [TokenKey]) async throws(TokenStoreError) -> [TokenKey: TokenEntry] {
        guard !keys.isEmpty else { return [:] }
        let (kinds, subjects) = Self.keyArrays(Set(keys))
        var bindings = PostgresBindings()
        bindings.append(kinds)
        bindings.append(subjects)
        let found = try await rows("""
            SELECT \(PostgresTokenSQL.entryColumns) FROM tokens
            WHERE (kind, subject_id) IN (SELECT * FROM unnest($1::text[], $2::text[]))
            """, bindings, PostgresTokenSQL.entry(from:))
        return Dictionary(found.map { ($0.key, $0) }, uniquingKeysWith: { first, _ in first })
    }

    /// Keys dead since before `cutoff` (see `TokenRepository/retiredKeys(before:after:limit:)`).
    /// - Throws: `TokenStoreError` when the database cannot be read.
    public func retiredKeys(before cutoff: Date, after: TokenKey?, limit: Int) async throws(TokenStoreError) -> [TokenKey] {
        var condition = PostgresTokenSQL.retiredCondition(before: cutoff)
        if let after { condition.append("(kind, subject_id) > (?, ?)", [after.kind.rawValue, after.subjectID]) }
        let limitParameter = condition.bind(Int64(max(0, limit)))
        let sql = "SELECT kind, subject_id FROM tokens \(condition.whereClause) ORDER BY kind, subject_id LIMIT \(limitParameter)"
        return try await rows(sql, condition.bindings) { row in
            let (kind, subject) = try row.decode((String, String).self)
            return TokenKind(rawValue: kind).map { TokenKey(uncheckedKind: $0, subjectID: subject) }
        }
    }

    /// When the earliest entry that died at `notBefore` or later died (see
    /// `TokenRepository/earliestDeath(notBefore:)`): one aggregate over the table.
    /// - Throws: `TokenStoreError` when the database cannot be read.
    public func earliestDeath(notBefore: Date?) async throws(TokenStoreError) -> Date? {
        let died = TokenConditions.diedAt(greatest: "greatest")
        var bindings = PostgresBindings()
        var sql = "SELECT min(\(died)) FROM tokens"
        if let notBefore {
            bindings.append(notBefore.timeIntervalSince1970)
            sql += " WHERE \(died) >= $1"
        }
        return try await rows(sql, bindings) { row in try row.decode(Double?.self) }.first.map(Date.init(timeIntervalSince1970:))
    }

    /// Changes to tokens committed by other repositories (this host's or another's, tokenctl,
    /// psql), delivered at their commit while ``runBackgroundWork()`` or ``followChanges()``
    /// runs and listens; every stream gets `.unknown` after a lost connection is re-established
    /// and when ``runBackgroundWork()`` begins to listen (what committed meanwhile cannot be
    /// itemized), and in place of more changes than it keeps unread (a burst: a purge of many).
    public func changes() -> AsyncStream<TokenStoreChange> {
        feed.subscribe()
    }

    /// The change feed's LISTEN loop, until the calling task is cancelled or the store closes.
    /// Once LISTEN is in force, streams get `.unknown`: a change committed after a stream was
    /// made and before then is reported that way.
    public func runBackgroundWork() async {
        await feed.run(announcesStart: true)
    }

    /// The change feed's LISTEN loop, as ``runBackgroundWork()`` without the `.unknown` at its
    /// start: a lease wait listens for its own length, and would end at once.
    public func followChanges() async {
        await feed.run()
    }

    /// True while the change feed's LISTEN is in force (for tests).
    package var isListening: Bool { feed.isListening }

    // MARK: - Engine writes

    /// Stores `token` in one statement, replacing the key's previous token unless that one
    /// expires later.
    /// - Throws: `TokenStoreError`; on failure nothing was written.
    public func upsert(_ token: StoredToken, clearFailure: Bool) async throws(TokenStoreError) {
        let logger = self.logger
        try await perform { connection in
            if clearFailure {
                _ = try await connection.execute(UpsertClearingFailure(token: token), logger: logger).reduce(()) { _, _ in }
            } else {
                _ = try await connection.execute(UpsertKeepingFailure(token: token), logger: logger).reduce(()) { _, _ in }
            }
        }
    }

    /// Stores `tokens` in one statement (group commit): all or nothing. Of two tokens of one
    /// key, the one expiring later is written.
    /// - Throws: `TokenStoreError`; on failure nothing was written.
    public func upsert(_ tokens: [StoredToken], clearFailure: Bool) async throws(TokenStoreError) {
        guard !tokens.isEmpty else { return }
        if tokens.count == 1 { return try await upsert(tokens[0], clearFailure: clearFailure) }
        // One row per key: a statement may not change a row twice.
        var latest: [TokenKey: StoredToken] = [:]
        for token in tokens where (latest[token.key]?.expiresAt ?? .distantPast) <= token.expiresAt {
            latest[token.key] = token
        }
        var kinds: [String] = [], subjects: [String] = [], values: [String] = []
        var expiries: [Double] = [], issued: [Double] = [], fetched: [Double] = [], used: [Double] = []
        for token in latest.values {
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
        _ = try await rows(PostgresTokenSQL.batchUpsertSQL(clearingFailure: clearFailure), bindings) { _ in nil as Int? }
    }

    /// Removes the token of `key`, keeping its failure state (the entry goes when it has none).
    /// - Throws: `TokenStoreError`; on failure nothing was changed.
    public func removeToken(for key: TokenKey) async throws(TokenStoreError) {
        var bindings = PostgresBindings()
        bindings.append(key.kind.rawValue)
        bindings.append(key.subjectID)
        // The two statements touch disjoint rows (failure_count zero or not): one statement.
        _ = try await rows("""
            WITH gone AS (DELETE FROM tokens WHERE kind = $1 AND subject_id = $2 AND failure_count = 0 RETURNING 1)
            UPDATE tokens SET token = NULL, expires_at = NULL, issued_at = NULL, fetched_at = NULL
            WHERE kind = $1 AND subject_id = $2 AND failure_count > 0
            """, bindings) { _ in nil as Int? }
    }

    /// Records a failed refresh of `key`.
    /// - Throws: `TokenStoreError`; on failure nothing was written.
    public func recordFailure(_ failure: RefreshFailureState, for key: TokenKey) async throws(TokenStoreError) {
        var bindings = PostgresBindings()
        bindings.append(key.kind.rawValue)
        bindings.append(key.subjectID)
        bindings.append(Int32(clamping: max(1, failure.consecutiveFailures)))
        bindings.append(failure.nextAttemptAt.timeIntervalSince1970)
        bindings.append(failure.lastErrorKind)
        bindings.append(failure.lastErrorMessage)
        bindings.append(failure.lastFailureAt.timeIntervalSince1970)
        bindings.append(failure.configurationDigest)
        _ = try await rows("""
            INSERT INTO tokens (kind, subject_id, failure_count, next_attempt_at, last_error_kind,
                                last_error_message, last_failure_at, failure_config_digest)
            VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
            ON CONFLICT (kind, subject_id) DO UPDATE SET
              failure_count = excluded.failure_count, next_attempt_at = excluded.next_attempt_at,
              last_error_kind = excluded.last_error_kind, last_error_message = excluded.last_error_message,
              last_failure_at = excluded.last_failure_at, failure_config_digest = excluded.failure_config_digest
            """, bindings) { _ in nil as Int? }
    }

    /// Deletes the entries of `keys` still dead since before `cutoff`, in one statement.
    /// - Throws: `TokenStoreError`; on failure nothing was deleted.
    public func deleteRetired(_ keys: [TokenKey], before cutoff: Date) async throws(TokenStoreError) -> Int {
        guard !keys.isEmpty else { return 0 }
        var condition = PostgresTokenSQL.retiredCondition(before: cutoff)
        let (kinds, subjects) = Self.keyArrays(Set(keys))
        let kindsParameter = condition.bind(kinds), subjectsParameter = condition.bind(subjects)
        return try await count("""
            WITH gone AS (DELETE FROM tokens \(condition.whereClause)
                          AND (kind, subject_id) IN (SELECT * FROM unnest(\(kindsParameter)::text[], \(subjectsParameter)::text[]))
                          RETURNING 1)
            SELECT count(*) FROM gone
            """, condition.bindings)
    }

    // MARK: - Refresh leases

    /// Takes (or renews) `key`'s lease for `holder` unless another holder has it past `now`.
    /// - Throws: `TokenStoreError`; on failure no lease was taken.
    public func acquireRefreshLease(for key: TokenKey, holder: String, now: Date,
                                    duration: TimeInterval) async throws(TokenStoreError) -> RefreshLease {
        try await claim(key, holder: holder, replacing: nil, now: now, duration: duration)
    }

    /// Takes `key`'s lease from `deadHolder` when it still has it (or the lease is free).
    /// - Throws: `TokenStoreError`; on failure no lease was taken.
    public func takeOverRefreshLease(for key: TokenKey, from deadHolder: String, holder: String, now: Date,
                                     duration: TimeInterval) async throws(TokenStoreError) -> RefreshLease {
        try await claim(key, holder: holder, replacing: deadHolder, now: now, duration: duration)
    }

    /// Gives up `holder`'s leases on `keys`, in one statement.
    /// - Throws: `TokenStoreError`; on failure the leases run until they expire.
    public func releaseRefreshLeases(for keys: [TokenKey], holder: String) async throws(TokenStoreError) {
        guard !keys.isEmpty else { return }
        let (kinds, subjects) = Self.keyArrays(Set(keys))
        var bindings = PostgresBindings()
        bindings.append(holder)
        bindings.append(kinds)
        bindings.append(subjects)
        _ = try await rows("""
            DELETE FROM refresh_leases WHERE holder = $1
              AND (kind, subject_id) IN (SELECT * FROM unnest($2::text[], $3::text[]))
            """, bindings) { _ in nil as Int? }
    }

    /// The claim in one statement: the insert or update happens only when the lease is free,
    /// expired, already `holder`'s or `replacing`'s, so two hosts asking at once cannot both
    /// win (the second's conflict check waits for the first's row). When it did not happen,
    /// a second statement reads who has the lease.
    private func claim(_ key: TokenKey, holder: String, replacing: String?, now: Date,
                       duration: TimeInterval) async throws(TokenStoreError) -> RefreshLease {
        var bindings = PostgresBindings()
        bindings.append(key.kind.rawValue)
        bindings.append(key.subjectID)
        bindings.append(holder)
        bindings.append(now.timeIntervalSince1970)
        bindings.append(now.addingTimeInterval(duration).timeIntervalSince1970)
        bindings.append(replacing ?? holder)
        let claimBindings = bindings, logger = self.logger
        let answer: (claimed: Bool, holder: String?, until: Double?, entry: TokenEntry?) = try await perform { connection in
                let claimed = try await connection.query(PostgresQuery(unsafeSQL: """
                    INSERT INTO refresh_leases AS lease (kind, subject_id, holder, acquired_at, expires_at)
                    VALUES ($1, $2, $3, $4, $5)
                    ON CONFLICT (kind, subject_id) DO UPDATE SET holder = excluded.holder,
                      acquired_at = excluded.acquired_at, expires_at = excluded.expires_at
                    WHERE lease.holder = $3 OR lease.holder = $6 OR lease.expires_at <= $4
                    RETURNING holder
                    """, binds: claimBindings), logger: logger).collect()
                var other: (String, Double)?
                if claimed.isEmpty {
                    var keyBindings = PostgresBindings()
                    keyBindings.append(key.kind.rawValue)
                    keyBindings.append(key.subjectID)
                    for try await lease in try await connection.query(PostgresQuery(unsafeSQL: """
                        SELECT holder, expires_at FROM refresh_leases WHERE kind = $1 AND subject_id = $2
                        """, binds: keyBindings), logger: logger).decode((String, Double).self) {
                        other = lease
                    }
                }
                var entryBindings = PostgresBindings()
                entryBindings.append(key.kind.rawValue)
                entryBindings.append(key.subjectID)
                var entry: TokenEntry?
                for try await row in try await connection.query(PostgresQuery(unsafeSQL: """
                    SELECT \(PostgresTokenSQL.entryColumns) FROM tokens WHERE kind = $1 AND subject_id = $2
                    """, binds: entryBindings), logger: logger) {
                    entry = try PostgresTokenSQL.entry(from: row)
                }
                return (!claimed.isEmpty, other?.0, other?.1, entry)
        }
        if answer.claimed { return .acquired(current: answer.entry) }
        guard let other = answer.holder, let until = answer.until else {
            // Released between the two statements: the lease is free, claim it again.
            return try await claim(key, holder: holder, replacing: replacing, now: now, duration: duration)
        }
        return .heldElsewhere(holder: other, until: Date(timeIntervalSince1970: until), current: answer.entry)
    }

    // MARK: - Administration

    /// The entries matching `filter`, in (kind, subject id) order, one page at a time.
    /// - Throws: `TokenStoreError` when the database cannot be read.
    public func list(_ filter: TokenFilter, page: TokenPage) async throws(TokenStoreError) -> [TokenEntry] {
        var condition = PostgresTokenSQL.condition(for: filter)
        if let after = page.after { condition.append("(kind, subject_id) > (?, ?)", [after.kind.rawValue, after.subjectID]) }
        let limit = condition.bind(Int64(min(max(0, page.limit), Int(Int64.max))))
        return try await rows("""
            SELECT \(PostgresTokenSQL.entryColumns) FROM tokens \(condition.whereClause)
            ORDER BY kind, subject_id LIMIT \(limit)
            """, condition.bindings, PostgresTokenSQL.entry(from:))
    }

    /// How many entries a purge of `filter` with `scope` would remove.
    /// - Throws: `TokenStoreError` when the database cannot be read.
    public func count(_ filter: TokenFilter, scope: PurgeScope) async throws(TokenStoreError) -> Int {
        var condition = PostgresTokenSQL.condition(for: filter)
        if scope == .tokens { condition.append("token IS NOT NULL", []) }
        return try await count("SELECT count(*) FROM tokens \(condition.whereClause)", condition.bindings)
    }

    /// Removes what `scope` names from the entries matching `filter`, in one statement; every
    /// replica hears of it through the change feed.
    /// - Throws: `TokenStoreError`; on failure nothing was removed.
    public func purge(_ filter: TokenFilter, scope: PurgeScope) async throws(TokenStoreError) -> Int {
        var condition = PostgresTokenSQL.condition(for: filter)
        switch scope {
        case .tokens:
            condition.append("token IS NOT NULL", [])
            // Failing keys keep their failure state (the backoff); the rest go whole.
            return try await count("""
                WITH cleared AS (UPDATE tokens SET token = NULL, expires_at = NULL, issued_at = NULL, fetched_at = NULL
                                 \(condition.whereClause) AND failure_count > 0 RETURNING 1),
                     gone AS (DELETE FROM tokens \(condition.whereClause) AND failure_count = 0 RETURNING 1)
                SELECT (SELECT count(*) FROM cleared) + (SELECT count(*) FROM gone)
                """, condition.bindings)
        case .tokensAndFailureState:
            return try await count("""
                WITH gone AS (DELETE FROM tokens \(condition.whereClause) RETURNING 1) SELECT count(*) FROM gone
                """, condition.bindings)
        }
    }

    /// Counts by kind and status at `now`, the schema version and the tables' size on disk.
    /// - Throws: `TokenStoreError` when the database cannot be read.
    public func stats(at now: Date, policy: RefreshPolicy) async throws(TokenStoreError) -> TokenStoreStats {
        var bindings = PostgresBindings()
        bindings.append(now.timeIntervalSince1970)
        bindings.append(policy.softPointFraction)
        let groups = try await rows("""
            SELECT kind, \(PostgresTokenSQL.statusSQL) AS status, count(*) FROM tokens GROUP BY 1, 2
            """, bindings) { try $0.decode((String, String, Int64).self) }
        var counts: [TokenKind: [TokenStatus: Int]] = [:]
        var total = 0
        for (kindName, statusName, n) in groups {
            guard let kind = TokenKind(rawValue: kindName), let status = TokenStatus(rawValue: statusName) else { continue }
            counts[kind, default: [:]][status, default: 0] += Int(n)
            total += Int(n)
        }
        let summary = try await rows("""
            SELECT min(expires_at), max(expires_at),
                   pg_total_relation_size('tokens') + pg_total_relation_size('refresh_leases')
            FROM tokens WHERE expires_at IS NOT NULL
            """) { try $0.decode((Double?, Double?, Int64).self) }.first
        return TokenStoreStats(total: total, counts: counts, schemaVersion: try await schemaVersion(),
                               fileSizeBytes: summary?.2 ?? 0,
                               oldestExpiry: summary?.0.map(Date.init(timeIntervalSince1970:)),
                               newestExpiry: summary?.1.map(Date.init(timeIntervalSince1970:)))
    }

    /// Deletes every entry whose token expired before `date`; returns how many went.
    /// - Throws: `TokenStoreError`; on failure nothing was deleted.
    public func deleteExpired(before date: Date) async throws(TokenStoreError) -> Int {
        var bindings = PostgresBindings()
        bindings.append(date.timeIntervalSince1970)
        return try await count("WITH gone AS (DELETE FROM tokens WHERE expires_at < $1 RETURNING 1) SELECT count(*) FROM gone",
                               bindings)
    }

    /// Clears `key`'s failure state (its backoff), removing the entry when it has no token.
    /// - Throws: `TokenStoreError`; on failure nothing was changed.
    public func clearFailure(for key: TokenKey) async throws(TokenStoreError) {
        var bindings = PostgresBindings()
        bindings.append(key.kind.rawValue)
        bindings.append(key.subjectID)
        _ = try await rows("""
            WITH gone AS (DELETE FROM tokens WHERE kind = $1 AND subject_id = $2 AND token IS NULL RETURNING 1)
            UPDATE tokens SET failure_count = 0, next_attempt_at = NULL, last_error_kind = NULL,
                              last_error_message = NULL, last_failure_at = NULL, failure_config_digest = NULL
            WHERE kind = $1 AND subject_id = $2 AND token IS NOT NULL
            """, bindings) { _ in nil as Int? }
    }

    /// The schema version recorded in the database.
    /// - Throws: `TokenStoreError` when the database cannot be read.
    public func schemaVersion() async throws(TokenStoreError) -> Int {
        let migrator = self.migrator, logger = self.logger
        return try await perform { connection in
            PostgresSchemaMigrator.version(of: try await migrator.applied(connection, logger: logger) ?? [])
        }
    }

    /// The schema version and whether the tables answer, worded for the operator. PostgreSQL
    /// keeps its own pages' integrity; there is no file to judge.
    public func check() async -> StoreCheckReport {
        var report = StoreCheckReport(storePath: storeDescription, buildSchemaVersion: Self.buildSchemaVersion,
                                      schemaVersion: nil, integrityProblems: nil, backgroundIntegrityFinding: nil,
                                      files: nil, problems: [])
        do {
            let version = try await schemaVersion()
            report.schemaVersion = version
            _ = try await count("SELECT count(*) FROM tokens", PostgresBindings())
            _ = try await count("SELECT count(*) FROM refresh_leases", PostgresBindings())
            report.integrityProblems = []
            if version < Self.buildSchemaVersion {
                report.problems.append(TokenStoreError.storeOlderThanBuild(path: storeDescription, storeVersion: version,
                                                                           buildVersion: Self.buildSchemaVersion).description)
            }
        } catch {
            report.problems.append(error.description)
        }
        return report
    }
}

extension Logger {
    /// A copy that logs nothing below `level`: postgres-nio's own background messages are
    /// noise below a warning.
    func withLevelAtLeast(_ level: Logger.Level) -> Logger {
        var copy = self
        if copy.logLevel < level { copy.logLevel = level }
        return copy
    }
}

/// Set once a pooled connection is leased, read by the call's timer.
private final class LeaseFlag: Sendable {
    private let leased = Atomic<Bool>(false)
    func set() { leased.store(true, ordering: .relaxed) }
    var isSet: Bool { leased.load(ordering: .relaxed) }
}
