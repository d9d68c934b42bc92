// Sync layer: persistence of refreshed tokens and of invalidations. Whatever accumulates while
// one transaction commits goes into the next, so a refresh burst costs a few commits, not one
// per key.
import Foundation
import Logging
import Synchronization

/// Writes refreshed tokens to the repository in batches, keeps them for another attempt when
/// the store fails (memory goes on serving them), then reports each committed token and hands
/// its key to `committed` (which releases the key's lease, and makes an idle key that waited
/// for its write due again: ``RefreshScheduler/dueAgainOnCommit(_:)``).
///
/// Invalidations go the same way (``enqueueRemoval(_:)``): one write per key is pending at a
/// time, the newest, so a token fetched before an invalidation can never reach the store after
/// it, and an invalidation never waits for a store that cannot be written.
///
/// While ``run()`` runs (a child task of the engine's `run()`), it does the writing. An engine
/// used without `run()` (a one-shot program) has no such loop: each burst is then written by a
/// task of its own, which ``drain()`` and the engine's shutdown await.
///
/// Its state sits behind a `Mutex`, not in an actor, so that the coordinator can ask whether a
/// key's commit is pending in the same step as it changes memory. Whether a key's removal waits
/// for the store is the refresh machine's to judge (no adoption meanwhile): each change of it is
/// reported to `invalidationPending` while this lock is held, so the key's state in memory
/// changes in the same order as this queue. So this lock is taken before memory's (that
/// report and ``enqueue(_:publishing:)``'s install run under it), never after.
final class GroupCommitter: Sendable {
    /// Delay between attempts to write results after the store failed.
    static let storeRetryDelay: TimeInterval = 2

    /// Largest batch whose tables keep their storage for the next one: a burst (30,000
    /// invalidations, a refresh wave of a whole fleet) gives its storage back once written,
    /// so memory returns to what steady work needs.
    static let keptCapacity = 1_024

    /// What is to be written for a key: its newest token, or the removal of its stored token.
    private enum Write: Sendable {
        case token(StoredToken)
        case removal
    }

    /// One batch: its tokens are written in one transaction, then its removals.
    private struct Batch: Sendable {
        var tokens: [StoredToken] = []
        var removals: [TokenKey] = []
    }

    private struct State: Sendable {
        var pending: [TokenKey: Write] = [:]
        /// The keys of the batch being written: still pending for the change feed's
        /// reconcile, which would otherwise read the store before the write commits and judge
        /// the token removed by another process.
        var inFlight: Set<TokenKey> = []
        /// The keys of the batch being written whose stored token is being removed.
        var inFlightRemovals: Set<TokenKey> = []
        /// A batch loop is writing; it goes on until nothing is pending.
        var writing = false
        var writeWaiters: [CheckedContinuation<Void, Never>] = []
        /// ``run()`` is running, so it does the writing.
        var looping = false
        var oneOff: Task<Void, Never>?
        var stopping = false
    }

    private let state = Mutex(State())
    private let work = WakeSignal()
    private let repository: any TokenRepository
    private let health: StoreHealth
    private let events: EventBroadcaster<TokenSyncEvent>
    private let logger: Logger
    private let clock: any Clock<Duration>
    private let committed: @Sendable ([TokenKey]) async -> Void
    private let invalidationPending: @Sendable (TokenKey, Bool) -> Void

    init(repository: any TokenRepository, health: StoreHealth, events: EventBroadcaster<TokenSyncEvent>, logger: Logger,
         clock: any Clock<Duration>, committed: @escaping @Sendable ([TokenKey]) async -> Void,
         invalidationPending: @escaping @Sendable (TokenKey, Bool) -> Void) {
        self.repository = repository
        self.health = health
        self.events = events
        self.logger = logger
        self.clock = clock
        self.committed = committed
        self.invalidationPending = invalidationPending
    }

    /// Queues `token` for the next batch (replacing an older pending write of its key) and
    /// calls `publish` (memory's install) in the same step, under this queue's lock: no batch
    /// can take the token before memory holds it, so its `.refreshed` event, sent once it is
    /// written, never reaches a subscriber that would find memory without it; and whoever
    /// finds it in memory finds its commit pending.
    func enqueue(_ token: StoredToken, publishing publish: () -> Void) {
        enqueue(token.key, .token(token), publishing: publish)
    }

