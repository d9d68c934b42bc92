// Sync layer: what the engine holds for one subject, for status pages and readiness checks.

package import Foundation
import Synchronization

/// What the engine holds for one subject, for status pages and readiness checks: never the
/// token value. Read from memory only (no I/O).
package struct SubjectStatus: Sendable, Equatable {
    /// How the subject stands.
    package enum State: String, Sendable, Equatable {
        /// A token before its soft point.
        case valid
        /// A usable token past its soft point: a refresh is due or running.
        case refreshDue = "refresh_due"
        /// Refreshes are failing and the next attempt waits; a usable token may still be held.
        case backoff
        /// No usable token (none fetched yet, or the held one is below the floor).
        case unavailable
    }

    /// The subject.
    package let key: TokenKey
    /// Kept fresh proactively (``TokenSyncEngine/track(_:)``), not only while used.
    package let tracked: Bool
    /// How it stands now.
    package let state: State
    /// The held token's expiry, if one is held.
    package let expiresAt: Date?
    /// The held token's fingerprint, if one is held.
    package let fingerprint: TokenFingerprint?
    /// Where the held token came from.
    package let source: TokenSource?
    /// The failure state while refreshes fail.
    package let failure: RefreshFailureState?

    /// Creates a status (the engine makes them; package-wide for tests and the token API).
    package init(key: TokenKey, tracked: Bool, state: State, expiresAt: Date?, fingerprint: TokenFingerprint?,
                source: TokenSource?, failure: RefreshFailureState?) {
        self.key = key
        self.tracked = tracked
        self.state = state
        self.expiresAt = expiresAt
        self.fingerprint = fingerprint
        self.source = source
        self.failure = failure
    }

    /// True when a token can be handed out now (one above the floor is held).
    package var isUsable: Bool { expiresAt != nil }
}

/// How one subject stands, without its token's details: what readiness checks and the service
/// manager's counts need of every configured subject. Read from memory only (no I/O).
package struct SubjectStanding: Sendable, Equatable {
    /// How it stands now.
    package let state: SubjectStatus.State
    /// True when a token can be handed out now (as ``SubjectStatus/isUsable``).
    package let isUsable: Bool
    /// The failure state while refreshes fail.
    package let failure: RefreshFailureState?

    /// Creates a standing (the engine makes them; package-wide for tests).
    package init(state: SubjectStatus.State, isUsable: Bool, failure: RefreshFailureState?) {
        self.state = state
        self.isUsable = isUsable
        self.failure = failure
    }

    /// A subject memory holds nothing for, as ``TokenSyncEngine/status(of:)`` says of it.
    static let notHeld = SubjectStanding(state: .unavailable, isUsable: false, failure: nil)
}

extension MemoryEntry {
    /// How this entry stands at `now` by `machine`'s rule. Changes nothing: `mutating` only so
    /// that an optional-chained call on a slot reads the entry in place, as ``freshHit(at:)``
    /// does; a plain method was handed a copy, and copying retained and released the token, the
    /// failure and the last error of each of 100,000 entries (a fifth of a readiness pass, perf).
    @inline(__always)
    mutating func standing(at now: RefreshMoment, by machine: RefreshMachine) -> SubjectStanding {
        let (state, usable) = machine.standing(of: self, at: now)
        return SubjectStanding(state: state, isUsable: usable, failure: failure)
    }
}

extension TokenMemory {
    /// Keys looked at per hold of the lock by ``forEachStanding(among:localNow:_:)``: a hit
    /// waits for at most one such chunk (about 0.1 ms at 100,000 subjects, where each key is a
    /// cache miss or two), never for a whole fleet.
    static let standingChunk = 256

    /// Hands `body` the standing of each of `keys` at `localNow`, in order, decided as
    /// ``status(_:tracked:localNow:)`` decides it (nothing held: unavailable, no failure). One
    /// clock reading for all; the lock is taken once per ``standingChunk`` keys and `body` runs
    /// outside it. Readiness probes and the service manager's counts asked for each subject's
    /// status on its own: at 100,000 subjects, 100,000 locks, clock readings and status values,
    /// about 60 ms of CPU each time.
    func forEachStanding(among keys: [TokenKey], localNow: Date, _ body: (TokenKey, SubjectStanding) -> Void) {
        var chunk: [SubjectStanding] = []
        chunk.reserveCapacity(min(keys.count, Self.standingChunk))
        var start = keys.startIndex
        while start < keys.endIndex {
            let end = min(start + Self.standingChunk, keys.endIndex)
            state.withLock { state in
                let now = RefreshMoment(corrected: localNow.addingTimeInterval(state.clockOffset), local: localNow)
                for key in keys[start..<end] {
                    // Read in place: copying each entry out retained and released its token.
                    chunk.append(state.slots[key]?.keyState.held?.standing(at: now, by: machine) ?? .notHeld)
                }
            }
            for (key, standing) in zip(keys[start..<end], chunk) { body(key, standing) }
            chunk.removeAll(keepingCapacity: true)
            start = end
        }
    }

    /// The status of `key` at `localNow`, or nil when memory holds nothing for it.
    func status(_ key: TokenKey, tracked: Bool, localNow: Date) -> SubjectStatus? {
        state.withLock { state in
            guard let entry = state[entry: key] else { return nil }
            let now = RefreshMoment(corrected: localNow.addingTimeInterval(state.clockOffset), local: localNow)
            let (condition, usable) = machine.standing(of: entry, at: now)
            let token = usable ? entry.token : nil
            return SubjectStatus(key: key, tracked: tracked, state: condition, expiresAt: token?.expiresAt,
                                 fingerprint: token?.fingerprint, source: token == nil ? nil : entry.source, failure: entry.failure)
        }
    }
}
