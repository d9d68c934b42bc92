// FleetTokenPostgres: knowing quickly that the database is gone. postgres-nio's pool keeps a
// request waiting while it retries connecting (until its circuit breaker, a minute later), so a
// call would take the whole statement timeout (10 s) while the server refuses every connection
// at once: each refresh's lease call would, and a short-lived token would lapse meanwhile. A
// request still waiting for a connection after `connectionWait` triggers a search (a direct
// connection per host); when every host refuses, the database is down: calls fail at once, and
// one call a second starts a search again until one is not refused. With several hosts, the
// search looks for a fitting host (PostgresHostSelector) and moves the pool to it: this is how
// the store follows a promotion without a restart.
//
// One search at a time, run by run() (a child task of the repository's background work), and
// no call waits for it beyond `connectionWait`: a host that is starting up can hold a search up
// to the statement timeout, and a refresh's lease call waiting that long kept its API callers
// past their own timeouts. While a search for a missing connection runs or the database is
// judged down, calls fail at once as unavailable, so the engine fetches without the lease, as it
// does when the database is down. A statement unanswered after `connectionWait` asks for a
// search too, but calls go on meanwhile: a host that lost power (or its network) leaves its
// connections open and silent, so calls holding them would wait their whole statement timeout
// and no call would ever miss a connection; only a new connection tells.
import FleetTokenStore
import Logging
import PostgresNIO
import Synchronization

final class PostgresAvailability: Sendable {
    private struct Outage {
        var error: TokenStoreError
        /// When the next call may start a search.
        var nextProbe: ContinuousClock.Instant
    }

    private struct State {
        var outage: Outage?
        /// A search was asked for or runs: no second one starts.
        var searching = false
        /// The search runs because a call got no connection (calls fail at once until it ends),
        /// not only because a statement was slow to answer (calls go on meanwhile).
        var searchBlocksCalls = false
        /// Calls waiting (each at most its `connectionWait`) for the search to end.
        var waiters: [CheckedContinuation<Void, Never>] = []
    }

    private let selector: PostgresHostSelector
    private let pool: PostgresPool
    private let store: String
    /// How long between searches while the database is down.
    static let probeInterval: Duration = .seconds(1)
    private let state = Mutex(State())
    private let requests: AsyncStream<Void>
    private let request: AsyncStream<Void>.Continuation
    private let logger: Logger

    /// Judges `pool`'s host; a search looks for a fitting host with `selector` and moves the
    /// pool there when it is another one.
    init(selector: PostgresHostSelector, pool: PostgresPool, store: String, logger: Logger) {
        self.selector = selector
        self.pool = pool
        self.store = store
        self.logger = logger
        (requests, request) = AsyncStream.makeStream(bufferingPolicy: .bufferingNewest(1))
    }

    /// Runs the searches calls ask for, one at a time, until the calling task is cancelled.
    func run() async {
        for await _ in requests {
            await search()
        }
        // Cancelled: no search will end the waits.
        let waiters = state.withLock { state in
            defer { state.waiters = [] }
            return state.waiters
        }
        for waiter in waiters { waiter.resume() }
    }

    /// A write was refused as read-only (SQLSTATE 25006): the host in use is a standby now
    /// (demoted, or a promotion elsewhere). With `read-write` or `primary`, the next call looks
    /// for the writable host at once; with `any` nothing changes.
    func hostRefusedWrite(_ error: TokenStoreError) {
        guard selector.choice.asksServer else { return }
        let first = state.withLock { state -> Bool in
            guard state.outage == nil else { return false }
            state.outage = Outage(error: error, nextProbe: .now)
            return true
        }
        if first {
            logger.warning("token database host refused a write as read-only; looking for the writable host", metadata: [
                "store": .string(store), "host": .string(selector.names[pool.hostIndex]),
            ])
        }
    }

    /// True while the database is judged down (for tests).
    var isDown: Bool { state.withLock { $0.outage != nil } }

    /// True while a host search is asked for or runs (for tests).
    var isSearching: Bool { state.withLock { $0.searching } }

    /// Before a call: throws at once while the database is judged down or a search for a
    /// missing connection runs; once a second while down, the call starts a search (and still
    /// fails: it does not wait for it).
    func admit() throws(TokenStoreError) {
        let (failure, start) = state.withLock { state -> (TokenStoreError?, Bool) in
            if state.searching, state.searchBlocksCalls { return (state.outage?.error ?? searchRunning(), false) }
            guard let outage = state.outage else { return (nil, false) }
            guard !state.searching, ContinuousClock.now >= outage.nextProbe else { return (outage.error, false) }
            state.searching = true
            state.searchBlocksCalls = true
            return (outage.error, true)
        }
        if start { request.yield() }
        if let failure { throw failure }
    }

    /// A call waited `connectionWait` for a connection (`leased` false), or for the answer to
    /// its statement: is the database there? It starts a search unless one runs, and waits
    /// for it at most `wait` more. Nil when a direct connection works or is merely slow (a busy
    /// pool, a loaded machine, a long statement); the error when it is refused or fails (from
    /// now on the database is judged down), or when a search started for a missing connection
    /// has not ended within `wait` (this call fails as unavailable; the search goes on).
    ///
    /// A search for a slow answer lets other calls go on while it runs: a long statement is
    /// no sign of a missing database. It is asked all the same, because a host that lost power
    /// or its network keeps its connections open and silent: only a new connection tells.
    func callIsSlow(wait: Duration, leased: Bool) async -> TokenStoreError? {
        let (down, start) = state.withLock { state -> (TokenStoreError?, Bool) in
            if let outage = state.outage { return (outage.error, false) }
            if !leased { state.searchBlocksCalls = true }
            if state.searching { return (nil, false) }
            state.searching = true
            return (nil, true)
        }
        if let down { return down }
        if start { request.yield() }
        _ = try? await PostgresFailure.withDeadline(wait) { await self.searchEnded() }
        return state.withLock { state in
            if let outage = state.outage { return outage.error }
            return state.searching && !leased ? searchRunning() : nil
        }
    }

    private func searchRunning() -> TokenStoreError {
        .databaseUnavailable(path: store, reason: "looking for a fitting database host; calls fail at once until it ends")
    }

    /// Returns once no search runs.
    private func searchEnded() async {
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            let waiting = state.withLock { state -> Bool in
                guard state.searching else { return false }
                state.waiters.append(continuation)
                return true
            }
            if !waiting { continuation.resume() }
        }
    }

    /// One search and its verdict: refused, the database is down (a search again a second
    /// later at the earliest); otherwise it is there.
    private func search() async {
        let result = await probe()
        let (wasDown, waiters) = state.withLock { state -> (Bool, [CheckedContinuation<Void, Never>]) in
            let wasDown = state.outage != nil
            if case .refused(let error) = result {
                state.outage = Outage(error: error, nextProbe: .now + Self.probeInterval)
            } else {
                state.outage = nil
            }
            state.searching = false
            state.searchBlocksCalls = false
            defer { state.waiters = [] }
            return (wasDown, state.waiters)
        }
        for waiter in waiters { waiter.resume() }
        switch result {
        case .refused(let error) where !wasDown:
            logger.warning("token database unreachable; calls fail at once until it answers again", metadata: [
                "store": .string(store), "reason": .string(error.description),
            ])
        case .connected where wasDown, .undecided where wasDown:
            logger.notice("token database reachable again", metadata: ["store": .string(store)])
        default: break
        }
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
