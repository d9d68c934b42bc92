// FleetTokenPostgres: a postgres-nio failure as the store's typed error, and the deadline every
// operation runs under. Only the server's SQLSTATE and message are kept: postgres-nio's errors
// can carry the statement and its bound values (tokens), which must never reach a log.
import FleetTokenStore
import Foundation
import PostgresNIO

enum PostgresFailure {
    /// `error` (anything an operation threw) as the store's error for `store`.
    static func storeError(_ error: any Error, store: String, statementTimeout: Duration) -> TokenStoreError {
        if let error = error as? TokenStoreError { return error }
        if let error = error as? PSQLError {
            if error.code == .server, let state = error.serverInfo?[.sqlState] {
                let message = error.serverInfo?[.message] ?? "no message"
                // Class 08 (connection), 57 (operator intervention: shutdown, cancel, timeout),
                // 53 (insufficient resources): the database is not there for us right now.
                if state == "57014" {
                    return .databaseUnavailable(path: store, reason: "a statement ran past the statement timeout (\(statementTimeout))")
                }
                // Class 28: the password or the user was refused; 3D000: no such database.
                if state.hasPrefix("08") || state.hasPrefix("57") || state.hasPrefix("53") || state.hasPrefix("28")
                    || state == "3D000" {
                    return .databaseUnavailable(path: store, reason: "\(message) (SQLSTATE \(state))")
                }
                return .database(path: store, sqlState: state, message: message)
            }
            return .databaseUnavailable(path: store, reason: connectionReason(error.code))
        }
        if error is CancellationError || error is DeadlinePassed {
            return .databaseUnavailable(path: store, reason: "no answer within \(statementTimeout)")
        }
        // The pool's, NIO's socket and TLS failures: their descriptions name addresses, not data.
        return .databaseUnavailable(path: store, reason: String(describing: error))
    }

    private static func connectionReason(_ code: PSQLError.Code) -> String {
        switch code {
        case .sslUnsupported: "the server does not offer TLS, which sslmode asks for"
        case .serverClosedConnection, .uncleanShutdown: "the server closed the connection"
        case .clientClosedConnection, .poolClosed: "the connection was closed"
        case .authMechanismRequiresPassword: "the server asks for a password and none was given (URL, PGPASSWORD or a password file)"
        case .unsupportedAuthMechanism: "the server asks for an authentication method this client does not support"
        case .saslError: "password authentication failed"
        case .queryCancelled: "the statement was cancelled"
        case .failedToAddSSLHandler: "TLS could not be set up"
        default: "connection failed (\(code))"
        }
    }

    /// Thrown by ``withDeadline(_:_:)`` when the time passed.
    struct DeadlinePassed: Error {}

    /// Runs `operation`, ending it (by cancellation) when `limit` passes first: a pool waiting
    /// for a server that is down would otherwise hold the caller until its circuit breaker.
    static func withDeadline<T: Sendable>(_ limit: Duration, _ operation: @escaping @Sendable () async throws -> T) async throws -> T {
        try await withThrowingTaskGroup(of: T?.self) { group in
            group.addTask { try await operation() }
            group.addTask {
                try await Task.sleep(for: limit)
                return nil
            }
            defer { group.cancelAll() }
            guard let first = try await group.next() else { throw DeadlinePassed() }
            guard let value = first else { throw DeadlinePassed() }
            return value
        }
    }
}
