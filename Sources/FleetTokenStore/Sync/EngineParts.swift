// Sync layer: the engine's collaborators (memory, the schedule, the lease, the fetch slots, the
// group commit, the clocks and the reporting), the concrete implementation of the effects its
// flights and coordinator ask for (RefreshEffects, CoordinatorEffects). Neither sees this list.
import CoreMetrics
import Foundation
import Logging
import Synchronization

/// Set once when the engine starts shutting down; flights check it between steps.
final class ShutdownFlag: Sendable {
    private let flag = Atomic<Bool>(false)

    init() {}

    var isSet: Bool { flag.load(ordering: .acquiring) }

    func set() { flag.store(true, ordering: .releasing) }
}

/// The engine's collaborators, held by ``RefreshCoordinator`` as its effects. A
/// ``RefreshFlight`` sees them only as its ``RefreshEffects`` (EngineParts+RefreshEffects.swift),
/// the coordinator only as ``CoordinatorEffects`` (EngineParts+CoordinatorEffects.swift): what
/// each may do is those protocols, not this list.
struct EngineParts: Sendable {
    let policy: RefreshPolicy
    let memory: TokenMemory
    let repository: any TokenRepository
    let fetcher: any TokenFetcher
    let validator: TokenValidator
    let lease: CrossProcessLease
    let slots: FetchSlots
    let scheduler: RefreshScheduler
    let committer: GroupCommitter
    let skew: ClockSkewTracker
    let health: StoreHealth
    let events: EventBroadcaster<TokenSyncEvent>
    let metrics: SyncMetrics
    let logger: Logger
    let now: @Sendable () -> Date
    let random: @Sendable () -> Double
    let shutdown: ShutdownFlag

    /// The refresh rules (memory's, so both sides decide alike).
    var machine: RefreshMachine { memory.machine }

    /// The time now, local and provider-corrected.
    var moment: RefreshMoment {
        let local = now()
        return RefreshMoment(corrected: memory.correctedNow(local), local: local)
    }

    /// Schedules `key` at its soft point, at its next attempt while backing off, or now when it
    /// holds no usable token. When it comes due, an idle untracked key is evicted instead (once
    /// its write, if one is pending, has landed).
    func scheduleNextRefresh(_ key: TokenKey) {
        scheduler.schedule(key, at: machine.nextRefresh(of: memory.entry(key), at: moment))
    }

    /// Installs a token another process stored when it is newer than ours, and reports and
    /// reschedules the key; a flight of the key queued for a fetch slot is let go. Never while
    /// the key's invalidation waits for the store: the stored token is then the invalidated one.
    @discardableResult
    func adoptIfNewer(_ token: StoredToken, failure: RefreshFailureState?) -> Bool {
        // Decided on the key's whole state (memory's token, a pending invalidation) at one
        // moment: asked first, so that only a token to be adopted teaches the clock offset, and
        // again as it is installed, in case memory changed meanwhile.
        let corrected = moment.corrected
        guard memory.wouldAdopt(token, at: corrected) else { return false }
        // Until the provider answers us, the token's own times tell its clock (see load).
        skew.learnFromStored([token])
        guard memory.adopt(token, failure: judged(failure), at: corrected) else { return false }
        slots.endWait(for: token.key)
        logger.info("adopted a token another process stored", metadata: [
            "key": .string(token.key.description), "fingerprint": .string(token.fingerprint.description),
        ])
        events.emit(.refreshed(key: token.key, fingerprint: token.fingerprint, expiresAt: token.expiresAt, source: .otherProcess))
        scheduleNextRefresh(token.key)
        return true
    }

    /// `entry` as read from the store, as the engine may use it: a value still sealed reads as
    /// missing (``SealedValueGuard``), and a failure recorded under another provider
    /// configuration than the fetcher's holds no backoff (see ``judged(_:)``).
    func admitted(_ entry: TokenEntry?) -> TokenEntry? {
        guard var entry = SealedValueGuard.checked(entry, logger: logger) else { return nil }
        entry.failure = judged(entry.failure)
        return entry
    }

    /// A stored `failure` judged under the fetcher's configuration now: one recorded under
    /// another (a flag or a file fixed since) is tried at once; the same one keeps its backoff.
    func judged(_ failure: RefreshFailureState?) -> RefreshFailureState? {
        guard let failure, failure.configurationDigest != nil else { return failure }
        return machine.judged(failure, under: fetcher.configurationDigest, at: now())
    }

    /// Reads the stored entries of `keys` into memory; keys the store lacks are remembered as
    /// empty so a miss does not read the store again.
    func load(_ keys: [TokenKey]) async {
        guard !keys.isEmpty else { return }
        let found: [TokenKey: TokenEntry]
        do {
            found = try await repository.entries(for: keys)
        } catch {
            logger.warning("could not read stored tokens; they will be fetched", metadata: ["error": .string(error.description)])
            return
        }
        // Until the provider answers this process, the offset to its clock is what the stored
        // tokens' own times prove: a restart must not judge them by our clock alone.
        skew.learnFromStored(found.values.lazy.compactMap(\.token))
        let corrected = moment.corrected
        memory.reserveCapacity(adding: keys.count)
        for key in keys where memory.entry(key) == nil {
            if memory.load(key, stored: admitted(found[key]), at: corrected) { metrics.storeReuses.increment() }
        }
    }
}
