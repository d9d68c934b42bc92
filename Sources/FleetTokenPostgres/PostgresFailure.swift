// FleetTokenPostgres: a postgres-nio failure as the store's typed error, and the deadline every
// operation runs under. Only the server's SQLSTATE and message are kept: postgres-nio's errors
// can carry the statement and its bound values (tokens), which must never reach a log.
import FleetTokenStore
import Foundation
import NIOCore
import PostgresNIO
import Synchronization

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
            return .databaseUnavailable(path: store, reason: connectionReason(error))
        }
        if error is HostMoved {
            return .databaseUnavailable(path: store, reason: "the store moved to another host while the statement waited for an answer")
        }
        if error is DeadlinePassed {
            return .databaseUnavailable(path: store, reason: "no answer within \(statementTimeout)")
        }
        // The caller's own cancellation (a stopping engine, a request whose client left): the
        // database was not judged at all, so the reason must not claim a timeout.
        if error is CancellationError {
            return .databaseUnavailable(path: store, reason: "the call was cancelled before the database answered")
        }
        // The pool's, NIO's socket and TLS failures: their descriptions name addresses, not data.
        return .databaseUnavailable(path: store, reason: String(describing: error))
    }

    private static func connectionReason(_ error: PSQLError) -> String {
        switch error.code {
        // The socket's, the connect deadline's or TLS's own failure: what an operator acts on
        // (refused, timed out, a certificate not trusted). It names addresses, never a statement.
        case .connectionError: error.underlying.map(describeConnectionFailure) ?? "the connection failed"
        case .sslUnsupported: "the server does not offer TLS, which sslmode asks for"
        case .serverClosedConnection, .uncleanShutdown: "the server closed the connection"
        case .clientClosedConnection, .poolClosed: "the connection was closed"
        case .authMechanismRequiresPassword: "the server asks for a password and none was given (URL, PGPASSWORD or a password file)"
        case .unsupportedAuthMechanism: "the server asks for an authentication method this client does not support"
        case .saslError: "password authentication failed"
        case .queryCancelled: "the statement was cancelled"
        case .failedToAddSSLHandler: "TLS could not be set up"
        default: "connection failed (\(error.code))"
        }
    }

    private static func describeConnectionFailure(_ underlying: any Error) -> String {
        if case ChannelError.connectTimeout(let limit) = underlying {
            return "no connection within \(Double(limit.nanoseconds) / 1e9) s (connectTimeout)"
        }
        return "could not connect: \(underlying)"
    }

    /// Thrown by ``withDeadline(_:_:)`` when the time passed.
    struct DeadlinePassed: Error {}

    /// A call's host is no longer the one in use (the pool moved): its statement may never be
    /// answered there (a host that lost power keeps its connections open and silent).
    struct HostMoved: Error {}

    /// Runs `operation`, ending it (by cancellation) when `limit` passes first: a pool waiting
    /// for a server that is down would otherwise hold the caller until its circuit breaker.
    static func withDeadline<T: Sendable>(_ limit: Duration, _ operation: @escaping @Sendable () async throws -> T) async throws -> T {
        try await race(operation, timer: { try await Task.sleep(for: limit) })
    }

    /// Runs `operation` against `timer`: the caller gets what comes first, `operation`'s result
    /// or `timer`'s error (`DeadlinePassed` when `timer` returns), and the other is cancelled.
    ///
    /// The caller gets its answer at once even if the loser ignores the cancellation (a
    /// postgres-nio query or connection request may wait whatever happens): a task group would
    /// wait for it, and a refresh flight held that way kept its fetch slot until every slot was
    /// held and the agent stopped refreshing. So each runs in a task of its own, left to end by
    /// itself once the caller has its answer.
    static func race<T: Sendable>(_ operation: @escaping @Sendable () async throws -> T,
                                  timer: @escaping @Sendable () async throws -> Void) async throws -> T {
        let race = DeadlineRace<T>()
        return try await withTaskCancellationHandler {
            try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<T, any Error>) in
                race.start(continuation, timer: timer, operation)
            }
        } onCancel: {
            race.finish(.failure(CancellationError()))
        }
    }
}

/// The first of `operation`'s result, its timer, or the caller's cancellation answers the
/// caller (see ``PostgresFailure/race(_:timer:)``); the others are ignored.
private final class DeadlineRace<T: Sendable>: Sendable {
    private struct State: Sendable {
        var continuation: CheckedContinuation<T, any Error>?
        var tasks: [Task<Void, Never>] = []
        /// An answer that came before ``start(_:limit:_:)`` (the caller was cancelled already).
        var early: Result<T, any Error>?
        var finished = false
    }

    private let state = Mutex(State())

    func start(_ continuation: CheckedContinuation<T, any Error>, timer: @escaping @Sendable () async throws -> Void,
               _ operation: @escaping @Sendable () async throws -> T) {
        let early = state.withLock { state -> Result<T, any Error>? in
            if state.finished { return state.early }
            state.continuation = continuation
            return nil
        }
        if let early {
            continuation.resume(with: early)
            return
        }
        let work = Task {
            do { self.finish(.success(try await operation())) } catch { self.finish(.failure(error)) }
        }
        let clock = Task {
            do {
                try await timer()
                self.finish(.failure(PostgresFailure.DeadlinePassed()))
            } catch {
                self.finish(.failure(error))
            }
        }
        let answered = state.withLock { state -> Bool in
            if !state.finished { state.tasks = [work, clock] }
            return state.finished
        }
        if answered {
            work.cancel()
            clock.cancel()
        }
    }

    func finish(_ result: Result<T, any Error>) {
        let (continuation, tasks) = state.withLock { state -> (CheckedContinuation<T, any Error>?, [Task<Void, Never>]) in
            guard !state.finished else { return (nil, []) }
            state.finished = true
            if state.continuation == nil { state.early = result }
            defer {
                state.continuation = nil
                state.tasks = []
            }
            return (state.continuation, state.tasks)
        }
        continuation?.resume(with: result)
        for task in tasks { task.cancel() }
    }
}
