import FleetTokenMigrations
public import Foundation
import GRDB
import GRDBSQLite
public import Logging
import Synchronization

/// The token store: a SQLite file (GRDB `DatabasePool`, WAL, `synchronous=NORMAL`, writes in
/// `BEGIN IMMEDIATE`, busy timeout) holding one row per ``TokenKey``.
///
/// Several processes may share one store: WAL lets readers run beside the writer, the busy
/// timeout makes writers queue instead of failing, and ``changes()`` reports what the others
/// changed. The schema comes from the migrations embedded in the binary.
///
/// ```swift
/// let store = try SQLiteTokenRepository(path: "/var/lib/agent/tokens.sqlite", logger: logger)
/// if let report = store.openReport.quarantinedTo { logger.error("moved corrupt store to \(report)") }
/// ```
public final class SQLiteTokenRepository: TokenRepository {
    /// The store file's absolute path.
    public let path: String
    /// What opening did: creation, migration, tightened modes, quarantine.
    public let openReport: StoreOpenReport
    /// The configuration the store was opened with.
    public let configuration: StoreConfiguration

    let pool: DatabasePool
    private let files: StoreFiles
    private let logger: Logger
    private let monitor: ChangeMonitor
    private let backgroundCheck: BackgroundIntegrityCheck?
    private let lastPrune = Mutex(Date.distantPast)
    /// Writes started and not finished; a write runs on its caller's thread only when it is
    /// the only one (see ``write(inline:_:)``). `close()` adds one for good.
    private let writesInFlight = Atomic<Int>(0)
    /// Batches up to this size may be written on the caller's thread.
    static let largestInlineBatch = 64

    /// Opens (and, as `mode` allows, creates, migrates or repairs) the store at `path`.
    ///
    /// - Parameters:
    ///   - path: The store file. Its `-wal` and `-shm` side files live beside it.
    ///   - mode: What opening may do; ``StoreOpenMode/agent`` by default.
    ///   - configuration: Timeouts and checks.
    ///   - logger: Receives warnings (tightened modes) and errors (quarantine). Never a token.
    /// - Throws: ``TokenStoreError``: a missing or unwritable directory, a missing store (when
    ///   `mode` does not create), a store newer (or, without migration, older) than this build,
    ///   corruption (when `mode` does not quarantine), a failed migration, busy, read-only.
    public convenience init(path: String, mode: StoreOpenMode = .agent,
                            configuration: StoreConfiguration = StoreConfiguration(),
                            logger: Logger) throws(TokenStoreError) {
        try self.init(path: path, mode: mode, configuration: configuration, logger: logger,
                      migrator: SchemaMigrator())
    }

    init(path: String, mode: StoreOpenMode, configuration: StoreConfiguration, logger: Logger,
         migrator: SchemaMigrator) throws(TokenStoreError) {
        let files = StoreFiles(path: path, allowsSymlink: configuration.allowsSymlinkedStore)
        let opened = try StoreOpener(files: files, mode: mode, configuration: configuration,
                                     logger: logger, migrator: migrator).open()
        self.path = files.path
        self.files = files
        self.pool = opened.pool
        self.openReport = opened.report
        self.configuration = configuration
        self.logger = logger
        self.monitor = ChangeMonitor(path: files.path, interval: configuration.changePollInterval,
                                     busyTimeout: configuration.busyTimeout, logger: logger)
        // Start-up skipped the full check (the last run closed cleanly): run it now, beside serving.
        let deferCheck = configuration.integrityCheck == .whenNeeded && !opened.report.checkedBeforeOpening
            && !opened.report.created && !mode.readOnly
        self.backgroundCheck = deferCheck ? BackgroundIntegrityCheck(files: files, busyTimeout: configuration.busyTimeout, logger: logger) : nil
    }

    deinit {
        backgroundCheck?.stop()
        monitor.close()
    }

