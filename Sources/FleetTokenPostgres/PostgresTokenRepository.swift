// FleetTokenPostgres: PostgresTokenRepository, the token store on a PostgreSQL database that
// replicas on several hosts share: opening, closing and the change feed here; the engine's
// reads and writes of the `tokens` table (+Tokens), the refresh leases (+Leases), tokenctl's
// administration (+Admin) and the sealed values (+Sealing) in their own files, each conforming
// to its protocol there. Every statement runs through one PostgresStatementRunner, over a
// postgres-nio client whose run() is a child task of withRepository.
public import FleetTokenStore
import Foundation
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
public final class PostgresTokenRepository: Sendable {
    /// Where the store is, without a password: for logs and reports.
    public let storeDescription: String
    /// The schema version this build migrates the database to.
    public static var buildSchemaVersion: Int { PostgresSchemaMigrator(schema: "x", store: "").latestVersion }

    let configuration: PostgresStoreConfiguration
    let logger: Logger
    let migrator: PostgresSchemaMigrator
    /// Every statement's way to the database, shared by the table files.
    let runner: PostgresStatementRunner
    private let feed: PostgresChangeFeed
    private let report = Mutex(PostgresOpenReport(created: false, schemaVersionBefore: 0, schemaVersion: 0))

    /// The pool of the host in use (moved to another host by the availability check).
    private let pool: PostgresPool
    /// Judges the database and runs the host searches (``PostgresAvailability/run()``).
    private let availability: PostgresAvailability

    private init(pool: PostgresPool, selector: PostgresHostSelector, configuration: PostgresStoreConfiguration,
                 origin: String, logger: Logger) {
        let store = configuration.location.description
        let availability = PostgresAvailability(selector: selector, pool: pool, store: store, logger: logger)
        self.pool = pool
        self.availability = availability
        self.runner = PostgresStatementRunner(pool: pool, availability: availability, configuration: configuration,
                                              store: store, logger: logger)
        self.configuration = configuration
        self.logger = logger
        self.storeDescription = store
        self.migrator = PostgresSchemaMigrator(schema: configuration.location.schema, store: store,
                                               statementTimeout: configuration.statementTimeout, migrations: configuration.migrations)
        self.feed = PostgresChangeFeed(pool: pool, schema: configuration.location.schema, origin: origin,
                                       store: store, configuration: configuration, logger: logger)
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
        let location = configuration.location
        let settings = try configuration.clientConfigurations(applicationName: origin)
        let selector = PostgresHostSelector(
            choice: PostgresHostChoice(count: location.hosts.count, wanted: location.targetSessionAttributes),
            directs: settings.map(\.direct), names: location.hosts.map(\.description), store: location.description,
            statementTimeout: configuration.statementTimeout, logger: logger)
        // The first fitting host, as libpq picks it (one host taking any server: no probe, open tells).
        var hostIndex = 0
        if selector.choice.count > 1 || selector.choice.asksServer {
            switch await selector.find(current: nil) {
            case .found(let index): hostIndex = index
            case .refused(let error): throw error
            case .undecided:
                throw TokenStoreError.databaseUnavailable(path: location.description, reason: "no host answered within \(configuration.statementTimeout)")
            }
        }
        let pool = PostgresPool(configurations: settings.map(\.pool), hostIndex: hostIndex, logger: logger)
        let repository = PostgresTokenRepository(pool: pool, selector: selector, configuration: configuration,
                                                 origin: origin, logger: logger)
        try await repository.open(mode: mode, direct: settings[hostIndex].direct)
        return try await withThrowingTaskGroup(of: Void.self) { group in
            group.addTask { await pool.run() }
            group.addTask { await repository.availability.run() }
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
        let migrator = self.migrator, logger = self.logger, session = runner.session
        // Before anything else: a pooler sharing sessions would break LISTEN and advisory locks.
        let sessionCheck = PostgresSessionCheck(store: storeDescription, limit: configuration.statementTimeout,
                                                logger: logger.withLevelAtLeast(.warning))
        let opened: PostgresOpenReport
        do {
            // The migration lock's wait is bounded on its own (a holder past it is named), and
            // the migrations after it by the statement timeout or 30 s, whichever is longer.
            opened = try await PostgresFailure.withDeadline(configuration.connectTimeout + migrator.lockWait
                                                            + max(configuration.statementTimeout, .seconds(30))) {
                let connection = try await PostgresConnection.connect(configuration: direct, id: 0, logger: logger.withLevelAtLeast(.warning))
                do {
                    try await sessionCheck.verify(connection) {
                        try await PostgresConnection.connect(configuration: direct, id: 1, logger: logger.withLevelAtLeast(.warning))
                    }
                    try await session.apply(to: connection, logger: logger)
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
        runner.close()
        feed.close()
        pool.close()
    }

    /// True while the database is judged down and calls fail at once (for tests).
    package var isJudgedDown: Bool { runner.isJudgedDown }

    // MARK: - The change feed

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
