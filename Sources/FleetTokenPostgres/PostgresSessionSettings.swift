// FleetTokenPostgres: the settings every session of the store runs with (the schema as
// search_path, the statement timeout), set by a statement on each connection's first use rather
// than as startup parameters: PgBouncer refuses a startup packet carrying parameters it does not
// track ("unsupported startup parameter: search_path"), so a store behind it could not connect
// at all. A SET of the session's own lasts as long as the session, which the store needs anyway
// (LISTEN, advisory locks): PostgresSessionCheck refuses a pooler that does not keep sessions.
import Logging
import PostgresNIO
import Synchronization

/// Sets `search_path` and `statement_timeout` once on each connection the store uses.
final class PostgresSessionSettings: Sendable {
    private let schema: String
    /// `statement_timeout` in milliseconds, as PostgreSQL reads it.
    private let statementTimeoutMilliseconds: String
    /// The pool's connections already set, by pool generation (a new pool, after a move to
    /// another host, numbers its connections from the start again). Bounded: a connection
    /// forgotten here is only set once more (the settings are idempotent), while a set that
    /// kept every id would grow with every reconnect over months.
    private let prepared = Mutex(PreparedConnections())

    init(schema: String, statementTimeout: Duration) {
        self.schema = schema
        let parts = statementTimeout.components
        self.statementTimeoutMilliseconds = String(max(1, parts.seconds * 1000 + parts.attoseconds / 1_000_000_000_000_000))
    }

    /// Sets the session's settings on `connection`, a connection of the pool of `generation`,
    /// the first time it is used.
    func prepare(_ connection: PostgresConnection, generation: Int, logger: Logger) async throws {
        guard !prepared.withLock({ $0.contains(connection.id, generation: generation) }) else { return }
        try await apply(to: connection, logger: logger)
        prepared.withLock { $0.insert(connection.id, generation: generation) }
    }

    /// Sets the session's settings on `connection` (a direct one: opening, migrating).
    func apply(to connection: PostgresConnection, logger: Logger) async throws {
        var bindings = PostgresBindings()
        bindings.append(schema)
        bindings.append(statementTimeoutMilliseconds)
        // One statement, one round trip; `false`: for the session, not just a transaction.
        _ = try await connection.query(PostgresQuery(unsafeSQL: """
            SELECT set_config('search_path', $1, false), set_config('statement_timeout', $2, false)
            """, binds: bindings), logger: logger).collect()
    }
}

/// The connections whose session is set: those of the newest pool generation seen, at most
/// ``limit`` of them (the oldest ids go first: postgres-nio never reuses an id in one pool).
struct PreparedConnections: Sendable {
    static let limit = 64
    private(set) var generation = 0
    private(set) var ids: Set<PostgresConnection.ID> = []

    func contains(_ id: PostgresConnection.ID, generation: Int) -> Bool {
        generation == self.generation && ids.contains(id)
    }

    /// Records `id`; a call finishing on an older pool's connection records nothing.
    mutating func insert(_ id: PostgresConnection.ID, generation: Int) {
        if generation > self.generation {
            self.generation = generation
            ids.removeAll()
        }
        guard generation == self.generation else { return }
        ids.insert(id)
        if ids.count > Self.limit, let oldest = ids.min() { ids.remove(oldest) }
    }
}