    /// Queues the removal of `key`'s stored token (an invalidation) for the next batch,
    /// replacing a token of the key still waiting for its commit. Returns at once: the removal
    /// reaches the store when it can be written, after any write of the key already under way.
    func enqueueRemoval(_ key: TokenKey) {
        enqueue(key, .removal)
    }

    private func enqueue(_ key: TokenKey, _ write: Write, publishing publish: () -> Void = {}) {
        let looping = state.withLock { state in
            let wasRemoving = Self.isRemovalPending(key, in: state)
            state.pending[key] = write
            reportRemoval(of: key, in: state, was: wasRemoving)
            publish()
            if !state.looping && !state.writing {
                state.writing = true
                state.oneOff = Task { await self.writeBatches() }
            }
            return state.looping
        }
        if looping { work.signal() }
    }

    /// Whether nothing waits to be written and no write runs.
    var isIdle: Bool {
        state.withLock { !$0.writing && $0.pending.isEmpty }
    }

    /// Whether a token of `key` waits for its commit.
    func isPending(_ key: TokenKey) -> Bool {
        state.withLock { $0.pending[key] != nil || $0.inFlight.contains(key) }
    }

    /// Whether the removal of `key`'s stored token waits for its commit: until it is done, a
    /// token of the key read from the store is the invalidated one (or older), never to be
    /// served again.
    private static func isRemovalPending(_ key: TokenKey, in state: State) -> Bool {
        if case .removal = state.pending[key] { return true }
        return state.inFlightRemovals.contains(key)
    }

    /// Reports a change of whether `key`'s removal is pending (it was `was`), under the lock.
    private func reportRemoval(of key: TokenKey, in state: State, was: Bool) {
        let now = Self.isRemovalPending(key, in: state)
        if now != was { invalidationPending(key, now) }
    }

    /// The keys whose write has not reached the store (for the shutdown's report).
    var unwrittenKeys: [TokenKey] {
        state.withLock { Array(Set($0.pending.keys).union($0.inFlight)).sorted() }
    }

