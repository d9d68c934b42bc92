// FleetTokenPostgres: PostgresStatementRunner, how every call of PostgresTokenRepository reaches
// the database (as SQLiteTransactionRunner does for the SQLite store): a pooled connection, the
// availability judgement, the statement timeout, and failures as TokenStoreError.
import FleetTokenStore
import Logging
import PostgresNIO
import Synchronization

/// Runs the repository's statements on its connection pool.
final class PostgresStatementRunner: Sendable {
    private let client: PostgresClient
    private let availability: PostgresAvailability
    private let configuration: PostgresStoreConfiguration
    private let store: String
    private let logger: Logger
    private let closed = Atomic<Bool>(false)

    init(client: PostgresClient, availability: PostgresAvailability, configuration: PostgresStoreConfiguration,
         store: String, logger: Logger) {
        self.client = client
        self.availability = availability
        self.configuration = configuration
        self.store = store
        self.logger = logger
    }

    /// Later calls fail with `TokenStoreError/Code/closed`.
    func close() {
        closed.store(true, ordering: .relaxed)
    }

    /// True while the database is judged down and calls fail at once.
    var isJudgedDown: Bool { availability.isDown }

    /// Runs `operation` on a pooled connection, with its failure as a store error. It fails at
    /// once while the database is known to be down (see `PostgresAvailability`); a connection
    /// not leased within ``PostgresStoreConfiguration/connectionWait`` makes it find out; the
    /// whole call is bounded by the statement timeout (the server ends the statement then too).
    func perform<T: Sendable>(_ operation: @escaping @Sendable (PostgresConnection) async throws -> T) async throws(TokenStoreError) -> T {
        guard !closed.load(ordering: .relaxed) else { throw .closed(path: store) }
        try await availability.admit()
        let client = self.client, availability = self.availability
        let wait = configuration.connectionWait, limit = configuration.statementTimeout + .seconds(1)
        let leased = LeaseFlag()
        do {
            return try await withThrowingTaskGroup(of: T?.self) { group in
                group.addTask {
                    try await client.withConnection { connection in
                        leased.set()
                        return try await operation(connection)
                    }
                }
                group.addTask {
                    let deadline = ContinuousClock.now + limit
                    try await Task.sleep(for: wait)
                    if !leased.isSet, let down = await availability.connectionIsSlow() { throw down }
                    try await Task.sleep(until: deadline, clock: .continuous)
                    return nil
                }
                defer { group.cancelAll() }
                guard let first = try await group.next(), let value = first else { throw PostgresFailure.DeadlinePassed() }
                return value
            }
        } catch {
            throw PostgresFailure.storeError(error, store: store, statementTimeout: configuration.statementTimeout)
        }
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

/// Set once a pooled connection is leased, read by the call's timer.
private final class LeaseFlag: Sendable {
    private let leased = Atomic<Bool>(false)
    func set() { leased.store(true, ordering: .relaxed) }
    var isSet: Bool { leased.load(ordering: .relaxed) }
}
