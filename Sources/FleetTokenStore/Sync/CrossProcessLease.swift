// Sync layer: single flight across processes sharing a store. Takes, renews and releases each
// key's refresh lease, takes over a dead holder's, and waits on the change feed for a live one.
import Foundation
import Logging
import Synchronization

/// This process's side of the refresh leases in a ``RefreshLeaseStore``.
///
/// A flight holds its key's lease from before the fetch until its token is stored; the flight
/// then hands it to the group commit (``handOver(_:)``), which releases it after the write
/// (``releaseHandedOver(_:)``) unless a new flight of the key has taken it again meanwhile.
/// A lease whose release the store refused is remembered until it would have run out, for
/// ``releaseAll()``; no longer, so a database that fails for a while leaves nothing behind.
final class CrossProcessLease: Sendable {
    /// The lease store's answer, with the dead-holder decision made.
    enum Answer: Sendable, Equatable {
        case granted(current: TokenEntry?)
        case busy(holder: String, holderIsDead: Bool, until: Date, current: TokenEntry?)
        case unavailable
    }

    private struct Held: Sendable {
        var keys: Set<TokenKey> = []
        /// Held keys whose flight is over, waiting for their token's commit.
        var handedOver: Set<TokenKey> = []
        /// When each held key's lease was taken (wall clock): its first renewal is due a third
        /// of a lease after that, however late the fetch that renews it starts.
        var takenAt: [TokenKey: Date] = [:]
        /// Leases the store refused to release, with the latest time each can run to (its last
        /// renewal came before the release). Not held by any flight; past that time the store
        /// holds them for nobody, and they are forgotten.
        var unreleased: [TokenKey: Date] = [:]

        mutating func forget(_ key: TokenKey) {
            keys.remove(key)
            handedOver.remove(key)
            takenAt[key] = nil
        }

        mutating func keepUnreleased(_ failed: [TokenKey], until end: Date, now: Date) {
            unreleased = unreleased.filter { $0.value > now }
            for key in failed where !keys.contains(key) { unreleased[key] = end }
        }

        /// The leases the store may still hold for this process: every held key and the
        /// unreleased ones not yet run out.
        func outstanding(now: Date) -> Set<TokenKey> {
            keys.union(unreleased.lazy.filter { $0.value > now }.map(\.key))
        }
    }

    /// Names this process in leases, so others can tell when it died.
    let holder = RefreshLeaseHolder.make()
    private let store: any RefreshLeaseStore
    private let changes: @Sendable () -> AsyncStream<TokenStoreChange>
    /// The repository's change following (``TokenRepository/followChanges()``), which makes its
    /// feed report; not the rest of its background work.
    private let driveChanges: @Sendable () async -> Void
    /// True while the engine's `run()` drives the change feed; otherwise a wait drives it for
    /// its own length (an engine used without `run()` still learns a holder's result at once).
    let feedIsDriven = Atomic<Bool>(false)
    private let duration: TimeInterval
    private let clock: any Clock<Duration>
    private let now: @Sendable () -> Date
    private let logger: Logger
    private let held = Mutex(Held())
    /// The lease store failed the last request: a database that is down fails every one, and
    /// a warning per refresh would bury the log. Warned once when it starts, noted when it ends.
    private let storeFailing = Mutex(false)

    init(store: any RefreshLeaseStore, changes: @escaping @Sendable () -> AsyncStream<TokenStoreChange>,
         driveChanges: @escaping @Sendable () async -> Void,
         duration: TimeInterval, clock: any Clock<Duration>, now: @escaping @Sendable () -> Date, logger: Logger) {
        self.store = store
        self.changes = changes
        self.driveChanges = driveChanges
        self.duration = duration
        self.clock = clock
        self.now = now
        self.logger = logger
    }

    /// One attempt at `key`'s lease.
    func take(_ key: TokenKey) async -> Answer {
        do {
            let at = now()
            let lease = try await store.acquireRefreshLease(for: key, holder: holder, now: at, duration: duration)
            storeAnswered()
            return note(key, lease, takenAt: at)
        } catch {
            storeFailed("could not take the refresh lease; fetching without it", key: key, error: error)
            return .unavailable
        }
    }

