// Sync layer: what the engine holds in memory per key, and the hot path's lookup.

import Foundation
import Synchronization

/// What the engine holds for one key in memory: the state ``RefreshMachine`` decides on.
struct MemoryEntry: Sendable {
    var token: StoredToken?
    var source: TokenSource
    /// Past this (provider-corrected) time a refresh is due; jitter already applied.
    var softPoint: Date
    /// Past this time the token is never handed out (expiry minus the floor).
    var usableUntil: Date
    var failure: RefreshFailureState?
    var lastError: TokenProviderError?
    var lastUsed: Date
    /// A background refresh was requested and has not finished.
    var refreshRequested: Bool
}

extension MemoryEntry {
    /// No usable token any more (none stored, expired, removed); `failure` stays.
    mutating func clearToken(keeping failure: RefreshFailureState?) {
        token = nil
        softPoint = .distantPast
        usableUntil = .distantPast
        self.failure = failure
        refreshRequested = false
    }
}

/// One key's entry in a box, so the hot path reads and stamps it where it lies.
///
/// `@unchecked Sendable`: a slot is only created, read and changed while holding the lock of the
/// ``TokenMemory`` that owns it, and never handed out (callers get ``MemoryEntry`` copies).
final class MemorySlot: @unchecked Sendable {
    var entry: MemoryEntry
    init(_ entry: MemoryEntry) { self.entry = entry }
}

/// The result of the hot-path lookup.
enum MemoryLookup: Sendable {
    case fresh(StoredToken)
    /// Past the soft point: `startRefresh` tells the first caller to start the refresh;
    /// `offline` says refreshes are failing (the token is served in offline mode).
    case stale(StoredToken, startRefresh: Bool, offline: Bool)
    case miss
}

/// The in-memory front cache: plain data behind one `Mutex`, so a fresh hit costs a lock, a
/// hash lookup and two comparisons, with no allocation and no actor hop.
final class TokenMemory: Sendable {
    struct State: Sendable {
        var slots: [TokenKey: MemorySlot] = [:]

        /// The entry of `key` by value; setting nil forgets the key.
        subscript(entry key: TokenKey) -> MemoryEntry? {
            get { slots[key]?.entry }
            set {
                guard let newValue else { slots.removeValue(forKey: key); return }
                if let slot = slots[key] { slot.entry = newValue } else { slots[key] = MemorySlot(newValue) }
            }
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
    /// callgrind). The slot's entry is read, then only its use stamped: a mutating call on the
    /// whole entry around the copy made the compiler add a runtime exclusivity check.
    @inline(__always)
    func freshToken(_ key: TokenKey, localNow: Date) -> StoredToken? {
        state.withLock { state in
            // The boxed entry is read and stamped in place. Copying a whole entry out of the
            // dictionary (retaining every string in it), or editing it through the dictionary's
            // modify accessor (which allocates), was most of a hit's cost when profiled.
            guard let slot = state.slots[key] else { return nil }
            let now = localNow.addingTimeInterval(state.clockOffset)
            guard RefreshMachine.isFresh(softPoint: slot.entry.softPoint, at: now), let token = slot.entry.token else { return nil }
            slot.entry.lastUsed = now
            return token
        }
    }

    /// The whole hot-path decision. Records the use; marks a refresh as requested when it tells
    /// the caller to start one, so only the first caller past the soft point does.
    func lookup(_ key: TokenKey, localNow: Date) -> MemoryLookup {
        state.withLock { state in
            let now = localNow.addingTimeInterval(state.clockOffset)
            guard let slot = state.slots[key] else { return .miss }
            return machine.hit(&slot.entry, at: RefreshMoment(corrected: now, local: localNow))
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

    /// The provider-corrected time.
    func correctedNow(_ localNow: Date) -> Date {
        localNow.addingTimeInterval(state.withLock { $0.clockOffset })
    }

    /// Installs `token` with a freshly jittered soft point, clearing failure state.
    func install(_ token: StoredToken, source: TokenSource, failure: RefreshFailureState? = nil,
                 lastUsed: Date? = nil) {
        let jitter = random()
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
            for (key, slot) in state.slots where machine.retryNow(&slot.entry, at: now, configurationDigest: configurationDigest) {
                ended.append(key)
            }
            return ended
        }
    }

    func finishRefreshRequest(_ key: TokenKey) {
        state.withLock { $0[entry: key]?.refreshRequested = false }
    }

    /// Forgets `key` (an idle untracked subject). When the table has shrunk to a quarter of
    /// its storage, the storage is rebuilt at its current size: a dictionary otherwise keeps the
    /// largest storage it ever had (2 MiB after 30,000 trips, for good).
    func remove(_ key: TokenKey) {
        state.withLock {
            _ = $0.slots.removeValue(forKey: key)
            $0.slots.releaseStorageIfSparse()
        }
    }

    var keys: [TokenKey] { state.withLock { Array($0.slots.keys) } }

    /// How many keys have an entry.
    var count: Int { state.withLock { $0.slots.count } }

    /// True when `key` has an entry.
    func holds(_ key: TokenKey) -> Bool { state.withLock { $0.slots[key] != nil } }
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
