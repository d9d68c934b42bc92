// Sync layer: what the engine holds in memory per key, and the hot path's lookup.

import Foundation
import Synchronization

/// The in-memory front cache: plain data behind one `Mutex`, so a fresh hit costs a lock, a
/// hash lookup and two comparisons, with no allocation and no actor hop.
final class TokenMemory: Sendable {
    struct State: Sendable {
        var slots: [TokenKey: MemorySlot] = [:]
        /// How many slots hold an entry (the others keep only a flight phase or a pending
        /// invalidation): ``TokenMemory/count`` without walking the table.
        var heldCount = 0
        /// How many slots are kept only for a removal waiting for the store
        /// (``KeyRefreshState/waitsOnlyForRemoval``): what invalidations of keys memory does not
        /// hold cost while the store takes no writes.
        var removalOnlyCount = 0

        /// The held entry of `key` by value; setting nil lets the token state go (the key's
        /// slot too, unless a flight or an invalidation still needs it).
        subscript(entry key: TokenKey) -> MemoryEntry? {
            get { slots[key]?.keyState.held }
            set { update(key) { $0.held = newValue } }
        }

        /// Changes the whole state of `key` (created empty when there is none), keeping the
        /// held count, and drops the slot once nothing is left in it.
        mutating func update<R>(_ key: TokenKey, _ change: (inout KeyRefreshState) -> R) -> R {
            if let slot = slots[key] {
                let wasHeld = slot.keyState.held != nil
                let wasRemovalOnly = slot.keyState.waitsOnlyForRemoval
                let result = change(&slot.keyState)
                let isHeld = slot.keyState.held != nil
                if wasHeld != isHeld { heldCount += isHeld ? 1 : -1 }
                let isRemovalOnly = slot.keyState.waitsOnlyForRemoval
                if wasRemovalOnly != isRemovalOnly { removalOnlyCount += isRemovalOnly ? 1 : -1 }
                if slot.keyState.isEmpty { slots.removeValue(forKey: key) }
                return result
            }
            var state = KeyRefreshState()
            let result = change(&state)
            if !state.isEmpty {
                slots[key] = MemorySlot(state)
                if state.held != nil { heldCount += 1 }
                if state.waitsOnlyForRemoval { removalOnlyCount += 1 }
            }
            return result
        }

        /// The whole state of `key` by value (empty when memory keeps none).
        func keyState(_ key: TokenKey) -> KeyRefreshState {
            slots[key]?.keyState ?? KeyRefreshState()
        }
        /// Provider clock minus local clock, applied when it exceeds the skew threshold.
        var clockOffset: TimeInterval = 0
    }

    let state = Mutex(State())
    /// Decides every rule; memory only applies its answers under the lock.
    let machine: RefreshMachine
    let random: @Sendable () -> Double

    init(policy: RefreshPolicy, random: @escaping @Sendable () -> Double) {
        self.machine = RefreshMachine(policy: policy)
        self.random = random
    }

    /// The hot path's first step: the token of `key` if it is before its soft point, recording
    /// the use; nil for everything else, which ``lookup(_:localNow:)`` then decides.
    ///
    /// The fresh hit on its own, inlined into the engine and returning the token itself, so the
    /// token is copied once, from the slot to the caller. Through ``RefreshMachine/hit(_:at:)``
    /// and a ``MemoryLookup`` returned through two calls it was copied four times (profiled with
    /// callgrind). The entry is read and stamped in place by one optional-chained mutating call;
    /// the slot's state is exempt from runtime exclusivity checks (every access holds the lock).
    @inline(__always)
    func freshToken(_ key: TokenKey, localNow: Date) -> StoredToken? {
        state.withLock { state in
            // The boxed entry is read and stamped in place. Copying a whole entry out of the
            // dictionary (retaining every string in it), or editing it through the dictionary's
            // modify accessor (which allocates), was most of a hit's cost when profiled.
            guard let slot = state.slots[key] else { return nil }
            // One optional-chained mutating call: reading the soft point, the token and then
            // stamping the use as three chains checked the optional's case three times, each an
            // outlined call (callgrind).
            return slot.keyState.held?.freshHit(at: localNow.addingTimeInterval(state.clockOffset))
        }
    }

    /// The whole hot-path decision. Records the use; marks a refresh as requested when it tells
    /// the caller to start one, so only the first caller past the soft point does.
    func lookup(_ key: TokenKey, localNow: Date) -> MemoryLookup {
        state.withLock { state in
            let now = localNow.addingTimeInterval(state.clockOffset)
            guard let slot = state.slots[key], slot.keyState.held != nil else { return .miss }
            return machine.hit(&slot.keyState.held!, at: RefreshMoment(corrected: now, local: localNow))
        }
    }

