// FleetTokenPostgres: the change feed across hosts. The table's trigger announces each token
// change with NOTIFY at commit; one connection LISTENs while the repository's work runs. The
// loop around each LISTEN is the ChangeFeedRunner SQLite's poller runs too: after a lost
// connection it reconnects with backoff and reports `.unknown`, so subscribers re-read what they
// hold from the table: a notification lost meanwhile costs no correctness. So does a burst
// larger than a subscriber keeps unread (StoreChangeBroadcaster: one `.unknown` instead).
import FleetTokenStore
import Logging
import PostgresNIO
import Synchronization

final class PostgresChangeFeed: ChangeFeedWatch {
    /// The LISTEN ended without an error (the server closed the session): reconnect.
    private struct ListenEnded: Error {}

    /// The pool of the host in use: each LISTEN takes the client of the moment, so after a
    /// move the feed listens on the new host (and subscribers get `.unknown`).
    private let pool: PostgresPool
    private let channel: String
    /// This repository's `application_name`: its own changes are not reported back.
    private let origin: String
    private let store: String
    private let statementTimeout: Duration
    private let logger: Logger
    private let runner: ChangeFeedRunner
    /// LISTEN is in force: what commits from now on is delivered.
    private let listening = Atomic<Bool>(false)

    init(pool: PostgresPool, schema: String, origin: String, store: String,
         configuration: PostgresStoreConfiguration, logger: Logger) {
        self.pool = pool
        self.channel = schema + ".token_changes"
        self.origin = origin
        self.store = store
        self.statementTimeout = configuration.statementTimeout
        self.logger = logger
        self.runner = ChangeFeedRunner(pacing: .init(takeOverCheck: configuration.feedReconnectInitial,
                                                     retryInitial: configuration.feedReconnectInitial,
                                                     retryMaximum: configuration.feedReconnectMaximum),
                                       clock: ContinuousClock())
    }

    /// What commits from now on, once listening. A listener started with `announcesStart`
    /// (the repository's background work, which an engine's `run()` runs) reports `.unknown`
    /// when its LISTEN takes effect: what committed between a subscription and that moment
    /// cannot be itemized. A lease wait's listener does not: it listens for the wait's own
    /// length, and `.unknown` at each start would end every wait at once and start it again,
    /// LISTEN after LISTEN.
    func subscribe() -> AsyncStream<TokenStoreChange> {
        runner.broadcaster.subscribe()
    }

    /// True while LISTEN is in force (for tests).
    var isListening: Bool { listening.load(ordering: .relaxed) }

    func close() {
        runner.close()
    }

    /// Listens until the calling task is cancelled or the feed closes, reconnecting with
    /// backoff. A second caller waits for the first to end, then takes over. With
    /// `announcesStart`, subscribers get `.unknown` once LISTEN is first in force (see
    /// ``subscribe()``).
    func run(announcesStart: Bool = false) async {
        await runner.run(self, announcingStart: announcesStart)
    }

    /// One connection's LISTEN, delivering notifications until the connection is lost.
    func watchOnce(_ turn: ChangeFeedRunner.Turn) async throws {
        defer { listening.store(false, ordering: .relaxed) }
        try await pool.client.withConnection { connection in
            try await connection.listen(on: channel) { notifications in
                // Queries on one connection run in order: once this answers, LISTEN is in force.
                _ = try await connection.query("SELECT 1", logger: logger).collect()
                listening.store(true, ordering: .relaxed)
                turn.watching()
                for try await notification in notifications {
                    if let change = change(from: notification.payload) { runner.broadcaster.emit(change) }
                }
            }
        }
        throw ListenEnded()
    }

    /// Said once per outage.
    func watchFailed(_ error: any Error, again: Bool) {
        guard !again, !(error is ListenEnded) else { return }
        let reason = PostgresFailure.storeError(error, store: store, statementTimeout: statementTimeout)
        logger.warning("token database change feed lost its connection; reconnecting", metadata: [
            "store": .string(store), "reason": .string(reason.description),
        ])
    }

    func watchResumed() {
        logger.notice("token database change feed is back; subscribers re-read what they hold", metadata: [
            "store": .string(store),
        ])
    }

    /// `upsert|delete <tab> origin <tab> kind <tab> subject id`; nil for this repository's own
    /// changes and anything unreadable.
    func change(from payload: String) -> TokenStoreChange? {
        let fields = payload.split(separator: "\t", maxSplits: 3, omittingEmptySubsequences: false)
        guard fields.count == 4, fields[1] != origin, let kind = TokenKind(rawValue: String(fields[2])) else { return nil }
        let key = TokenKey(uncheckedKind: kind, subjectID: String(fields[3]))
        switch fields[0] {
        case "upsert": return .upserted(key)
        case "delete": return .removed(key)
        default: return nil
        }
    }
}