    /// Damage found by the integrity check deferred from start-up (see
    /// ``IntegrityCheckTiming/whenNeeded``), once it has finished; nil while it runs, when the
    /// store is sound, or when no such check ran. Blocks the calling thread up to `timeout`
    /// while the check runs.
    public func backgroundIntegrityFinding(waitingUpTo timeout: TimeInterval = 0) -> String? {
        guard let backgroundCheck else { return nil }
        _ = backgroundCheck.waitUntilFinished(timeout: timeout)
        return backgroundCheck.finding
    }

    /// True once the deferred integrity check has run to its end (for tests).
    var backgroundCheckHasRun: Bool { backgroundCheck?.hasRun ?? false }

    /// Frees what SQLite caches (page caches, idle reader connections), waiting for accesses in
    /// progress. For after a bulk load such as tracking thousands of subjects at start-up: the
    /// pages read then are rarely read again, since the engine serves from memory.
    public func releaseMemory() {
        pool.releaseMemory()
    }

    /// Closes the store: ends ``changes()`` streams, folds the write-ahead log into the store
    /// file (so a clean shutdown leaves one self-contained file), and closes the connections.
    /// A background integrity check that has not begun is cancelled and a running one
    /// interrupted; neither is waited for. Later calls throw ``TokenStoreError/closed(path:)``.
    public func close() {
        // From now on every write takes GRDB's queue (which reports the store closed), so none
        // waits inline behind the closing checkpoint.
        writesInFlight.add(1, ordering: .acquiringAndReleasing)
        backgroundCheck?.stop()
        monitor.close()
        do {
            if !pool.configuration.readonly {
                // GRDB closes the writer before its read-only readers, so SQLite's own
                // checkpoint-on-close never runs; do it here, without waiting: when another
                // process still reads or writes the store, fold what it allows and leave the
                // rest of the log to it.
                try pool.writeWithoutTransaction { db in
                    if let connection = db.sqliteConnection { sqlite3_busy_timeout(connection, 0) }
                    do {
                        try db.checkpoint(.truncate)
                    } catch let error as DatabaseError where error.resultCode == .SQLITE_BUSY || error.resultCode == .SQLITE_LOCKED {
                        _ = try? db.checkpoint(.passive)
                    }
                }
            }
            try pool.close()
        } catch {
            logger.warning("token store did not close cleanly", metadata: [
                "store": .string(path), "error": .string(TokenStoreError(error, path: path).description),
            ])
        }
    }

    // MARK: - Reading

    /// The entry for `key`, or nil.
    /// - Throws: ``TokenStoreError``.
    public func entry(for key: TokenKey) async throws(TokenStoreError) -> TokenEntry? {
        try await read { db in
            try Row.fetchOne(db.cachedStatement(sql: "SELECT * FROM tokens WHERE kind = ? AND subject_id = ?"),
                             arguments: [key.kind.rawValue, key.subjectID])
                .flatMap(TokenRow.entry(from:))
        }
    }

    /// The entries for `keys`, in one read (batches of 500 keys per statement).
    /// - Throws: ``TokenStoreError``.
    public func entries(for keys: [TokenKey]) async throws(TokenStoreError) -> [TokenKey: TokenEntry] {
        guard !keys.isEmpty else { return [:] }
        return try await read { db in
            var found: [TokenKey: TokenEntry] = [:]
            var start = keys.startIndex
            while start < keys.endIndex {
                let chunk = keys[start..<min(start + 500, keys.endIndex)]
                start = chunk.endIndex
                let placeholders = Array(repeating: "(?, ?)", count: chunk.count).joined(separator: ", ")
                var arguments: [DatabaseValue] = []
                for key in chunk { arguments += [key.kind.rawValue.databaseValue, key.subjectID.databaseValue] }
                let rows = try Row.fetchAll(db, sql: """
                    SELECT * FROM tokens WHERE (kind, subject_id) IN (VALUES \(placeholders))
                    """, arguments: StatementArguments(arguments))
                for row in rows {
                    if let entry = TokenRow.entry(from: row) { found[entry.key] = entry }
                }
            }
            return found
        }
    }