    /// Returns once every token pending now is written, or given up on during shutdown.
    func drain() async {
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            let wait = state.withLock { state in
                guard state.writing else { return false }
                state.writeWaiters.append(continuation)
                return true
            }
            if !wait { continuation.resume() }
        }
        if startWriting() { await writeBatches() }
    }

    /// Shutdown: a failed write is not retried after this; then writes what is pending.
    func stop() async {
        let oneOff = state.withLock { state in
            state.stopping = true
            return state.oneOff
        }
        await oneOff?.value
        await drain()
    }

    /// Writes batches as tokens arrive, until cancelled.
    func run() async {
        state.withLock { $0.looping = true }
        defer { state.withLock { $0.looping = false } }
        while !Task.isCancelled {
            // Nothing to write, or another task writes (a drain, or a writer started before
            // this loop, retrying a failing store): wait. That writer signals when it stops;
            // looping on it instead would spin a core for as long as the store fails.
            if state.withLock({ $0.pending.isEmpty || $0.writing }) { await work.wait() }
            _ = work.take()
            if Task.isCancelled { break }
            if startWriting() { await writeBatches() }
        }
    }

    /// Claims the batch loop when something is pending and no loop runs.
    private func startWriting() -> Bool {
        state.withLock { state in
            guard !state.writing, !state.pending.isEmpty else { return false }
            state.writing = true
            return true
        }
    }

    /// The batch loop; the caller has claimed it (`writing`). Ends when nothing is pending, or
    /// when a write fails during shutdown.
    private func writeBatches() async {
        while var batch = nextBatch() {
            do throws(TokenStoreError) {
                try await write(&batch)
            } catch {
                // A write ended by this loop's cancellation (the engine stopping) says nothing
                // about the store: the shutdown's drain, not cancelled, writes the batch again
                // and reports its failure if it fails.
                if !Task.isCancelled { health.writeFailed(error) }
                // Keep the newest write per key for the next attempt; memory keeps serving.
                let stopping = state.withLock { state in
                    for token in batch.tokens where state.pending[token.key] == nil { state.pending[token.key] = .token(token) }
                    for key in batch.removals where state.pending[key] == nil { state.pending[key] = .removal }
                    state.inFlight.removeAll(keepingCapacity: state.inFlight.count <= Self.keptCapacity)
                    let unwritten = state.inFlightRemovals
                    state.inFlightRemovals.removeAll()
                    for key in unwritten { reportRemoval(of: key, in: state, was: true) }
                    return state.stopping
                }
                if stopping || Task.isCancelled || state.withLock({ $0.stopping }) { return finishWriting() }
                try? await clock.sleep(for: .milliseconds(Int64(Self.storeRetryDelay * 1000)))
                if Task.isCancelled || state.withLock({ $0.stopping }) { return finishWriting() }
            }
        }
    }

    /// Writes `batch`: its tokens in one transaction, then its removals one by one. What was
    /// written leaves `batch`, so that after a failure only the rest is tried again.
    private func write(_ batch: inout Batch) async throws(TokenStoreError) {
        if !batch.tokens.isEmpty {
            try await repository.upsert(batch.tokens, clearFailure: true)
            let tokens = batch.tokens
            batch.tokens = []
            let removing = !batch.removals.isEmpty
            state.withLock { state in
                if removing { state.inFlight.subtract(tokens.lazy.map(\.key)) } else { state.inFlight.removeAll(keepingCapacity: state.inFlight.count <= Self.keptCapacity) }
            }
            health.writeSucceeded()
            await committed(tokens.map(\.key))
            for token in tokens {
                logger.debug("token committed to the store", metadata: [
                    "key": .string(token.key.description), "fingerprint": .string(token.fingerprint.description),
                ])
                events.emit(.refreshed(key: token.key, fingerprint: token.fingerprint, expiresAt: token.expiresAt,
                                       source: .provider))
            }
        }
        while let key = batch.removals.last {
            try await repository.removeToken(for: key)
            batch.removals.removeLast()
            state.withLock { state in
                state.inFlight.remove(key)
                state.inFlightRemovals.remove(key)
                reportRemoval(of: key, in: state, was: true)
            }
            health.writeSucceeded()
            // A token of the key handed to this commit before the invalidation replaced it
            // kept the key's lease until now.
            await committed([key])
            logger.debug("invalidated token removed from the store", metadata: ["key": .string(key.description)])
        }
    }

    /// Takes everything pending as the next batch; when nothing is, ends the batch loop in the
    /// same step, so a write queued a moment later starts a new one.
    private func nextBatch() -> Batch? {
        let (batch, waiters) = state.withLock { state -> (Batch?, [CheckedContinuation<Void, Never>]) in
            guard state.pending.isEmpty else {
                defer { state.pending.removeAll(keepingCapacity: state.pending.count <= Self.keptCapacity) }
                var batch = Batch()
                batch.tokens.reserveCapacity(state.pending.count)
                for (key, write) in state.pending {
                    switch write {
                    case .token(let token): batch.tokens.append(token)
                    case .removal: batch.removals.append(key)
                    }
                }
                let removing = state.inFlightRemovals
                state.inFlight = Set(state.pending.keys)
                state.inFlightRemovals = Set(batch.removals)
                for key in removing where !state.inFlightRemovals.contains(key) { reportRemoval(of: key, in: state, was: true) }
                return (batch, [])
            }
            return (nil, Self.endLoop(&state))
        }
        if batch == nil { loopEnded(waiters) }
        return batch
    }

    private func finishWriting() {
        loopEnded(state.withLock { Self.endLoop(&$0) })
    }

    /// Lets the drains waiting for the batch loop go on, and ``run()`` look again: it waits
    /// while another task writes.
    private func loopEnded(_ waiters: [CheckedContinuation<Void, Never>]) {
        for waiter in waiters { waiter.resume() }
        work.signal()
    }

    private static func endLoop(_ state: inout State) -> [CheckedContinuation<Void, Never>] {
        state.writing = false
        state.oneOff = nil
        defer { state.writeWaiters.removeAll() }
        return state.writeWaiters
    }
}
