// Storage layer: SQLiteTokenRepository, the SQLite token store: opening and closing it, and the
// change feed's part of TokenRepository. Each protocol is conformed to where its table's work is
// done: +Tokens (TokenRepository), +Leases (RefreshLeaseStore), +Admin (TokenStoreAdmin),
// +Sealing (TokenSealingStore). Every read and write runs through one SQLiteTransactionRunner.
import FleetTokenMigrations
package import Foundation
import GRDB
public import Logging

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
public final class SQLiteTokenRepository: Sendable {
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
    /// Paces the change feed's polling and the deferred integrity check's start.
    private let pollClock: any Clock<Duration>
    /// The write path (inline when the lock is free) and reads, shared by every conformance.
    let runner: SQLiteTransactionRunner

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

    /// `pollClock` paces the change feed's polling and the deferred integrity check's start:
    /// tests pass a test clock to decide when polls happen.
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
        self.pollClock = pollClock
        let monitor = ChangeMonitor(path: files.path, interval: configuration.changePollInterval,
                                    busyTimeout: configuration.busyTimeout, clock: pollClock, logger: logger)
        self.monitor = monitor
        let runner = SQLiteTransactionRunner(pool: opened.pool, path: files.path, monitor: monitor, configuration: configuration)
        self.runner = runner
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
    /// ``IntegrityCheckTiming/whenNeeded``; it runs inside ``runBackgroundWork()``), once it has
    /// finished; nil while it runs, when the store is sound, or when no such check ran. Blocks
    /// the calling thread up to `timeout` while the check is to come or runs: not for async code.
    package func backgroundIntegrityFinding(waitingUpTo timeout: TimeInterval = 0) -> String? {
        guard let backgroundCheck else { return nil }
        _ = backgroundCheck.waitUntilFinished(timeout: timeout)
        return backgroundCheck.finding
    }

    /// The store's long-running work, until the calling task is cancelled or the store closes:
    /// polling for other processes' changes (``changes()`` reports nothing without it) and the
    /// integrity check deferred from start-up. ``TokenSyncEngine`` runs it as a child task of
    /// its `run()`; a program using the store without an engine runs it itself. A second call
    /// while one runs waits and takes over when the first ends.
    public func runBackgroundWork() async {
        await withTaskGroup(of: Void.self) { group in
            group.addTask { await self.monitor.run() }
            if let backgroundCheck {
                group.addTask { [pollClock] in await backgroundCheck.run(clock: pollClock) }
            }
        }
    }

    /// Polls for other processes' changes, until the calling task is cancelled or the store
    /// closes: the part of ``runBackgroundWork()`` that makes ``changes()`` report, without the
    /// deferred integrity check (a short wait must not begin a check it would interrupt).
    public func followChanges() async {
        await monitor.run()
    }

    /// True once the deferred integrity check has run to its end (for tests).
    var backgroundCheckHasRun: Bool { backgroundCheck?.hasRun ?? false }

    /// How many times the deferred integrity check has begun (for tests).
    var backgroundCheckBeginnings: Int { backgroundCheck?.beginnings ?? 0 }

    /// Frees what SQLite caches (page caches, idle reader connections), waiting for accesses in
    /// progress. For after a bulk load such as tracking thousands of subjects at start-up: the
    /// pages read then are rarely read again, since the engine serves from memory.
    package func releaseMemory() {
        pool.releaseMemory()
    }

    /// Closes the store: ends ``changes()`` streams, folds the write-ahead log into the store
    /// file (so a clean shutdown leaves one self-contained file), and closes the connections.
    /// A background integrity check that has not begun is cancelled and a running one
    /// interrupted; neither is waited for. Later calls throw ``TokenStoreError/Code/closed``.
    public func close() {
        runner.stopInlineWrites()
        backgroundCheck?.stop()
        monitor.close()
        runner.close(logger: logger)
    }

    // MARK: - The change feed (the rest of TokenRepository: +Tokens)

    /// Changes to tokens committed by other connections or processes (not by this repository),
    /// within about ``StoreConfiguration/changePollInterval`` of their commit.
    public func changes() -> AsyncStream<TokenStoreChange> {
        monitor.subscribe()
    }
}