    /// Takes the refresh lease of `key` unless another holder has an unexpired one. A lease whose
    /// holder is a process of this machine that has exited is taken over at once (see
    /// `RefreshLeaseHolder`): a crashed agent must not hold up its restarted successor.
    /// - Throws: ``TokenStoreError``.
    public func acquireRefreshLease(for key: TokenKey, holder: String, now: Date,
                                    duration: TimeInterval) async throws(TokenStoreError) -> RefreshLease {
        try await write { db in
            let arguments: StatementArguments = [key.kind.rawValue, key.subjectID]
            let current = try Row.fetchOne(db.cachedStatement(sql: "SELECT * FROM tokens WHERE kind = ? AND subject_id = ?"),
                                           arguments: arguments).flatMap(TokenRow.entry(from:))
            if let lease = try Row.fetchOne(db.cachedStatement(sql: "SELECT holder, expires_at FROM refresh_leases WHERE kind = ? AND subject_id = ?"),
                                            arguments: arguments) {
                let other: String = lease["holder"]
                let until = Date(timeIntervalSince1970: lease["expires_at"])
                if other != holder && until > now && !RefreshLeaseHolder.isDeadProcess(other) {
                    return .heldElsewhere(holder: other, until: until, current: current)
                }
            }
            try db.cachedStatement(sql: """
                INSERT INTO refresh_leases (kind, subject_id, holder, acquired_at, expires_at) VALUES (?, ?, ?, ?, ?)
                ON CONFLICT (kind, subject_id) DO UPDATE SET holder = excluded.holder,
                  acquired_at = excluded.acquired_at, expires_at = excluded.expires_at
                """).execute(arguments: [key.kind.rawValue, key.subjectID, holder, now.timeIntervalSince1970,
                                         now.addingTimeInterval(duration).timeIntervalSince1970])
            return .acquired(current: current)
        }
    }

    /// Gives up `holder`'s leases on `keys`.
    /// - Throws: ``TokenStoreError``.
    public func releaseRefreshLeases(for keys: [TokenKey], holder: String) async throws(TokenStoreError) {
        guard !keys.isEmpty else { return }
        try await write { db in
            let statement = try db.cachedStatement(sql: "DELETE FROM refresh_leases WHERE kind = ? AND subject_id = ? AND holder = ?")
            for key in keys { try statement.execute(arguments: [key.kind.rawValue, key.subjectID, holder]) }
        }
    }

    /// Entries matching `filter`, ordered by kind then subject id.
    /// - Throws: ``TokenStoreError``.
    public func list(_ filter: TokenFilter, page: TokenPage = TokenPage()) async throws(TokenStoreError) -> [TokenEntry] {
        var condition = TokenRow.condition(for: filter)
        if let after = page.after {
            condition.append("(kind, subject_id) > (?, ?)", [after.kind.rawValue, after.subjectID])
        }
        let sql = "SELECT * FROM tokens \(condition.whereClause) ORDER BY kind, subject_id LIMIT ?"
        let arguments = condition.arguments + [max(0, page.limit).databaseValue]
        return try await read { db in
            try Row.fetchAll(db, sql: sql, arguments: StatementArguments(arguments)).compactMap(TokenRow.entry(from:))
        }
    }

    /// Counts by kind and status, schema version, file size and expiry range.
    /// - Throws: ``TokenStoreError``.
    public func stats(at now: Date = Date(), policy: RefreshPolicy = RefreshPolicy()) async throws(TokenStoreError) -> TokenStoreStats {
        let files = self.files
        let migrator = SchemaMigrator()
        return try await read { db in
            var counts: [TokenKind: [TokenStatus: Int]] = [:]
            var total = 0
            let rows = try Row.fetchAll(db, sql: """
                SELECT kind, \(TokenRow.statusSQL) AS status, count(*) AS n FROM tokens GROUP BY 1, 2
                """, arguments: [now.timeIntervalSince1970, policy.softPointFraction])
            for row in rows {
                guard let kind = TokenKind(rawValue: row["kind"]),
                      let status = TokenStatus(rawValue: row["status"]) else { continue }
                let n: Int = row["n"]
                counts[kind, default: [:]][status, default: 0] += n
                total += n
            }
            let range = try Row.fetchOne(db, sql: "SELECT min(expires_at) AS lo, max(expires_at) AS hi FROM tokens WHERE expires_at IS NOT NULL")
            return TokenStoreStats(
                total: total, counts: counts,
                schemaVersion: try migrator.state(db).storeVersion,
                fileSizeBytes: files.sizeInBytes,
                oldestExpiry: (range?["lo"] as Double?).map(Date.init(timeIntervalSince1970:)),
                newestExpiry: (range?["hi"] as Double?).map(Date.init(timeIntervalSince1970:)))
        }
    }

