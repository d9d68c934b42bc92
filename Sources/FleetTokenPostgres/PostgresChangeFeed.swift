// FleetTokenPostgres: the change feed across hosts. The table's trigger announces each token
// change with NOTIFY at commit; one connection LISTENs while the repository's work runs. The
// loop around each LISTEN is the ChangeFeedRunner SQLite's poller runs too: after a lost
// connection it reconnects with backoff and reports `.unknown`, so subscribers re-read what they
// hold from the table: a notification lost meanwhile costs no correctness. So does a burst
// larger than a subscriber keeps unread (StoreChangeBroadcaster: one `.unknown` instead).
// Nothing but the LISTEN itself is sent on its connection, and a flow a NAT dropped or a host
// that lost power gives no error, ever (postgres-nio sets no TCP keepalive; the pool's keep-alive
// query runs on idle connections only): so a check beside the LISTEN proves the connection alive
// every so often, and one that goes unanswered is lost like any other.
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
    /// Also how long a check of the LISTEN connection waits for its answer.
    private let statementTimeout: Duration
    /// How often the LISTEN connection is proved alive (``keepProving(_:)``).
    private let probeInterval: Duration
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
        self.probeInterval = configuration.feedProbeInterval
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

    /// One connection's LISTEN, delivering notifications until the connection is lost or the
    /// check beside it (``keepProving(_:)``) finds it silent.
    func watchOnce(_ turn: ChangeFeedRunner.Turn) async throws {
        defer { listening.store(false, ordering: .relaxed) }
        try await pool.client.withConnection { connection in
            try await withThrowingTaskGroup(of: Void.self) { group in
                group.addTask { try await self.keepProving(connection) }
                do {
                    try await listen(on: connection, turn)
                } catch {
                    group.cancelAll()
                    // A check that found the connection silent closed it, which ended the
                    // LISTEN: the check's failure says why (cancelled, it had nothing to say).
                    let check = await group.nextResult()
                    if case .failure(let silent)? = check, !(silent is CancellationError) { throw silent }
                    throw error
                }
                group.cancelAll()
            }
        }
        throw ListenEnded()
    }

    /// LISTEN on `connection`, delivering notifications until the connection is lost.
    private func listen(on connection: PostgresConnection, _ turn: ChangeFeedRunner.Turn) async throws {
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

    /// Proves `connection` alive now (a LISTEN that never takes effect is caught too) and every
    /// ``probeInterval`` after: a `SELECT 1` answered within the statement timeout. One that is
    /// not closes the connection, which ends the LISTEN beside it with an error (the runner's
    /// reconnect, its warning and `.unknown`; closed, the silent connection serves no later
    /// call), and is thrown. Returns only by throwing; cancelled, it closes nothing.
    private func keepProving(_ connection: PostgresConnection) async throws {
        let logger = self.logger
        while true {
            do {
                try await PostgresFailure.withDeadline(statementTimeout) {
                    _ = try await connection.query("SELECT 1", logger: logger).collect()
                }
            } catch {
                // The LISTEN ended first: the connection is no longer this check's to judge.
                if Task.isCancelled { throw error }
                // Not awaited: closing fails the LISTEN at once, but TLS then waits up to 5 s
                // for a silent peer's close_notify before the socket closes.
                Task { try? await connection.close() }
                throw error
            }
            try await Task.sleep(for: probeInterval)
        }
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
