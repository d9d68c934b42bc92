// Storage layer: SQLiteTokenRepository, the SQLite token store. This file: opening and closing
// the store and the engine's reads and writes (TokenRepository). Leases are in
// SQLiteTokenRepository+Leases.swift, administration in +Admin.swift, the transaction plumbing
// in +Transactions.swift.
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
/// The store also keeps refresh leases (``RefreshLeaseStore``) and answers administration
/// (``TokenStoreAdmin``), so one value serves an engine and `tokenctl` alike.
///
/// ```swift
/// let store = try SQLiteTokenRepository(path: "/var/lib/agent/tokens.sqlite", logger: logger)
/// if let report = store.openReport.quarantinedTo { logger.error("moved corrupt store to \(report)") }
/// ```
public final class SQLiteTokenRepository: TokenRepository, RefreshLeaseStore, TokenStoreAdmin {
    /// The store file's absolute path.
    public let path: String
    /// What opening did: creation, migration, quarantine.
    public let openReport: StoreOpenReport
    /// The configuration the store was opened with.
    public let configuration: StoreConfiguration

    let pool: DatabasePool
    let files: StoreFiles
    let logger: Logger
    let monitor: ChangeMonitor
    let backgroundCheck: BackgroundIntegrityCheck?
    let lastPrune = Mutex(Date.distantPast)
    /// Writes started and not finished; a write runs on its caller's thread only when it is
    /// the only one (see ``write(inline:_:)``). `close()` adds one for good.
    let writesInFlight = Atomic<Int>(0)
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

    /// `pollClock` paces the change feed's polling: tests pass a test clock to decide when
    /// polls happen.
    init(path: String, mode: StoreOpenMode, configuration: StoreConfiguration, logger: Logger,
         migrator: SchemaMigrator, pollClock: any Clock<Duration> = ContinuousClock()) throws(TokenStoreError) {
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
                                     busyTimeout: configuration.busyTimeout, clock: pollClock, logger: logger)
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

    // MARK: - Engine reads

    /// The entry for `key`, or nil.
    /// - Throws: ``TokenStoreError`` when the store cannot be read.
    public func entry(for key: TokenKey) async throws(TokenStoreError) -> TokenEntry? {
        try await read { db in
            try Row.fetchOne(db.cachedStatement(sql: "SELECT * FROM tokens WHERE kind = ? AND subject_id = ?"),
                             arguments: [key.kind.rawValue, key.subjectID])
                .flatMap(TokenRow.entry(from:))
        }
    }

    /// The entries for `keys`, in one read (batches of 500 keys per statement).
    /// - Throws: ``TokenStoreError`` when the store cannot be read.
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

    /// Keys dead since before `cutoff` (see ``TokenRepository/retiredKeys(before:after:limit:)``).
    /// - Throws: ``TokenStoreError`` when the store cannot be read.
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

    /// Changes to tokens committed by other connections or processes (not by this repository),
    /// within about ``StoreConfiguration/changePollInterval`` of their commit.
    public func changes() -> AsyncStream<TokenStoreChange> {
        monitor.subscribe()
    }

    // MARK: - Engine writes

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

    /// Removes the token of `key`, keeping its failure state.
    /// - Throws: ``TokenStoreError``; on failure nothing was changed.
    public func removeToken(for key: TokenKey) async throws(TokenStoreError) {
        try await write { db in try TokenRow.removeToken(for: key, db) }
    }

    /// Records a failed refresh of `key`.
    /// - Throws: ``TokenStoreError``; on failure nothing was written.
    public func recordFailure(_ failure: RefreshFailureState, for key: TokenKey) async throws(TokenStoreError) {
        try await write { db in try TokenRow.recordFailure(failure, for: key, db) }
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
}