    /// How many entries match `filter`.
    /// - Throws: ``TokenStoreError``.
    public func count(_ filter: TokenFilter) async throws(TokenStoreError) -> Int {
        let condition = TokenRow.condition(for: filter)
        let sql = "SELECT count(*) FROM tokens \(condition.whereClause)"
        let arguments = condition.arguments
        return try await read { db in try Int.fetchOne(db, sql: sql, arguments: StatementArguments(arguments)) ?? 0 }
    }

    /// The schema version this build migrates stores to.
    public static var buildSchemaVersion: Int { SchemaMigrator().latestVersion }

    /// The schema version recorded in the store.
    /// - Throws: ``TokenStoreError``.
    public func schemaVersion() async throws(TokenStoreError) -> Int {
        try await read { db in try SchemaMigrator().state(db).storeVersion }
    }

    /// `PRAGMA integrity_check`: an empty array when the store is sound, else SQLite's findings.
    /// - Throws: ``TokenStoreError``.
    public func integrityProblems() async throws(TokenStoreError) -> [String] {
        try await read { db in
            let lines = try String.fetchAll(db, sql: "PRAGMA integrity_check")
            return lines == ["ok"] ? [] : lines
        }
    }

    /// Changes to tokens committed by other connections or processes (not by this repository),
    /// within about ``StoreConfiguration/changePollInterval`` of their commit.
    public func changes() -> AsyncStream<TokenStoreChange> {
        monitor.subscribe()
    }

    // MARK: - Writing

    /// Stores `token` in one transaction, replacing the key's previous token unless that one
    /// expires later.
    /// - Throws: ``TokenStoreError``; on failure nothing was written.
    public func upsert(_ token: StoredToken, clearFailure: Bool = true) async throws(TokenStoreError) {
        try await write { db in try TokenRow.upsert(token, clearFailure: clearFailure, db) }
    }

    /// Stores `tokens` in one transaction (group commit): all or nothing.
    /// - Throws: ``TokenStoreError``; on failure nothing was written.
    public func upsert(_ tokens: [StoredToken], clearFailure: Bool = true) async throws(TokenStoreError) {
        guard !tokens.isEmpty else { return }
        try await write(inline: tokens.count <= Self.largestInlineBatch) { db in
            for token in tokens { try TokenRow.upsert(token, clearFailure: clearFailure, db) }
        }
    }

    /// Removes what `scope` names from the entries matching `filter`, in one transaction;
    /// returns how many entries lost a token (``PurgeScope/tokens``) or went entirely
    /// (``PurgeScope/tokensAndFailureState``).
    /// - Throws: ``TokenStoreError``; on failure nothing was deleted.
    public func purge(_ filter: TokenFilter, scope: PurgeScope = .tokens) async throws(TokenStoreError) -> Int {
        var condition = TokenRow.condition(for: filter)
        let statements: [String]
        switch scope {
        case .tokens:
            condition.append("token IS NOT NULL", [])
            statements = [
                // Keep the failure state (the backoff) of failing keys; remove the rest whole.
                "UPDATE tokens SET token = NULL, expires_at = NULL, issued_at = NULL, fetched_at = NULL \(condition.whereClause) AND failure_count > 0",
                "DELETE FROM tokens \(condition.whereClause)",
            ]
        case .tokensAndFailureState:
            statements = ["DELETE FROM tokens \(condition.whereClause)"]
        }
        let arguments = StatementArguments(condition.arguments)
        // Inline when the lock is free, like a small write: an admin operation whose caller
        // waits for it anyway, and through GRDB's writer queue the same 100,000-row DELETE
        // measured 1.5-1.9x the raw C API against 1.0-1.3x inline (cause not found).
        return try await write(inline: true) { db in
            var removed = 0
            for sql in statements {
                try db.execute(sql: sql, arguments: arguments)
                removed += db.changesCount
            }
            return removed
        }
    }

