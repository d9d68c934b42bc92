// FleetTokenPostgres: the change feed across hosts. The table's trigger announces each token
// change with NOTIFY at commit; one connection LISTENs while the repository's work runs. After
// a lost connection it reconnects with backoff and reports `.unknown`, so subscribers re-read
// what they hold from the table: a notification lost meanwhile costs no correctness. So does a
// burst larger than a subscriber keeps unread (StoreChangeBroadcaster: one `.unknown` instead).
import FleetTokenStore
import Logging
import PostgresNIO
import Synchronization

final class PostgresChangeFeed: Sendable {
    private struct State {
        /// A listener runs (one at a time; another caller waits for it to end).
        var running = false
        /// LISTEN is in force: what commits from now on is delivered.
        var listening = false
        var closed = false
    }

    private let client: PostgresClient
    private let channel: String
    /// This repository's `application_name`: its own changes are not reported back.
    private let origin: String
    private let store: String
    private let configuration: PostgresStoreConfiguration
    private let logger: Logger
    private let broadcaster = StoreChangeBroadcaster()
    private let state = Mutex(State())

    init(client: PostgresClient, schema: String, origin: String, store: String,
         configuration: PostgresStoreConfiguration, logger: Logger) {
        self.client = client
        self.channel = schema + ".token_changes"
        self.origin = origin
        self.store = store
        self.configuration = configuration
        self.logger = logger
    }

    /// What commits from now on, once listening. A listener started with `announcesStart`
    /// (the repository's background work, which an engine's `run()` runs) reports `.unknown`
    /// when its LISTEN takes effect: what committed between a subscription and that moment
    /// cannot be itemized. A lease wait's listener does not: it listens for the wait's own
    /// length, and `.unknown` at each start would end every wait at once and start it again,
    /// LISTEN after LISTEN.
    func subscribe() -> AsyncStream<TokenStoreChange> {
        broadcaster.subscribe()
    }

    /// True while LISTEN is in force (for tests).
    var isListening: Bool { state.withLock { $0.listening } }

    func close() {
        state.withLock { $0.closed = true }
        broadcaster.finish()
    }

    /// Listens until the calling task is cancelled or the feed closes, reconnecting with
    /// backoff. A second caller waits for the first to end, then takes over. With
    /// `announcesStart`, subscribers get `.unknown` once LISTEN is first in force (see
    /// ``subscribe()``).
    func run(announcesStart: Bool = false) async {
        while true {
            let role = state.withLock { state -> (closed: Bool, runs: Bool) in
                if state.closed { return (true, false) }
                if state.running { return (false, false) }
                state.running = true
                return (false, true)
            }
            if role.closed { return }
            if role.runs { break }
            do { try await Task.sleep(for: configuration.feedReconnectInitial) } catch { return }
        }
        defer { state.withLock { $0.running = false; $0.listening = false } }
        var delay = configuration.feedReconnectInitial
        var lostConnection = false
        var startToAnnounce = announcesStart
        while !Task.isCancelled && !state.withLock({ $0.closed }) {
            do {
                try await client.withConnection { connection in
                    try await connection.listen(on: channel) { notifications in
                        // Queries on one connection run in order: once this answers, LISTEN is in force.
                        _ = try await connection.query("SELECT 1", logger: logger).collect()
                        state.withLock { $0.listening = true }
                        if lostConnection {
                            logger.notice("token database change feed is back; subscribers re-read what they hold", metadata: [
                                "store": .string(store),
                            ])
                        }
                        if lostConnection || startToAnnounce {
                            // What committed while deaf cannot be itemized: subscribers re-read.
                            broadcaster.emit(.unknown)
                        }
                        startToAnnounce = false
                        delay = configuration.feedReconnectInitial
                        lostConnection = false
                        for try await notification in notifications {
                            if let change = change(from: notification.payload) { broadcaster.emit(change) }
                        }
                    }
                }
            } catch {
                if Task.isCancelled || state.withLock({ $0.closed }) { return }
                let reason = PostgresFailure.storeError(error, store: store, statementTimeout: configuration.statementTimeout)
                if !lostConnection {
                    logger.warning("token database change feed lost its connection; reconnecting", metadata: [
                        "store": .string(store), "reason": .string(reason.description),
                    ])
                }
            }
            state.withLock { $0.listening = false }
            lostConnection = true
            do { try await Task.sleep(for: delay) } catch { return }
            delay = min(delay * 2, configuration.feedReconnectMaximum)
        }
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