    /// The held token if it is above the floor, else nil.
    func usableToken(_ key: TokenKey, localNow: Date) -> StoredToken? {
        state.withLock { state in
            machine.usableToken(of: state[entry: key], at: localNow.addingTimeInterval(state.clockOffset))
        }
    }

    /// What a caller whose flight failed gets: the held token in offline mode, or nothing.
    func afterFailedFlight(_ key: TokenKey, localNow: Date) -> RefreshMachine.FailedFlightAction {
        state.withLock { state in
            machine.flightFailed(held: state[entry: key], at: localNow.addingTimeInterval(state.clockOffset))
        }
    }

    func entry(_ key: TokenKey) -> MemoryEntry? {
        state.withLock { $0[entry: key] }
    }

    /// Where the held token of `key` came from, without copying its entry out.
    func source(_ key: TokenKey) -> TokenSource? {
        state.withLock { $0.slots[key]?.keyState.held?.source }
    }

    /// The provider-corrected time.
    func correctedNow(_ localNow: Date) -> Date {
        localNow.addingTimeInterval(state.withLock { $0.clockOffset })
    }

    /// Installs `token` with a freshly jittered soft point, clearing failure state.
    /// `jitter` drawn by the caller, when it installs under a lock of its own (the committer's):
    /// the injected `random` is then not called under that lock.
    func install(_ token: StoredToken, source: TokenSource, failure: RefreshFailureState? = nil,
                 lastUsed: Date? = nil, jitter drawn: Double? = nil) {
        let jitter = drawn ?? random()
        state.withLock { state in
            let previous = state[entry: token.key]
            state[entry: token.key] = machine.installing(
                token, source: source, failure: failure, lastError: previous?.lastError,
                lastUsed: lastUsed ?? previous?.lastUsed ?? token.lastUsedAt ?? .distantPast, jitter: jitter)
        }
    }

    /// Records that `key` has no usable token (nothing stored, or it expired), keeping failure state.
    func installEmpty(_ key: TokenKey, failure: RefreshFailureState?) {
        state.withLock { state in
            var entry = state[entry: key] ?? MemoryEntry(
                token: nil, source: .store, softPoint: .distantPast, usableUntil: .distantPast,
                failure: nil, lastError: nil, lastUsed: .distantPast, refreshRequested: false)
            entry.clearToken(keeping: failure)
            state[entry: key] = entry
        }
    }

    /// Like ``installEmpty(_:failure:)``, only while memory still holds `expected` for `key`;
    /// returns whether it did (a flight may have installed a newer token meanwhile).
    func installEmpty(_ key: TokenKey, failure: RefreshFailureState?, ifHolding expected: StoredToken?) -> Bool {
        state.withLock { state in
            guard var entry = state[entry: key], entry.token == expected else { return false }
            entry.clearToken(keeping: failure)
            state[entry: key] = entry
            return true
        }
    }

    func recordFailure(_ key: TokenKey, failure: RefreshFailureState, error: TokenProviderError) {
        state.withLock { state in
            if state[entry: key] == nil {
                state[entry: key] = MemoryEntry(
                    token: nil, source: .store, softPoint: .distantPast, usableUntil: .distantPast,
                    failure: nil, lastError: nil, lastUsed: .distantPast, refreshRequested: false)
            }
            state[entry: key]?.failure = failure
            state[entry: key]?.lastError = error
            state[entry: key]?.refreshRequested = false
        }
    }

    /// Ends every running backoff now (the failure count stays): the cause may be fixed. A
    /// backoff the provider asked for (`Retry-After`) is kept, unless it was asked of another
    /// provider configuration than `configurationDigest`, the one in force. Returns the keys
    /// whose backoff ended.
    func endBackoffs(at now: Date, configurationDigest: String? = nil) -> [TokenKey] {
        state.withLock { state in
            var ended: [TokenKey] = []
            for (key, slot) in state.slots where slot.keyState.held != nil && machine.retryNow(&slot.keyState.held!, at: now, configurationDigest: configurationDigest) {
                ended.append(key)
            }
            return ended
        }
    }

    // MARK: - Flight and invalidation

    /// The whole state of `key` (empty when memory keeps none).
    func keyState(_ key: TokenKey) -> KeyRefreshState {
        state.withLock { $0.keyState(key) }
    }

    /// Records where the flight of `key` is.
    func setFlightPhase(_ key: TokenKey, _ phase: RefreshDecision.State) {
        state.withLock { state in state.update(key) { $0.flight = phase } }
    }

    /// Where the flight of `key` is; nil when none runs.
    func flightPhase(of key: TokenKey) -> RefreshDecision.State? {
        state.withLock { $0.slots[key]?.keyState.flight }
    }

