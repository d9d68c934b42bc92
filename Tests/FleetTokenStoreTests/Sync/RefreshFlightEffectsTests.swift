import Foundation
import Synchronization
import Testing
@testable import FleetTokenStore

/// A ``RefreshFlight`` driven through a recording ``RefreshEffects``: the key's state is a plain
/// ``KeyRefreshState`` applied with the refresh machine, the store, the lease and the provider
/// answer what each test sets, and every step of I/O the flight takes is written down. No
/// clock, no store, no task besides the flight's own, no sleep.
@Suite("RefreshFlight through its effects: what each step does, recorded", .paced)
struct RefreshFlightEffectsTests {
    static let key = try! TokenKey.vehicle("truck-7")
    static let t0 = Date(timeIntervalSince1970: 1_800_000_000)

    /// Memory's entry for a key it knows holds no token.
    static let nothingHeld = MemoryEntry(token: nil, source: .store, softPoint: .distantPast, usableUntil: .distantPast,
                                         failure: nil, lastError: nil, lastUsed: .distantPast, refreshRequested: false)

    /// A one-hour token issued `age` seconds before t0.
    static func token(age: TimeInterval, _ value: String) -> StoredToken {
        let issued = t0.addingTimeInterval(-age)
        return StoredToken(key: key, value: value, expiresAt: issued.addingTimeInterval(3600), issuedAt: issued, fetchedAt: issued)
    }

    @Test("a live holder's token, mentioned by the feed, is read and adopted: no fetch")
    func adoptsAfterWaitingForHolder() async throws {
        let theirs = Self.token(age: 10, "theirs")
        let effects = RecordingEffects()
        let stored = TokenEntry(key: Self.key, token: theirs, failure: nil)
        effects.with { $0.key.held = Self.nothingHeld
            $0.lease = .busy(holder: "other", holderIsDead: false, until: Self.t0 + 30, current: nil)
            $0.stored = stored }
        var flight = RefreshFlight(key: Self.key, request: .caller, effects: effects)
        guard case .token(let served) = await flight.run() else { Issue.record("no token"); return }
        #expect(served == theirs)
        #expect(effects.steps == [
            "acquireFetchSlot", "takeLease", "releaseFetchSlot", "waitForHolder(1.0)", "readStoredEntry",
            "adopt(theirs): yes", "scheduleNextRefresh",
        ])
        #expect(effects.keyState.held?.token == theirs)
        #expect(effects.phases == [.queuedForSlot, .askingForLease, .waitingForHolder(until: Self.t0 + 30),
                                   .readingStore(until: Self.t0 + 30),
                                   .adopting(stored: stored, then: .waitForHolder(until: Self.t0 + 30)), .finished])
    }

    @Test("while the key's invalidation waits for the store, the stored token read with the lease is not adopted: a new one is fetched")
    func noAdoptionWhileInvalidating() async throws {
        let invalidated = Self.token(age: 10, "invalidated")
        let fresh = Self.token(age: 0, "fresh")
        let effects = RecordingEffects()
        // Invalidated: memory let the token go, the store still holds it until the removal is written.
        effects.with { $0.key.invalidationPending = true
            $0.key.held = Self.nothingHeld
            $0.lease = .granted(current: TokenEntry(key: Self.key, token: invalidated, failure: nil))
            $0.fetch = .fetched(fresh) }
        var flight = RefreshFlight(key: Self.key, request: .caller, effects: effects)
        guard case .token(let served) = await flight.run() else { Issue.record("no token"); return }
        #expect(served == fresh)
        #expect(effects.steps == [
            "acquireFetchSlot", "takeLease", "adopt(invalidated): no", "fetch(previous: nil)", "releaseFetchSlot",
            "accept(fresh)",
        ])
    }

    @Test("a failed fetch backs off with the policy's delay, the failure bound to the configuration that failed")
    func backsOff() async throws {
        let effects = RecordingEffects()
        effects.with { $0.lease = .granted(current: nil)
            $0.fetch = .failed(.httpStatus(code: 503, retryAfter: nil), configurationDigest: "configuration-1") }
        var flight = RefreshFlight(key: Self.key, request: .background, effects: effects)
        guard case .failed(let reason, let next) = await flight.run() else { Issue.record("a token"); return }
        #expect(reason.code == .provider)
        #expect(effects.steps == [
            "load", "acquireFetchSlot", "takeLease", "fetch(previous: nil)", "releaseFetchSlot",
            "backOff(1 failures, configuration-1)", "releaseLease",
        ])
        let failure = try #require(effects.keyState.held?.failure)
        // The first retry waits between half the nominal 1 s and all of it (equal jitter, 0.5 here).
        #expect(next == failure.nextAttemptAt)
        #expect(failure.nextAttemptAt.timeIntervalSince(Self.t0) >= 0.5 && failure.nextAttemptAt.timeIntervalSince(Self.t0) <= 1)
    }

    @Test("the engine shutting down while the provider answers ends the flight without a token or a failure")
    func interrupted() async throws {
        let effects = RecordingEffects()
        effects.with { $0.lease = .granted(current: nil); $0.fetch = .interrupted }
        var flight = RefreshFlight(key: Self.key, request: .caller, effects: effects)
        guard case .failed(let reason, nil) = await flight.run() else { Issue.record("not a shutdown"); return }
        #expect(reason.code == .shuttingDown)
        #expect(effects.steps == ["load", "acquireFetchSlot", "takeLease", "fetch(previous: nil)", "releaseFetchSlot", "releaseLease"])
        #expect(effects.keyState.held?.failure == nil, "no failure recorded")
    }
}

