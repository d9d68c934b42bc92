// FleetTokenPostgres: PostgresStatementRunner, how every call of PostgresTokenRepository reaches
// the database (as SQLiteTransactionRunner does for the SQLite store): a pooled connection, the
// availability judgement, the statement timeout, and failures as TokenStoreError.
import FleetTokenStore
import Logging
import PostgresNIO
import Synchronization

/// Runs the repository's statements on its connection pool.
final class PostgresStatementRunner: Sendable {
    private let pool: PostgresPool
    private let availability: PostgresAvailability
    private let configuration: PostgresStoreConfiguration
    private let store: String
    private let logger: Logger
    private let closed = Atomic<Bool>(false)
    /// The schema and the statement timeout, set on each pooled connection at its first use.
    let session: PostgresSessionSettings

    init(pool: PostgresPool, availability: PostgresAvailability, configuration: PostgresStoreConfiguration,
         store: String, logger: Logger) {
        self.pool = pool
        self.availability = availability
        self.configuration = configuration
        self.store = store
        self.logger = logger
        self.session = PostgresSessionSettings(schema: configuration.location.schema, statementTimeout: configuration.statementTimeout)
    }

    /// Later calls fail with `TokenStoreError/Code/closed`.
    func close() {
        closed.store(true, ordering: .relaxed)
    }

    /// True while the database is judged down and calls fail at once.
    var isJudgedDown: Bool { availability.isDown }

    /// Runs `operation` on a pooled connection, with its failure as a store error. It fails at
    /// once while the database is known to be down or a search for a missing connection runs
    /// (see `PostgresAvailability`); a connection not leased, or a statement not answered,
    /// within ``PostgresStoreConfiguration/connectionWait`` starts a search, waited for at most
    /// as long; a move to another host meanwhile runs the call there once more; the whole call
    /// is bounded by the statement timeout (the server ends the statement then too).
    func perform<T: Sendable>(_ operation: @escaping @Sendable (PostgresConnection) async throws -> T) async throws(TokenStoreError) -> T {
        guard !closed.load(ordering: .relaxed) else { throw .closed(path: store) }
        try availability.admit()
        // One deadline for the call, a retry after a move included.
        let deadline = ContinuousClock.now + configuration.statementTimeout + .seconds(1)
        var retried = false
        while true {
            // The client of the host in use now: a search may just have moved to another, whose
            // connections need their session settings again (their ids start over).
            let (client, generation) = pool.clientAndGeneration
            let leased = LeaseFlag()
            do {
                return try await once(operation, client: client, generation: generation, leased: leased, deadline: deadline)
            } catch {
                // The pool moved to another host while this call waited for a connection of the
                // old one, or for the answer to its statement there (its connection closed with
                // the old pool, or silent): it runs once more on the new host instead of failing
                // (a failed lease call would fetch without the lease). A statement the old host
                // may have run is run again: every statement of the store can be (upserts,
                // deletes, a lease claim by holder).
                if !retried, pool.clientAndGeneration.generation != generation, !closed.load(ordering: .relaxed) {
                    retried = true
                    continue
                }
                // No answer at all past the statement timeout (a live server ends the statement
                // then, with an error): the connection is silent, and so may be every other of
                // the pool (a host whose address moved, a dropped flow). The pool starts afresh;
                // calls waiting on the old connections run once more on the new ones.
                // (Only when the server had the statement for its whole timeout: a call that
                // got its connection late, or runs again after a move, ends at its deadline
                // without saying anything of the connection.)
                if error is PostgresFailure.DeadlinePassed, let since = leased.since, ContinuousClock.now - since >= configuration.statementTimeout,
                   pool.renew(from: generation) {
                    logger.warning("a statement got no answer from the token database, not even at its timeout; the pool's connections are replaced", metadata: [
                        "store": .string(store), "statement_timeout": .stringConvertible(configuration.statementTimeout),
                    ])
                }
                let failure = PostgresFailure.storeError(error, store: store, statementTimeout: configuration.statementTimeout)
                // read_only_sql_transaction: the host is a standby now; the next call looks for the writable one.
                if failure.sqlState == "25006" { availability.hostRefusedWrite(failure) }
                throw failure
            }
        }
    }

    /// One attempt of ``perform(_:)`` on `client`, until `deadline`, or until the pool moves
    /// away from `client`'s host (``PostgresFailure/HostMoved``).
    private func once<T: Sendable>(_ operation: @escaping @Sendable (PostgresConnection) async throws -> T, client: PostgresClient,
                                   generation: Int, leased: LeaseFlag, deadline: ContinuousClock.Instant) async throws -> T {
        let availability = self.availability, session = self.session, logger = self.logger, pool = self.pool
        let wait = configuration.connectionWait
        // A race rather than a task group: a group would wait for its statement, and a query or
        // a connection request waits for the server whatever the cancellation (PostgresFailure.race).
        return try await PostgresFailure.race({
            try await client.withConnection { connection in
                leased.set()
                try await session.prepare(connection, generation: generation, logger: logger)
                return try await operation(connection)
            }
        }, timer: {
            try await Task.sleep(for: wait)
            // No connection yet, or no answer yet: is the host there? Only a new connection
            // tells, as one that lost power leaves the pool's connections open and silent.
            if let down = await availability.callIsSlow(wait: wait, leased: leased.isSet) { throw down }
            try await pool.waitForMove(from: generation, until: deadline)
        })
    }

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

    /// Runs `sql`, which changes rows and returns none.
    func execute(_ sql: String, _ bindings: PostgresBindings) async throws(TokenStoreError) {
        _ = try await rows(sql, bindings) { _ in nil as Int? }
    }

    /// Runs `sql`, whose one row is a count.
    func count(_ sql: String, _ bindings: PostgresBindings = PostgresBindings()) async throws(TokenStoreError) -> Int {
        try await rows(sql, bindings) { Int(try $0.decode(Int64.self)) }.first ?? 0
    }

    /// Runs `sql`, whose rows are (kind, subject id) pairs; a kind this build does not know is skipped.
    func keys(_ sql: String, _ bindings: PostgresBindings) async throws(TokenStoreError) -> [TokenKey] {
        try await rows(sql, bindings) { row in
            let (kind, subject) = try row.decode((String, String).self)
            return TokenKind(rawValue: kind).map { TokenKey(uncheckedKind: $0, subjectID: subject) }
        }
    }
}

/// Set once a pooled connection is leased (when), read by the call's timer and its end.
private final class LeaseFlag: Sendable {
    private let leasedAt = Mutex<ContinuousClock.Instant?>(nil)
    func set() { leasedAt.withLock { $0 = .now } }
    var isSet: Bool { since != nil }
    /// When the connection was leased; nil before.
    var since: ContinuousClock.Instant? { leasedAt.withLock { $0 } }
}
