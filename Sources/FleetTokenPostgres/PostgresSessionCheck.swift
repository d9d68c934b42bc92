// FleetTokenPostgres: the check at open that each of the store's connections is a session of its
// own on the server. A pooler in transaction or statement mode (PgBouncer's pool_mode =
// transaction) hands a client's server session to other clients between transactions: LISTEN
// would hear nothing once its transaction ended (replicas would miss every change, silently),
// an advisory lock would stay with a session someone else now uses, and the session's settings
// (search_path, statement_timeout) would be lost. So the store refuses to open there, and says why.
//
// The probe: which server process (pg_backend_pid()) answers each statement, for two client
// connections A and B in turn: A, then B, then A again. Directly or through a session pooler, A
// is answered by one backend throughout, and B by another. A pooler that shares sessions shows
// it either way: B answered by A's backend (PgBouncer gives back the session used last, LIFO,
// by default), or A answered by a second backend (round robin, or a busy pool). Blind spot: a
// sharing pooler that, in every round, happens to give A the same session twice and B another
// one; three rounds make that unlikely, not impossible.
import FleetTokenStore
import Logging
import PostgresNIO

/// What the backend process ids seen by the probe say: pure, decided here only.
struct PostgresSessionProbe: Equatable, Sendable {
    /// The backends that answered one round: A, then B, then A again.
    struct Round: Equatable, Sendable {
        var first: Int32
        var other: Int32
        var firstAgain: Int32
    }

    /// How many rounds the check runs before it trusts that sessions are kept.
    static let rounds = 3

    /// What shows that sessions are shared in `round`: one backend answering both client
    /// connections, or one connection answered by two backends; nil when this round shows neither.
    static func evidence(in round: Round) -> String? {
        if round.other == round.first || round.other == round.firstAgain {
            return "server process \(round.other) answered two client connections in turn"
        }
        if round.firstAgain != round.first {
            return "one client connection was answered by server process \(round.first), then by \(round.firstAgain)"
        }
        return nil
    }
}

/// Refuses a database reached through a pooler that does not keep one server session per client
/// connection (see the file's comment for the probe and its blind spot).
struct PostgresSessionCheck: Sendable {
    let store: String
    /// How long the second connection may take to be answered: a session pooler whose pool
    /// is full makes it wait.
    let limit: Duration
    let logger: Logger

    /// Checks `connection` (A) against a second connection made by `connectAnother` (B, closed
    /// before returning).
    /// - Throws: `TokenStoreError/Code/sessionPoolingRequired` when sessions are shared;
    ///   `TokenStoreError/Code/databaseUnavailable` when the second connection got no answer in
    ///   time; what the connections throw.
    func verify(_ connection: PostgresConnection,
                connectAnother: @escaping @Sendable () async throws -> PostgresConnection) async throws {
        let logger = self.logger
        let another: PostgresConnection
        do {
            another = try await PostgresFailure.withDeadline(limit) {
                let another = try await connectAnother()
                // The first answer proves the pooler gave it a session, not just a socket.
                _ = try await Self.backend(of: another, logger: logger)
                return another
            }
        } catch is PostgresFailure.DeadlinePassed {
            throw TokenStoreError.databaseUnavailable(path: store, reason: "a second connection got no answer within \(limit); "
                + "behind a pooler in session mode, its pool for this database must allow the store's connections at once (pool size)")
        }
        do {
            try await compare(connection, another)
        } catch {
            try? await another.close()
            throw error
        }
        try? await another.close()
    }

    private func compare(_ connection: PostgresConnection, _ another: PostgresConnection) async throws {
        for _ in 0..<PostgresSessionProbe.rounds {
            let round = PostgresSessionProbe.Round(first: try await Self.backend(of: connection, logger: logger),
                                                   other: try await Self.backend(of: another, logger: logger),
                                                   firstAgain: try await Self.backend(of: connection, logger: logger))
            if let evidence = PostgresSessionProbe.evidence(in: round) {
                throw TokenStoreError.sessionPoolingRequired(path: store, evidence: evidence)
            }
        }
    }

    private static func backend(of connection: PostgresConnection, logger: Logger) async throws -> Int32 {
        var pid: Int32 = 0
        for try await value in try await connection.query("SELECT pg_backend_pid()", logger: logger).decode(Int32.self) {
            pid = value
        }
        return pid
    }
}