    /// Logs a failed lease request: a warning for the first of a run of failures, debug for
    /// the rest.
    private func storeFailed(_ message: Logger.Message, key: TokenKey, error: TokenStoreError) {
        let first = storeFailing.withLock { failing in
            defer { failing = true }
            return !failing
        }
        let metadata: Logger.Metadata = ["key": .string(key.description), "error": .string(error.description)]
        if first {
            logger.warning("\(message) (until leases can be taken again, further failures are logged at debug level)",
                           metadata: metadata)
        } else {
            logger.debug(message, metadata: metadata)
        }
    }

    private func storeAnswered() {
        guard storeFailing.withLock({ failing in defer { failing = false }; return failing }) else { return }
        logger.notice("refresh leases can be taken again")
    }

    /// Takes `key`'s lease from `deadHolder`, a process of this machine that no longer exists,
    /// if it still holds it.
    func takeOver(_ key: TokenKey, from deadHolder: String) async -> Answer {
        do {
            let at = now()
            let answer = try await store.takeOverRefreshLease(for: key, from: deadHolder, holder: holder, now: at,
                                                              duration: duration)
            storeAnswered()
            if case .acquired = answer {
                logger.notice("took over the refresh lease of a process that died", metadata: [
                    "key": .string(key.description), "holder": .string(deadHolder),
                ])
            }
            return note(key, answer, takenAt: at)
        } catch {
            storeFailed("could not take over a dead process's refresh lease; fetching without it", key: key, error: error)
            return .unavailable
        }
    }

    private func note(_ key: TokenKey, _ lease: RefreshLease, takenAt: Date) -> Answer {
        switch lease {
        case .acquired(let current):
            held.withLock { held in
                held.keys.insert(key)
                held.handedOver.remove(key)
                held.takenAt[key] = takenAt
                held.unreleased[key] = nil
            }
            return .granted(current: current)
        case .heldElsewhere(let other, let until, let current):
            logger.debug("another process is refreshing this key; waiting for its result", metadata: [
                "key": .string(key.description), "holder": .string(other),
            ])
            return .busy(holder: other, holderIsDead: RefreshLeaseHolder.isDeadProcess(other), until: until, current: current)
        }
    }

    func holds(_ key: TokenKey) -> Bool {
        held.withLock { $0.keys.contains(key) }
    }

    /// Runs `fetch`, renewing `key`'s lease every third of its duration meanwhile when held (a
    /// slow provider must not let the lease lapse and another process fetch the same key). The
    /// first renewal is due a third of a lease after the lease was taken, not after this call:
    /// a fetch that starts late (a busy machine, a slow slot) must not push it towards expiry.
    func renewing<T: Sendable>(_ key: TokenKey, _ fetch: @escaping @Sendable () async -> T) async -> T {
        guard holds(key) else { return await fetch() }
        return await withTaskGroup(of: T?.self) { group in
            group.addTask { await fetch() }
            group.addTask { await self.renewUntilCancelled(key); return nil }
            while let next = await group.next() {
                if let next {
                    group.cancelAll()
                    return next
                }
            }
            preconditionFailure("the fetch child always returns a value")
        }
    }

    private func renewUntilCancelled(_ key: TokenKey) async {
        var last = held.withLock { $0.takenAt[key] } ?? now()
        while !Task.isCancelled {
            let wait = Self.renewalDelay(after: last, now: now(), leaseDuration: duration)
            if wait > .zero {
                do { try await clock.sleep(for: wait) } catch { return }
            }
            last = now()
            do {
                if case .heldElsewhere(let other, _, _) = try await store.acquireRefreshLease(
                    for: key, holder: holder, now: last, duration: duration) {
                    logger.warning("another process took over the refresh lease while this fetch ran", metadata: [
                        "key": .string(key.description), "holder": .string(other),
                    ])
                    return
                }
            } catch {
                logger.debug("could not renew the refresh lease; will retry", metadata: [
                    "key": .string(key.description), "error": .string(error.description),
                ])
            }
        }
    }