    /// How many entries a purge of `filter` with `scope` would remove.
    /// - Throws: ``TokenStoreError``.
    public func count(_ filter: TokenFilter, scope: PurgeScope) async throws(TokenStoreError) -> Int {
        var condition = TokenRow.condition(for: filter)
        if scope == .tokens { condition.append("token IS NOT NULL", []) }
        let sql = "SELECT count(*) FROM tokens \(condition.whereClause)"
        let arguments = condition.arguments
        return try await read { db in try Int.fetchOne(db, sql: sql, arguments: StatementArguments(arguments)) ?? 0 }
    }

    /// Keys dead since before `cutoff` (see ``TokenRepository/retiredKeys(before:after:limit:)``).
    /// - Throws: ``TokenStoreError``.
    public func retiredKeys(before cutoff: Date, after: TokenKey?, limit: Int) async throws(TokenStoreError) -> [TokenKey] {
        var condition = TokenRow.retiredCondition(before: cutoff)
        if let after { condition.append("(kind, subject_id) > (?, ?)", [after.kind.rawValue, after.subjectID]) }
        let sql = "SELECT kind, subject_id FROM tokens \(condition.whereClause) ORDER BY kind, subject_id LIMIT ?"
        let arguments = condition.arguments + [max(0, limit).databaseValue]
        return try await read { db in
            try Row.fetchAll(db, sql: sql, arguments: StatementArguments(arguments)).compactMap { row in
                TokenKind(rawValue: row["kind"]).map { TokenKey(uncheckedKind: $0, subjectID: row["subject_id"]) }
            }
        }
    }

    /// Deletes the entries of `keys` still dead since before `cutoff`, in one transaction.
    /// - Throws: ``TokenStoreError``; on failure nothing was deleted.
    public func deleteRetired(_ keys: [TokenKey], before cutoff: Date) async throws(TokenStoreError) -> Int {
        guard !keys.isEmpty else { return 0 }
        let condition = TokenRow.retiredCondition(before: cutoff)
        let sql = "DELETE FROM tokens \(condition.whereClause) AND kind = ? AND subject_id = ?"
        let arguments = condition.arguments
        return try await write(inline: keys.count <= Self.largestInlineBatch) { db in
            let statement = try db.cachedStatement(sql: sql)
            var deleted = 0
            for key in keys {
                try statement.execute(arguments: StatementArguments(arguments + [key.kind.rawValue.databaseValue, key.subjectID.databaseValue]))
                deleted += db.changesCount
            }
            return deleted
        }
    }

    /// Deletes the entries whose token expired before `date`; returns how many went.
    /// - Throws: ``TokenStoreError``.
    public func deleteExpired(before date: Date) async throws(TokenStoreError) -> Int {
        try await write(inline: true) { db in
            try db.execute(sql: "DELETE FROM tokens WHERE expires_at < ?", arguments: [date.timeIntervalSince1970])
            return db.changesCount
        }
    }

    /// Removes the token of `key`, keeping its failure state.
    /// - Throws: ``TokenStoreError``.
    public func removeToken(for key: TokenKey) async throws(TokenStoreError) {
        try await write { db in try TokenRow.removeToken(for: key, db) }
    }

    /// Records a failed refresh of `key`.
    /// - Throws: ``TokenStoreError``.
    public func recordFailure(_ failure: RefreshFailureState, for key: TokenKey) async throws(TokenStoreError) {
        try await write { db in try TokenRow.recordFailure(failure, for: key, db) }
    }

    /// Forgets the failure state of `key`; removes the entry when it holds no token.
    /// - Throws: ``TokenStoreError``.
    public func clearFailure(for key: TokenKey) async throws(TokenStoreError) {
        try await write { db in try TokenRow.clearFailure(for: key, db) }
    }

    // MARK: - Plumbing

    func read<T: Sendable>(_ body: @escaping @Sendable (Database) throws -> T) async throws(TokenStoreError) -> T {
        do {
            return try await pool.read(body)
        } catch {
            throw TokenStoreError(error, path: path, busyTimeout: configuration.busyTimeout)
        }
    }

