// Sync layer: one key's state as the engine holds it in memory, and the hot path's answer.

import Foundation

/// What the engine holds for one key in memory: the state ``RefreshMachine`` decides on.
struct MemoryEntry: Sendable {
    var token: StoredToken?
    var source: TokenSource
    /// Past this (provider-corrected) time a refresh is due; jitter already applied.
    var softPoint: Date
    /// Past this time the token is never handed out (expiry minus the floor).
    var usableUntil: Date
    // The failure fields are nil for nearly every key nearly always, and together they were
    // most of a key's state inline (about 200 of 650 bytes): out of line, nil costs 8 bytes each.
    @OutOfLine var failure: RefreshFailureState?
    @OutOfLine var lastError: TokenProviderError?
    var lastUsed: Date
    /// A background refresh was requested and has not finished.
    var refreshRequested: Bool
}

extension MemoryEntry {
    /// The token when it is before its soft point at `now` (the provider-corrected time), the
    /// use stamped; nil otherwise, changing nothing. The fresh hit of ``TokenMemory``.
    @inline(__always)
    mutating func freshHit(at now: Date) -> StoredToken? {
        guard RefreshMachine.isFresh(softPoint: softPoint, at: now), let token else { return nil }
        lastUsed = now
        return token
    }

    /// No usable token any more (none stored, expired, removed); `failure` stays.
    mutating func clearToken(keeping failure: RefreshFailureState?) {
        token = nil
        softPoint = .distantPast
        usableUntil = .distantPast
        self.failure = failure
        refreshRequested = false
    }
}

/// Everything the engine knows of one key, as one value: what memory holds of its token
/// (``MemoryEntry``: token, soft point, usable-until, failure and backoff with the configuration
/// digest it is bound to, last use), where its flight is, and whether its invalidation waits for
/// the store. ``RefreshMachine`` decides on it as a plain value; ``TokenMemory`` keeps one per key
/// under its one lock.
struct KeyRefreshState: Sendable {
    /// What memory holds of the key's token; nil when it holds nothing (never loaded, evicted).
    var held: MemoryEntry?
    /// Where the key's running flight is; nil when none runs.
    var flight: RefreshDecision.State?
    /// The removal of the key's stored token (an invalidation) waits for the group commit:
    /// until it is written, a token of the key read from the store is the invalidated one (or
    /// older), never to be served again. Set and cleared by the commit, in the same step as its
    /// own queue changes.
    var invalidationPending = false

    /// Whether nothing is known of the key: memory keeps no state for it.
    var isEmpty: Bool { held == nil && flight == nil && !invalidationPending }

    /// Whether the key's slot is kept for its removal from the store alone: memory holds no
    /// entry for it (an invalidation of a key never loaded, or evicted).
    var waitsOnlyForRemoval: Bool { held == nil && invalidationPending }
}

/// An optional value kept in an immutable box of its own: a struct holding it stays small while
/// it is nil, at the cost of an allocation when it is set. For rarely set fields of values held
/// once per key (a key's failure, its last provider error).
@propertyWrapper
struct OutOfLine<Value: Sendable>: Sendable {
    private final class Box: Sendable {
        let value: Value
        init(_ value: Value) { self.value = value }
    }
    private var box: Box?

    init(wrappedValue: Value?) { box = wrappedValue.map(Box.init) }

    var wrappedValue: Value? {
        get { box?.value }
        set { box = newValue.map(Box.init) }
    }
}

/// One key's state in a box, so the hot path reads and stamps it where it lies.
///
/// `@unchecked Sendable`: a slot is only created, read and changed while holding the lock of the
/// ``TokenMemory`` that owns it, and never handed out (callers get ``MemoryEntry`` copies).
final class MemorySlot: @unchecked Sendable {
    // Unchecked: every access is under the owning memory's lock, so the runtime's dynamic
    // exclusivity check (about 109 instructions of every hit, callgrind) cannot find anything.
    @exclusivity(unchecked) var keyState: KeyRefreshState
    init(_ keyState: KeyRefreshState) { self.keyState = keyState }
}

/// The result of the hot-path lookup.
enum MemoryLookup: Sendable {
    case fresh(StoredToken)
    /// Past the soft point: `startRefresh` tells the first caller to start the refresh;
    /// `offline` says refreshes are failing (the token is served in offline mode).
    case stale(StoredToken, startRefresh: Bool, offline: Bool)
    case miss
}