/// A ``RefreshEffects`` with plain values: memory is one ``KeyRefreshState`` the refresh
/// machine applies its answers to; the store, the lease and the provider answer what the test
/// set; each step is recorded.
private final class RecordingEffects: RefreshEffects {
    struct State {
        var key = KeyRefreshState()
        var stored: TokenEntry?
        var lease: CrossProcessLease.Answer = .unavailable
        var fetch: FetchResult = .interrupted
        var steps: [String] = []
        var phases: [RefreshDecision.State] = []
    }

    let state = Mutex(State())
    let policy = RefreshPolicy()
    var machine: RefreshMachine { RefreshMachine(policy: policy) }
    var moment: RefreshMoment { RefreshMoment(corrected: RefreshFlightEffectsTests.t0, local: RefreshFlightEffectsTests.t0) }
    var isShuttingDown: Bool { false }

    func with(_ change: (inout State) -> Void) { state.withLock { change(&$0) } }
    var steps: [String] { state.withLock { $0.steps } }
    var phases: [RefreshDecision.State] { state.withLock { $0.phases } }
    var keyState: KeyRefreshState { state.withLock { $0.key } }
    private func record(_ step: String) { state.withLock { $0.steps.append(step) } }

    func jitter() -> Double { 0.5 }
    func held(_ key: TokenKey) -> MemoryEntry? { state.withLock { $0.key.held } }

    func flightReached(_ key: TokenKey, _ phase: RefreshDecision.State) {
        state.withLock { state in
            state.key.flight = phase
            if state.phases.last != phase { state.phases.append(phase) }
        }
    }

    func markUsed(_ key: TokenKey) { state.withLock { $0.key.held?.lastUsed = moment.corrected } }

    func load(_ keys: [TokenKey]) async {
        record("load")
        let now = moment.corrected
        state.withLock { state in
            switch machine.loaded(state.stored, into: state.key, at: now) {
            case .keep: break
            case .install(let token, let failure):
                state.key.held = machine.installing(token, source: .store, failure: failure, lastError: nil,
                                                    lastUsed: .distantPast, jitter: 0)
            case .empty(let failure):
                var entry = MemoryEntry(token: nil, source: .store, softPoint: .distantPast, usableUntil: .distantPast,
                                        failure: nil, lastError: nil, lastUsed: .distantPast, refreshRequested: false)
                entry.clearToken(keeping: failure)
                state.key.held = entry
            }
        }
    }

    func readStoredEntry(_ key: TokenKey) async -> TokenEntry? {
        record("readStoredEntry")
        return state.withLock { $0.stored }
    }

    func adoptIfNewer(_ token: StoredToken, failure: RefreshFailureState?) -> Bool {
        let now = moment.corrected
        let adopted = state.withLock { state in
            guard machine.adopts(token, into: state.key, at: now) else { return false }
            state.key.held = machine.installing(token, source: .otherProcess, failure: failure, lastError: nil,
                                                lastUsed: .distantPast, jitter: 0)
            return true
        }
        record("adopt(\(token.value)): \(adopted ? "yes" : "no")")
        return adopted
    }

    func acquireFetchSlot(for key: TokenKey, unless served: () -> Bool) async -> Bool {
        record("acquireFetchSlot")
        return !served()
    }

    func releaseFetchSlot() { record("releaseFetchSlot") }

    func takeLease(_ key: TokenKey) async -> CrossProcessLease.Answer {
        record("takeLease")
        return state.withLock { $0.lease }
    }

    func takeOverLease(_ key: TokenKey, from deadHolder: String) async -> CrossProcessLease.Answer {
        record("takeOverLease(\(deadHolder))")
        return state.withLock { $0.lease }
    }

    func waitForHolder(of key: TokenKey, seconds: TimeInterval) async -> Bool {
        record("waitForHolder(\(seconds))")
        return true
    }

    func releaseLease(_ key: TokenKey) async { record("releaseLease") }

    func fetch(_ key: TokenKey, previous: StoredToken?) async -> FetchResult {
        record("fetch(previous: \(previous?.value ?? "nil"))")
        return state.withLock { $0.fetch }
    }

    func accept(_ token: StoredToken, for key: TokenKey, markUsed: Bool) -> StoredToken {
        record("accept(\(token.value))")
        state.withLock { state in
            state.key.held = machine.installing(token, source: .provider, failure: nil, lastError: nil,
                                                lastUsed: .distantPast, jitter: 0)
        }
        return token
    }

    func backOff(_ key: TokenKey, failure: RefreshFailureState, error: TokenProviderError) async {
        record("backOff(\(failure.consecutiveFailures) failures, \(failure.configurationDigest ?? "-"))")
        recordFailure(key, failure: failure, error: error)
    }

    func recordFailure(_ key: TokenKey, failure: RefreshFailureState, error: TokenProviderError) {
        state.withLock { state in
            if state.key.held == nil {
                state.key.held = MemoryEntry(token: nil, source: .store, softPoint: .distantPast, usableUntil: .distantPast,
                                             failure: nil, lastError: nil, lastUsed: .distantPast, refreshRequested: false)
            }
            state.key.held?.failure = failure
            state.key.held?.lastError = error
        }
    }

    func scheduleNextRefresh(_ key: TokenKey) { record("scheduleNextRefresh") }
}
