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
    /// Calls that ended at their deadline while their statements still ran (see ``SilenceSuspects``).
    private let suspects = Mutex(SilenceSuspects())
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
        renewIfSilent()
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
                // Past its deadline on a connection the server had for its whole statement
                // timeout: a suspect, judged by a later call (a slow server answers meanwhile; a
                // silent connection never does).
                if error is PostgresFailure.DeadlinePassed, let since = leased.since, ContinuousClock.now - since >= configuration.statementTimeout {
                    let judgeAt = ContinuousClock.now + configuration.statementTimeout * 2 + .seconds(1)
                    suspects.withLock { $0.add(generation: generation, operation: leased, judgeAt: judgeAt) }
                }
                let failure = PostgresFailure.storeError(error, store: store, statementTimeout: configuration.statementTimeout)
                // read_only_sql_transaction: the host is a standby now; the next call looks for the writable one.
                if failure.sqlState == "25006" { availability.hostRefusedWrite(failure) }
                throw failure
            }
        }
    }

    /// Renews the pool when a suspect's operation still runs at its judging time: its
    /// connection is silent, and so may be every other of the pool (a host whose address moved,
    /// a dropped flow), which the pool never gives up by itself. Calls waiting on the old
    /// connections run once more on the new ones.
    private func renewIfSilent() {
        guard let generation = suspects.withLock({ $0.silentGeneration(now: .now) }), pool.renew(from: generation) else { return }
        logger.warning("a statement got no answer from the token database long past its timeout; the pool's connections are replaced", metadata: [
            "store": .string(store), "statement_timeout": .stringConvertible(configuration.statementTimeout),
        ])
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
                defer { leased.finish() }
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

/// Set once a pooled connection is leased (when), and once the operation on it has ended
/// (however: a call past its deadline leaves it running); read by the call's timer, its end
/// and ``SilenceSuspects``.
final class LeaseFlag: Sendable {
    private let leasedAt = Mutex<ContinuousClock.Instant?>(nil)
    private let ended = Atomic<Bool>(false)
    func set() { leasedAt.withLock { $0 = .now } }
    func finish() { ended.store(true, ordering: .relaxed) }
    var isSet: Bool { since != nil }
    /// When the connection was leased; nil before.
    var since: ContinuousClock.Instant? { leasedAt.withLock { $0 } }
    /// The operation on the connection has ended.
    var isFinished: Bool { ended.load(ordering: .relaxed) }
}

/// Calls that ended at their deadline while their operation still ran, on a connection the
/// server had for at least its statement timeout. A live server ends each statement by then,
/// with an error; an operation still running when judged (two statement timeouts and a second
/// later: one statement begun just before the deadline, and one more, may still end on a slow
/// server) is on a silent connection. Judged at later calls' start: no task of its own.
struct SilenceSuspects: Sendable {
    struct Suspect: Sendable {
        let generation: Int
        let operation: LeaseFlag
        let judgeAt: ContinuousClock.Instant
    }

    /// At most this many wait (the oldest go first): one found silent renews the whole pool.
    static let limit = 32
    private(set) var waiting: [Suspect] = []

    mutating func add(generation: Int, operation: LeaseFlag, judgeAt: ContinuousClock.Instant) {
        if waiting.count >= Self.limit { waiting.removeFirst() }
        waiting.append(Suspect(generation: generation, operation: operation, judgeAt: judgeAt))
    }

    /// The pool generation of a suspect whose operation still runs at its judging time, if
    /// any; every suspect judged (due, or ended) is dropped.
    mutating func silentGeneration(now: ContinuousClock.Instant) -> Int? {
        guard !waiting.isEmpty else { return nil }
        var silent: Int?
        waiting.removeAll { suspect in
            if suspect.operation.isFinished { return true }
            guard now >= suspect.judgeAt else { return false }
            silent = max(silent ?? suspect.generation, suspect.generation)
            return true
        }
        return silent
    }
}
