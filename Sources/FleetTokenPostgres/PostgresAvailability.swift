// FleetTokenPostgres: knowing quickly that the database is gone. postgres-nio's pool keeps a
// request waiting while it retries connecting (until its circuit breaker, a minute later), so a
// call would take the whole statement timeout (10 s) while the server refuses every connection
// at once: each refresh's lease call would, and a short-lived token would lapse meanwhile. A
// request still waiting for a connection after `connectionWait` triggers one direct connection
// attempt; when that is refused too, the database is down: calls fail at once, and one call a
// second tries a direct connection again until one is not refused.
import FleetTokenStore
import Logging
import PostgresNIO
import Synchronization

final class PostgresAvailability: Sendable {
    private struct Outage {
        var error: TokenStoreError
        /// When the next call may try a direct connection.
        var nextProbe: ContinuousClock.Instant
        /// A call is trying one now: the others still fail at once.
        var probing = false
    }

    private let direct: PostgresConnection.Configuration
    private let store: String
    private let statementTimeout: Duration
    /// How long between direct connection attempts while the database is down.
    static let probeInterval: Duration = .seconds(1)
    private let outage = Mutex<Outage?>(nil)
    private let logger: Logger

    init(direct: PostgresConnection.Configuration, store: String, statementTimeout: Duration, logger: Logger) {
        self.direct = direct
        self.store = store
        self.statementTimeout = statementTimeout
        self.logger = logger
    }

    /// True while the database is judged down (for tests).
    var isDown: Bool { outage.withLock { $0 != nil } }

    /// Before a call: throws the outage's error at once while the database is down, except for
    /// one call a second, which tries a direct connection and goes ahead unless it is refused.
    func admit() async throws(TokenStoreError) {
        enum Admission { case go, fail(TokenStoreError), probe }
        let admission = outage.withLock { outage -> Admission in
            guard var current = outage else { return .go }
            guard !current.probing, ContinuousClock.now >= current.nextProbe else { return .fail(current.error) }
            current.probing = true
            outage = current
            return .probe
        }
        switch admission {
        case .go: return
        case .fail(let error): throw error
        case .probe:
            if case .refused(let error) = await probe() {
                outage.withLock { $0 = Outage(error: error, nextProbe: .now + Self.probeInterval) }
                throw error
            }
            outage.withLock { $0 = nil }
            logger.notice("token database reachable again", metadata: ["store": .string(store)])
        }
    }

    /// A call waited `connectionWait` for a connection: is the database there? Nil when a
    /// direct connection works or is merely slow (a busy pool, a loaded machine); the error
    /// when it is refused or fails (the server down, the network unreachable, the TCP connect
    /// timing out), and from now on the database is judged down.
    func connectionIsSlow() async -> TokenStoreError? {
        if let current = outage.withLock({ $0?.error }) { return current }
        guard case .refused(let error) = await probe() else { return nil }
        let first = outage.withLock { outage -> Bool in
            defer { if outage == nil { outage = Outage(error: error, nextProbe: .now + Self.probeInterval) } }
            return outage == nil
        }
        if first {
            logger.warning("token database unreachable; calls fail at once until it answers again", metadata: [
                "store": .string(store), "reason": .string(error.description),
            ])
        }
        return error
    }

    private enum ProbeResult { case connected, refused(TokenStoreError), undecided }

    /// One direct connection attempt. Its TCP connect is bounded by the connect timeout (a
    /// dropped SYN is a refusal); the rest (TLS, authentication) only by the statement timeout,
    /// and running out of that decides nothing: it is what a machine too busy to finish a
    /// handshake looks like, not a missing database.
    private func probe() async -> ProbeResult {
        let direct = self.direct, logger = self.logger.withLevelAtLeast(.error)
        do {
            try await PostgresFailure.withDeadline(statementTimeout) {
                let connection = try await PostgresConnection.connect(configuration: direct, id: 0, logger: logger)
                try? await connection.close()
            }
            return .connected
        } catch is PostgresFailure.DeadlinePassed {
            return .undecided
        } catch {
            return .refused(PostgresFailure.storeError(error, store: store, statementTimeout: statementTimeout))
        }
    }
}