    /// How long to wait before renewing a lease last taken or renewed at `last`: until a third
    /// of a lease after it, at once when that is past, and never longer than a third of a
    /// lease (a wall clock stepped back must not delay the renewal past the lease's end).
    static func renewalDelay(after last: Date, now: Date, leaseDuration: TimeInterval) -> Duration {
        let interval = max(leaseDuration / 3, 0.01)
        let seconds = min(max(last.addingTimeInterval(interval).timeIntervalSince(now), 0), interval)
        return .milliseconds(Int64((seconds * 1000).rounded(.up)))
    }

    /// Waits up to `seconds` for the change feed to mention `key` (another process's fetch
    /// stored or failed): true when it did; false when the time passed or the feed ended
    /// (a closing or feedless repository), which is no signal either way.
    func waitForChange(of key: TokenKey, seconds: TimeInterval) async -> Bool {
        let clock = self.clock
        // A stream per wait: cancelling its reader below ends it.
        let changes = self.changes()
        return await withTaskGroup(of: Bool?.self) { group in
            group.addTask {
                for await change in changes {
                    switch change {
                    case .upserted(let changed), .removed(let changed): if changed == key { return true }
                    case .unknown: return true
                    }
                }
                return nil
            }
            group.addTask {
                try? await clock.sleep(for: .milliseconds(Int64((seconds * 1000).rounded(.up))))
                return false
            }
            if !feedIsDriven.load(ordering: .relaxed) {
                group.addTask { [driveChanges] in
                    await driveChanges()
                    return nil
                }
            }
            // The timer always answers; a feed or driver that ends first is no answer.
            while let next = await group.next() {
                guard let answer = next else { continue }
                group.cancelAll()
                return answer
            }
            return false
        }
    }

    /// A flight's token goes to the group commit: the lease stays until it is stored.
    func handOver(_ key: TokenKey) {
        held.withLock { held in
            if held.keys.contains(key) { held.handedOver.insert(key) }
        }
    }

    /// Releases the leases of `keys` handed over and not taken again since.
    func releaseHandedOver(_ keys: [TokenKey]) async {
        let released = held.withLock { held in
            let released = keys.filter { held.handedOver.contains($0) }
            for key in released { held.forget(key) }
            return released
        }
        guard !released.isEmpty else { return }
        await releaseOrKeep(released)
    }

    /// Releases `key`'s lease when held.
    func release(_ key: TokenKey) async {
        let had = held.withLock { held in
            defer { held.forget(key) }
            return held.keys.contains(key)
        }
        guard had else { return }
        await releaseOrKeep([key])
    }

    /// Shutdown: releases every lease still held (those whose release failed before and that
    /// have not run out since included).
    func releaseAll() async {
        let at = now()
        let keys = held.withLock { Array($0.outstanding(now: at)) }
        guard !keys.isEmpty else { return }
        do {
            try await store.releaseRefreshLeases(for: keys, holder: holder)
            held.withLock { held in
                for key in keys {
                    held.forget(key)
                    held.unreleased[key] = nil
                }
            }
        } catch {
            logger.debug("could not release refresh leases", metadata: ["error": .string(error.description)])
        }
    }

    /// The keys whose lease this process may still hold, sorted (for the shutdown's report).
    var heldKeys: [TokenKey] {
        let at = now()
        return held.withLock { $0.outstanding(now: at).sorted() }
    }

    /// Releases `keys`' leases. When the store refuses (a database that is down, a cancelled
    /// task) they are kept until they would have run out: the shutdown's ``releaseAll()``
    /// tries again, rather than other processes waiting for them to expire.
    private func releaseOrKeep(_ keys: [TokenKey]) async {
        do {
            try await store.releaseRefreshLeases(for: keys, holder: holder)
        } catch {
            let at = now()
            held.withLock { $0.keepUnreleased(keys, until: at.addingTimeInterval(duration), now: at) }
        }
    }
}
