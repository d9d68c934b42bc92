// Sync layer: persistence of refreshed tokens. Whatever accumulates while one transaction
// commits goes into the next, so a refresh burst costs a few commits, not one per key.
import Foundation
import Logging
import Synchronization

/// Writes refreshed tokens to the repository in batches, keeps them for another attempt when
/// the store fails (memory goes on serving them), then reports each committed token and hands
/// its key to `committed` (which releases the key's lease).
///
/// While ``run()`` runs (a child task of the engine's `run()`), it does the writing. An engine
/// used without `run()` (a one-shot program) has no such loop: each burst is then written by a
/// task of its own, which ``drain()`` and the engine's shutdown await.
///
/// Its state sits behind a `Mutex`, not in an actor, so that the coordinator can ask whether a
/// key's commit is pending in the same step as it changes memory.
final class GroupCommitter: Sendable {
    /// Delay between attempts to write results after the store failed.
    static let storeRetryDelay: TimeInterval = 2

    private struct State: Sendable {
        var pending: [TokenKey: StoredToken] = [:]
        /// The keys of the batch being written: still pending for the change feed's
        /// reconcile, which would otherwise read the store before the write commits and judge
        /// the token removed by another process.
        var inFlight: Set<TokenKey> = []
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

    init(repository: any TokenRepository, health: StoreHealth, events: EventBroadcaster<TokenSyncEvent>, logger: Logger,
         clock: any Clock<Duration>, committed: @escaping @Sendable ([TokenKey]) async -> Void) {
        self.repository = repository
        self.health = health
        self.events = events
        self.logger = logger
        self.clock = clock
        self.committed = committed
    }

    /// Queues `token` for the next batch (replacing an older pending token of its key).
    func enqueue(_ token: StoredToken) {
        let looping = state.withLock { state in
            state.pending[token.key] = token
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

    /// Drops `key`'s pending token (it was rejected); true when there was one.
    func discard(_ key: TokenKey) -> Bool {
        state.withLock { $0.pending.removeValue(forKey: key) != nil }
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
            if state.withLock({ $0.pending.isEmpty }) { await work.wait() }
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
        while let batch = nextBatch() {
            do {
                try await repository.upsert(batch, clearFailure: true)
                state.withLock { $0.inFlight.removeAll(keepingCapacity: true) }
                health.writeSucceeded()
                await committed(batch.map(\.key))
                for token in batch {
                    logger.debug("token committed to the store", metadata: [
                        "key": .string(token.key.description), "fingerprint": .string(token.fingerprint.description),
                    ])
                    events.emit(.refreshed(key: token.key, fingerprint: token.fingerprint, expiresAt: token.expiresAt,
                                           source: .provider))
                }
            } catch {
                health.writeFailed(error)
                // Keep the newest token per key for the next attempt; memory keeps serving.
                let stopping = state.withLock { state in
                    for token in batch where state.pending[token.key] == nil { state.pending[token.key] = token }
                    state.inFlight.removeAll(keepingCapacity: true)
                    return state.stopping
                }
                if stopping || Task.isCancelled || state.withLock({ $0.stopping }) { return finishWriting() }
                try? await clock.sleep(for: .milliseconds(Int64(Self.storeRetryDelay * 1000)))
                if Task.isCancelled || state.withLock({ $0.stopping }) { return finishWriting() }
            }
        }
    }

    /// Takes everything pending as the next batch; when nothing is, ends the batch loop in the
    /// same step, so a token queued a moment later starts a new one.
    private func nextBatch() -> [StoredToken]? {
        let (batch, waiters) = state.withLock { state -> ([StoredToken]?, [CheckedContinuation<Void, Never>]) in
            guard state.pending.isEmpty else {
                defer { state.pending.removeAll(keepingCapacity: true) }
                state.inFlight = Set(state.pending.keys)
                return (Array(state.pending.values), [])
            }
            return (nil, Self.endLoop(&state))
        }
        for waiter in waiters { waiter.resume() }
        return batch
    }

    private func finishWriting() {
        let waiters = state.withLock { Self.endLoop(&$0) }
        for waiter in waiters { waiter.resume() }
    }

    private static func endLoop(_ state: inout State) -> [CheckedContinuation<Void, Never>] {
        state.writing = false
        state.oneOff = nil
        defer { state.writeWaiters.removeAll() }
        return state.writeWaiters
    }
}
