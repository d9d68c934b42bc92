// FleetTokenPostgres: knowing quickly that the database is gone. postgres-nio's pool keeps a
// request waiting while it retries connecting (until its circuit breaker, a minute later), so a
// call would take the whole statement timeout (10 s) while the server refuses every connection
// at once: each refresh's lease call would, and a short-lived token would lapse meanwhile. A
// request still waiting for a connection after `connectionWait` triggers one direct connection
// attempt; when that is refused too, the database is down: calls fail at once, and one call a
// second tries a direct connection again until one is not refused. With several hosts, that
// attempt looks for a fitting host (PostgresHostSelector) and moves the pool to it: this is how
// the store follows a promotion without a restart.
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

    private let selector: PostgresHostSelector
    private let pool: PostgresPool
    private let store: String
    /// How long between direct connection attempts while the database is down.
    static let probeInterval: Duration = .seconds(1)
    private let outage = Mutex<Outage?>(nil)
    private let logger: Logger

    /// Judges `pool`'s host; a probe looks for a fitting host with `selector` and moves the
    /// pool there when it is another one.
    init(selector: PostgresHostSelector, pool: PostgresPool, store: String, logger: Logger) {
        self.selector = selector
        self.pool = pool
        self.store = store
        self.logger = logger
    }

    /// A write was refused as read-only (SQLSTATE 25006): the host in use is a standby now
    /// (demoted, or a promotion elsewhere). With `read-write` or `primary`, the next call looks
    /// for the writable host at once; with `any` nothing changes.
    func hostRefusedWrite(_ error: TokenStoreError) {
        guard selector.choice.asksServer else { return }
        let first = outage.withLock { outage -> Bool in
            guard outage == nil else { return false }
            outage = Outage(error: error, nextProbe: .now)
            return true
        }
        if first {
            logger.warning("token database host refused a write as read-only; looking for the writable host", metadata: [
                "store": .string(store), "host": .string(selector.names[pool.hostIndex]),
            ])
        }
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

    /// Looks for a fitting host (``PostgresHostSelector``), the one in use first: one direct
    /// connection per host tried. Its TCP connect is bounded by the connect timeout (a dropped
    /// SYN is a refusal); the rest (TLS, authentication) only by the statement timeout, and
    /// running out of that decides nothing: it is what a machine too busy to finish a handshake
    /// looks like, not a missing database. A fitting host other than the one in use becomes
    /// the one in use (the pool moves; one warning names both hosts).
    private func probe() async -> ProbeResult {
        let before = pool.hostIndex
        switch await selector.find(current: before) {
        case .undecided: return .undecided
        case .refused(let error): return .refused(error)
        case .found(let index):
            if let from = pool.move(to: index) {
                logger.warning("token database moved to another host (the one in use failed or turned read-only)", metadata: [
                    "store": .string(store), "from": .string(selector.names[from]), "to": .string(selector.names[index]),
                ])
            }
            return .connected
        }
    }
}