    /// The flight of `key` ended: no phase, and the next hit past the soft point may ask for a
    /// background refresh again.
    func flightEnded(_ key: TokenKey) {
        state.withLock { state in
            state.update(key) {
                $0.flight = nil
                $0.held?.refreshRequested = false
            }
        }
    }

    /// Records whether the removal of `key`'s stored token waits for the store (the group
    /// commit calls this whenever that changes).
    func setInvalidationPending(_ key: TokenKey, _ pending: Bool) {
        state.withLock { state in state.update(key) { $0.invalidationPending = pending } }
    }

    // MARK: - Another process's token

    /// Installs `token`, which another process stored, when ``RefreshMachine/adopts(_:into:at:)``
    /// says so for the key's state at provider-corrected `now`, in the same step as it decides;
    /// returns whether it did.
    func adopt(_ token: StoredToken, failure: RefreshFailureState?, at now: Date) -> Bool {
        let jitter = random()
        return state.withLock { state in
            guard machine.adopts(token, into: state.keyState(token.key), at: now) else { return false }
            let previous = state[entry: token.key]
            state[entry: token.key] = machine.installing(
                token, source: .otherProcess, failure: failure, lastError: previous?.lastError,
                lastUsed: previous?.lastUsed ?? token.lastUsedAt ?? .distantPast, jitter: jitter)
            return true
        }
    }

    /// Whether `token` would be adopted now (see ``adopt(_:failure:at:)``), without installing it.
    func wouldAdopt(_ token: StoredToken, at now: Date) -> Bool {
        state.withLock { machine.adopts(token, into: $0.keyState(token.key), at: now) }
    }

    /// Makes room for `count` more keys at once, before a batch of loads: the table is then
    /// sized once instead of growing (and rehashing) step by step.
    func reserveCapacity(adding count: Int) {
        state.withLock { $0.slots.reserveCapacity($0.slots.count + count) }
    }

    /// Brings the stored `entry` of `key` into memory when memory holds nothing of it, as
    /// ``RefreshMachine/loaded(_:into:at:)`` decides; returns whether a stored token was installed.
    func load(_ key: TokenKey, stored entry: TokenEntry?, at now: Date) -> Bool {
        let jitter = random()
        return state.withLock { state in
            switch machine.loaded(entry, into: state.keyState(key), at: now) {
            case .keep:
                return false
            case .install(let token, let failure):
                state[entry: key] = machine.installing(
                    token, source: .store, failure: failure, lastError: nil,
                    lastUsed: token.lastUsedAt ?? .distantPast, jitter: jitter)
                return true
            case .empty(let failure):
                var empty = MemoryEntry(
                    token: nil, source: .store, softPoint: .distantPast, usableUntil: .distantPast,
                    failure: nil, lastError: nil, lastUsed: .distantPast, refreshRequested: false)
                empty.clearToken(keeping: failure)
                state[entry: key] = empty
                return false
            }
        }
    }

    // MARK: - Keys

    /// Forgets what memory holds of `key` (an idle untracked subject). When the table has
    /// shrunk to a quarter of its storage, the storage is rebuilt at its current size: a
    /// dictionary otherwise keeps the largest storage it ever had (2 MiB after 30,000 trips, for
    /// good).
    func remove(_ key: TokenKey) {
        state.withLock {
            $0[entry: key] = nil
            $0.slots.releaseStorageIfSparse()
        }
    }

    /// The keys memory holds an entry for.
    var keys: [TokenKey] { state.withLock { $0.slots.compactMap { $0.value.keyState.held == nil ? nil : $0.key } } }

    /// How many keys have an entry.
    var count: Int { state.withLock { $0.heldCount } }

    /// How many keys memory keeps only for a removal waiting for the store.
    var removalOnlyCount: Int { state.withLock { $0.removalOnlyCount } }

    /// True when `key` has an entry.
    func holds(_ key: TokenKey) -> Bool { state.withLock { $0.slots[key]?.keyState.held != nil } }
}


extension TokenMemory {
    func markUsed(_ key: TokenKey, at date: Date) {
        state.withLock { $0[entry: key]?.lastUsed = date }
    }
}

extension Dictionary {
    /// Rebuilds the storage at the size `count` needs when `count` has fallen to a quarter of
    /// the capacity (and the capacity is past a thousand): removals never shrink a
    /// dictionary's storage. Amortized constant time per removal: a rebuild copies at most a
    /// quarter of the entries the storage was sized for, and the next one comes only after the
    /// rebuilt storage empties to a quarter in turn.
    mutating func releaseStorageIfSparse() {
        guard capacity > 1024, count * 4 <= capacity else { return }
        var smaller = Self(minimumCapacity: count)
        for (key, value) in self { smaller[key] = value }
        self = smaller
    }
}