    /// Runs `body` in one `BEGIN IMMEDIATE` transaction. The change-log rows it causes are noted
    /// as this repository's own before commit, so the change monitor never echoes them.
    ///
    /// A small write (`inline`: a few rows, as every refresh makes) that can start at once (no
    /// other write of this repository in flight, the file's write lock free) runs right here on
    /// the calling thread: it commits in tens of microseconds with `synchronous=NORMAL`, and
    /// handing it to GRDB's writer queue and back cost several times that when profiled.
    /// Anything that would wait for the queue or another process's lock, big batches and the
    /// change log's pruning go through GRDB's queue with the full busy timeout, so a caller's
    /// thread never waits on a lock. Purges run inline too (see ``purge(_:)``). An inline write still does the
    /// occasional WAL checkpoint SQLite runs at commit, as any SQLite commit would.
    ///
    /// The inline path steps BEGIN and COMMIT through the C API (``DirectStep``), outside GRDB's
    /// statement bookkeeping: bodies must let every error propagate (none may swallow one and
    /// go on, since SQLite may have rolled back), and nothing may rely on GRDB's transaction
    /// date or observers, which this store does not use.
    func write<T: Sendable>(inline: Bool = true, _ body: @escaping @Sendable (Database) throws -> T) async throws(TokenStoreError) -> T {
        let noted = Mutex<ClosedRange<Int64>?>(nil)
        let monitor = self.monitor
        let retention = configuration.changeLogRetention
        let pruneDue = lastPrune.withLock { last in
            let now = Date()
            guard now.timeIntervalSince(last) > 60 else { return false }
            last = now
            return true
        }
        let transaction: @Sendable (Database) throws -> T = { db in
            let before = try ChangeLog.lastSequence(db)
            let result = try body(db)
            let after = try ChangeLog.lastSequence(db)
            if after > before {
                let range = (before + 1)...after
                monitor.noteOwnChanges(range)
                noted.withLock { $0 = range }
            }
            if pruneDue { try ChangeLog.prune(db, olderThan: Date().addingTimeInterval(-retention)) }
            return result
        }
        let forget = { if let range = noted.withLock({ $0 }) { monitor.forgetOwnChanges(range) } }

        let claimedAtOnce = inline && !pruneDue
            && writesInFlight.compareExchange(expected: 0, desired: 1, ordering: .acquiringAndReleasing).exchanged
        if !claimedAtOnce { writesInFlight.add(1, ordering: .acquiringAndReleasing) }
        defer { writesInFlight.subtract(1, ordering: .acquiringAndReleasing) }
        do {
            if claimedAtOnce, let result = try writeAtOnce(transaction) { return result }
            return try await pool.write(transaction)
        } catch {
            forget()
            throw TokenStoreError(error, path: path, busyTimeout: configuration.busyTimeout)
        }
    }

    /// Runs `transaction` in `BEGIN IMMEDIATE` on this thread, not waiting for the write lock:
    /// nil, with nothing run, when another connection holds it.
    private func writeAtOnce<T>(_ transaction: (Database) throws -> T) throws -> T? {
        let busyTimeoutMilliseconds = Int32(configuration.busyTimeout * 1000)
        return try pool.writeWithoutTransaction { db -> T? in
            guard let connection = db.sqliteConnection else { return nil }
            sqlite3_busy_timeout(connection, 0)
            defer { sqlite3_busy_timeout(connection, busyTimeoutMilliseconds) }
            // Cached and stepped directly (see DirectStep): parsing BEGIN and COMMIT anew, and
            // GRDB's general execution, showed up in the profile.
            do {
                try DirectStep.run(db, "BEGIN IMMEDIATE")
            } catch let error as DatabaseError where error.resultCode == .SQLITE_BUSY {
                return nil
            }
            do {
                let result = try transaction(db)
                try DirectStep.run(db, "COMMIT")
                return result
            } catch {
                if db.isInsideTransaction { try? db.rollback() }
                throw error
            }
        }
    }
}
