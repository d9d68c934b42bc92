import Foundation
import Testing
import TestSupportKit
@testable import FleetTokenStore

/// The refresh machine with plain values: each rule of the README's "How refresh works" that it
/// decides is a test here. No clock, no store, no task, no sleep.
@Suite("RefreshMachine: every refresh rule of one key, decided once", .paced)
struct RefreshMachineTests {
    let key = try! TokenKey.vehicle("truck-7")
    let policy = RefreshPolicy()
    var machine: RefreshMachine { RefreshMachine(policy: policy) }
    let t0 = Date(timeIntervalSince1970: 1_800_000_000)
    var now: RefreshMoment { RefreshMoment(corrected: t0, local: t0) }

    /// A token of `lifetime` seconds issued `age` seconds before t0.
    func token(age: TimeInterval, lifetime: TimeInterval = 3600, _ value: String = "v1") -> StoredToken {
        let issued = t0.addingTimeInterval(-age)
        return StoredToken(key: key, value: value, expiresAt: issued.addingTimeInterval(lifetime), issuedAt: issued, fetchedAt: issued)
    }

    /// The state of a key holding `token` with its unjittered soft point.
    func held(_ token: StoredToken?, failure: RefreshFailureState? = nil, lastError: TokenProviderError? = nil) -> MemoryEntry {
        guard let token else {
            return MemoryEntry(token: nil, source: .store, softPoint: .distantPast, usableUntil: .distantPast, failure: failure,
                               lastError: lastError, lastUsed: .distantPast, refreshRequested: false)
        }
        return machine.installing(token, source: .store, failure: failure, lastError: lastError, lastUsed: .distantPast, jitter: 0)
    }

    func failure(failures: Int = 1, next: TimeInterval, at: TimeInterval = -1, digest: String? = nil) -> RefreshFailureState {
        RefreshFailureState(consecutiveFailures: failures, nextAttemptAt: t0.addingTimeInterval(next), lastErrorKind: "timeout",
                            lastErrorMessage: "token provider did not answer within 5.0 s", lastFailureAt: t0.addingTimeInterval(at),
                            configurationDigest: digest)
    }

    // MARK: - Soft point and floor

    @Test("soft point: 80% of the lifetime, moved earlier by up to 5% of it; never past the floor")
    func softPoint() {
        let fresh = token(age: 0)
        #expect(machine.softPoint(of: fresh, jitter: 0) == t0.addingTimeInterval(2880))
        #expect(machine.softPoint(of: fresh, jitter: 1) == t0.addingTimeInterval(2700))
        #expect(abs(machine.softPoint(of: fresh, jitter: 0.5).timeIntervalSince(t0) - 2790) < 1e-6)
        var late = RefreshPolicy()
        late.softPointFraction = 0.999
        #expect(RefreshMachine(policy: late).softPoint(of: fresh, jitter: 0) == t0.addingTimeInterval(3570),
                "a soft point the policy puts past the floor is the floor")
    }

    @Test("floor: min(30 s, 10% of the lifetime) before expiry, never handed out")
    func floor() {
        #expect(machine.usableUntil(of: token(age: 0)) == t0.addingTimeInterval(3570))
        #expect(machine.usableUntil(of: token(age: 0, lifetime: 100)) == t0.addingTimeInterval(90))
        #expect(machine.isAboveFloor(token(age: 3560), at: t0))
        #expect(!machine.isAboveFloor(token(age: 3570), at: t0))
        #expect(!machine.isAboveFloor(token(age: 3571), at: t0))
        #expect(machine.isAboveFloor(token(age: 89, lifetime: 100), at: t0))
        #expect(!machine.isAboveFloor(token(age: 90, lifetime: 100), at: t0))
    }

    // MARK: - Caller hit

    @Test("a hit before the soft point serves the token and records the use")
    func freshHit() {
        let fresh = token(age: 600)
        var entry = held(fresh)
        guard case .fresh(let served) = machine.hit(&entry, at: now) else { Issue.record("not fresh"); return }
        #expect(served == fresh)
        #expect(entry.lastUsed == t0)
        #expect(!entry.refreshRequested)
    }

    @Test("past the soft point the token is served and only the first caller starts the one background refresh")
    func staleHit() {
        let due = token(age: 3000)
        var entry = held(due)
        guard case .stale(let first, startRefresh: true, offline: false) = machine.hit(&entry, at: now) else {
            Issue.record("the first caller was not told to refresh"); return
        }
        #expect(first == due)
        guard case .stale(_, startRefresh: false, offline: false) = machine.hit(&entry, at: now) else {
            Issue.record("a second caller started another refresh"); return
        }
    }

    @Test("below the floor or with nothing held, a hit is a miss: callers wait for the shared fetch")
    func missBelowFloor() {
        var low = held(token(age: 3575))
        guard case .miss = machine.hit(&low, at: now) else { Issue.record("a token below the floor was served"); return }
        var empty = held(nil)
        guard case .miss = machine.hit(&empty, at: now) else { Issue.record("nothing held, yet served"); return }
    }

    // MARK: - Offline serving

    @Test("while refreshes fail the held token is served above the floor (offline), never below it")
    func offline() {
        let due = token(age: 3000)
        var entry = held(due, failure: failure(next: 60))
        guard case .stale(_, startRefresh: false, offline: true) = machine.hit(&entry, at: now) else {
            Issue.record("a hit during a backoff was not offline, or started a refresh"); return
        }
        #expect(machine.flightFailed(held: held(due), at: t0) == .serveOffline(due))
        #expect(machine.flightFailed(held: held(token(age: 3571)), at: t0) == .unavailable)
        #expect(machine.flightFailed(held: held(nil), at: t0) == .unavailable)
        #expect(machine.flightFailed(held: nil, at: t0) == .unavailable)
    }

    // MARK: - Backoff

    @Test("backoff: 1 s doubling to 5 min with equal jitter, counting on from the previous failure")
    func backoff() {
        let error = TokenProviderError.timeout(seconds: 5)
        let first = machine.failure(after: error, following: nil, at: t0, random: 0, configurationDigest: "d1")
        #expect(first.consecutiveFailures == 1)
        #expect(first.nextAttemptAt == t0.addingTimeInterval(0.5))
        #expect(first.lastFailureAt == t0 && first.configurationDigest == "d1" && first.lastErrorKind == "timeout")
        let third = machine.failure(after: error, following: failure(failures: 2, next: 0), at: t0, random: 1, configurationDigest: nil)
        #expect(third.consecutiveFailures == 3)
        #expect(third.nextAttemptAt == t0.addingTimeInterval(4))
        let capped = machine.failure(after: error, following: failure(failures: 40, next: 0), at: t0, random: 0, configurationDigest: nil)
        #expect(capped.nextAttemptAt == t0.addingTimeInterval(150))
    }

    @Test("answers retrying will not fix start at 30 s; Retry-After is honoured up to an hour")
    func backoffKinds() {
        let forbidden = machine.failure(after: .httpStatus(code: 403, retryAfter: nil), following: nil, at: t0, random: 1,
                                        configurationDigest: nil)
        #expect(forbidden.nextAttemptAt == t0.addingTimeInterval(30))
        let asked = machine.failure(after: .httpStatus(code: 503, retryAfter: 120), following: nil, at: t0, random: 1,
                                    configurationDigest: nil)
        #expect(asked.nextAttemptAt == t0.addingTimeInterval(120))
        let hostile = machine.failure(after: .httpStatus(code: 503, retryAfter: 86_400), following: nil, at: t0, random: 1,
                                      configurationDigest: nil)
        #expect(hostile.nextAttemptAt == t0.addingTimeInterval(3600))
    }

    @Test("no progress (a token expiring no later than the held one) backs off")
    func noProgress() {
        let error = TokenProviderError.invalidToken(.noProgress(expiresAt: t0))
        let failure = machine.failure(after: error, following: nil, at: t0, random: 1, configurationDigest: nil)
        #expect(failure.lastErrorKind == error.kind)
        #expect(failure.nextAttemptAt > t0)
        #expect(machine.isBackingOff(failure, at: t0))
    }

    @Test("a backoff holds until its next attempt; one recorded beyond the host tolerance after now is over (clock stepped back)")
    func backingOff() {
        #expect(machine.isBackingOff(failure(next: 30), at: t0))
        #expect(!machine.isBackingOff(failure(next: 30), at: t0.addingTimeInterval(30)))
        #expect(!machine.isBackingOff(nil, at: t0))
        #expect(machine.isBackingOff(failure(next: 60, at: 20), at: t0), "another host 20 s ahead")
        #expect(!machine.isBackingOff(failure(next: 3600, at: 3000), at: t0), "recorded before an hour's step back")
    }

    @Test("a failure is bound to the configuration that failed: another configuration is tried at once, keeping the count")
    func configurationDigest() {
        let failed = failure(failures: 3, next: 60, digest: "old")
        let judged = machine.judged(failed, under: "new", at: t0)
        #expect(judged?.nextAttemptAt == t0 && judged?.consecutiveFailures == 3)
        #expect(machine.judged(failed, under: "old", at: t0) == failed)
        #expect(machine.judged(failed, under: nil, at: t0) == failed, "a fetcher without a digest keeps the backoff")
        #expect(machine.judged(failure(next: 60), under: "new", at: t0) == failure(next: 60), "an older build's failure keeps it")
        #expect(machine.judged(nil, under: "new", at: t0) == nil)
    }

    @Test("retry now ends a running backoff, keeping the count; Retry-After holds unless asked of another configuration")
    func retryNow() {
        var running = held(nil, failure: failure(failures: 4, next: 60), lastError: .timeout(seconds: 5))
        #expect(machine.retryNow(&running, at: t0, configurationDigest: nil))
        #expect(running.failure?.nextAttemptAt == t0 && running.failure?.consecutiveFailures == 4)
        #expect(!machine.retryNow(&running, at: t0, configurationDigest: nil), "nothing left to end")
        var asked = held(nil, failure: failure(next: 60, digest: "d1"), lastError: .httpStatus(code: 429, retryAfter: 60))
        #expect(!machine.retryNow(&asked, at: t0, configurationDigest: "d1"))
        #expect(asked.failure?.nextAttemptAt == t0.addingTimeInterval(60))
        #expect(machine.retryNow(&asked, at: t0, configurationDigest: "d2"))
    }

    // MARK: - Deadline and proactive refresh

    @Test("a key is due at its soft point, now without a token, and never before its backoff ends")
    func nextRefresh() {
        let fresh = token(age: 600)
        #expect(machine.nextRefresh(of: held(fresh), at: now) == policy.softPoint(of: fresh, jitter: 0))
        #expect(machine.nextRefresh(of: held(nil), at: now) == t0)
        #expect(machine.nextRefresh(of: nil, at: now) == t0)
        let skewed = RefreshMoment(corrected: t0.addingTimeInterval(120), local: t0)
        #expect(machine.nextRefresh(of: held(nil, failure: failure(next: 30)), at: skewed) == t0.addingTimeInterval(150),
                "a local-time backoff is moved onto the corrected timeline")
    }

    @Test("tracked keys and keys used within the idle window are refreshed proactively; idle ones are not")
    func proactiveRefresh() {
        var used = held(token(age: 600))
        #expect(machine.wantsProactiveRefresh(tracked: true, held: nil, at: t0))
        #expect(!machine.wantsProactiveRefresh(tracked: false, held: used, at: t0))
        used.lastUsed = t0.addingTimeInterval(-599)
        #expect(machine.wantsProactiveRefresh(tracked: false, held: used, at: t0))
        used.lastUsed = t0.addingTimeInterval(-601)
        #expect(!machine.wantsProactiveRefresh(tracked: false, held: used, at: t0))
    }

    // MARK: - Another process's token

    @Test("another process's token is adopted when different, later-expiring and above its floor")
    func adoption() {
        let mine = token(age: 600, "mine")
        #expect(machine.adopts(token(age: 10, "theirs"), over: mine, at: t0))
        #expect(machine.adopts(token(age: 10, "theirs"), over: nil, at: t0))
        #expect(!machine.adopts(token(age: 900, "older"), over: mine, at: t0), "a slow writer's older token loses")
        #expect(!machine.adopts(mine, over: mine, at: t0))
        let short = token(age: 0, lifetime: 20, "short") // expires later than nothing, below its floor soon
        #expect(!machine.adopts(short, over: nil, at: t0.addingTimeInterval(19)), "a token below its floor is not adopted")
    }

    @Test("no token read from the store is adopted while the key's invalidation waits for the store")
    func noAdoptionWhileInvalidating() {
        let mine = token(age: 600, "mine")
        let theirs = token(age: 10, "theirs")
        var state = KeyRefreshState(held: held(mine))
        #expect(machine.adopts(theirs, into: state, at: t0))
        state.invalidationPending = true
        #expect(!machine.adopts(theirs, into: state, at: t0), "the stored token is the invalidated one, or older")
        state.held = held(nil)
        #expect(!machine.adopts(theirs, into: state, at: t0), "not even into a key holding nothing")
        state.invalidationPending = false
        #expect(machine.adopts(theirs, into: state, at: t0), "once the removal is stored, a later token is another process's")
        state.flight = .waitingForHolder(until: t0)
        #expect(machine.adopts(theirs, into: state, at: t0), "a flight in progress does not stop an adoption")
    }

    @Test("a key memory holds nothing of is loaded from the store: its token above the floor, unless its invalidation waits")
    func loading() {
        let stored = token(age: 600, "stored")
        let backoff = failure(next: 60)
        let entry = TokenEntry(key: key, token: stored, failure: backoff)
        #expect(machine.loaded(entry, into: KeyRefreshState(), at: t0) == .install(stored, failure: backoff))
        #expect(machine.loaded(TokenEntry(key: key, token: token(age: 3575), failure: backoff), into: KeyRefreshState(), at: t0)
            == .empty(failure: backoff), "below the floor: no token, the backoff kept")
        #expect(machine.loaded(nil, into: KeyRefreshState(), at: t0) == .empty(failure: nil),
                "nothing stored is remembered, so a miss does not read the store again")
        let invalidating = KeyRefreshState(flight: .queuedForSlot, invalidationPending: true)
        #expect(machine.loaded(entry, into: invalidating, at: t0) == .empty(failure: backoff),
                "the stored token of a key whose invalidation waits for the store is the invalidated one")
        #expect(machine.loaded(entry, into: KeyRefreshState(held: held(nil)), at: t0) == .keep, "what memory holds stays")
    }

    @Test("another process's change: a newer token is adopted, a removal keeps the newer failure, our pending commit wins")
    func storeChanges() {
        let mine = token(age: 600, "mine")
        let newer = token(age: 10, "theirs")
        #expect(machine.storeChanged(held: held(mine), stored: TokenEntry(key: key, token: newer, failure: nil),
                                     commitPending: false, at: t0) == .adopt(newer, failure: nil))
        #expect(machine.storeChanged(held: held(newer), stored: TokenEntry(key: key, token: mine, failure: nil),
                                     commitPending: false, at: t0) == .none, "a slow writer's older token loses")
        #expect(machine.storeChanged(held: held(mine), stored: TokenEntry(key: key, token: mine, failure: nil),
                                     commitPending: false, at: t0) == .none)
        let purgedKeepingBackoff = failure(next: 60, at: -1)
        #expect(machine.storeChanged(held: held(mine, failure: failure(next: 5, at: -100)),
                                     stored: TokenEntry(key: key, token: nil, failure: purgedKeepingBackoff),
                                     commitPending: false, at: t0) == .removed(failure: purgedKeepingBackoff))
        #expect(machine.storeChanged(held: held(mine, failure: purgedKeepingBackoff), stored: nil, commitPending: false, at: t0)
            == .removed(failure: nil), "a deleted row took its backoff along")
        #expect(machine.storeChanged(held: held(mine), stored: nil, commitPending: true, at: t0) == .none)
        #expect(machine.storeChanged(held: held(nil), stored: nil, commitPending: false, at: t0) == .none)
        // A value this process cannot read (another key, or none) is not a removal: the token held stays.
        var unreadable = TokenEntry(key: key, token: nil, failure: nil)
        unreadable.tokenUnreadable = true
        #expect(machine.storeChanged(held: held(mine), stored: unreadable, commitPending: false, at: t0) == .none)
    }

    // MARK: - Invalidate

    @Test("invalidate drops the token and keeps the backoff; a key neither held nor tracked gets no entry")
    func invalidate() {
        let backoff = failure(next: 60)
        #expect(machine.invalidate(held: held(token(age: 10), failure: backoff), tracked: false) == .dropToken(keeping: backoff))
        #expect(machine.invalidate(held: held(token(age: 10)), tracked: true) == .dropToken(keeping: nil))
        #expect(machine.invalidate(held: nil, tracked: true) == .dropToken(keeping: nil))
        #expect(machine.invalidate(held: nil, tracked: false) == .nothingHeld)
    }

    // MARK: - Status

    @Test("status: valid before the soft point, refresh due past it, backoff while failing, unavailable below the floor")
    func standing() {
        #expect(machine.standing(of: held(token(age: 600)), at: now) == (.valid, true))
        #expect(machine.standing(of: held(token(age: 3000)), at: now) == (.refreshDue, true))
        #expect(machine.standing(of: held(token(age: 3000), failure: failure(next: 60)), at: now) == (.backoff, true))
        #expect(machine.standing(of: held(token(age: 3575), failure: failure(next: 60)), at: now) == (.backoff, false))
        #expect(machine.standing(of: held(token(age: 3575)), at: now) == (.unavailable, false))
        #expect(machine.standing(of: held(nil), at: now) == (.unavailable, false))
    }
}

/// The machine under random event sequences, driven as the engine drives it: memory's entry,
/// at most one flight (a ``RefreshDecision``; a second request joins the running one, as in
/// the coordinator), another process writing the store, the scheduler, invalidation (its removal
/// reaching the store later, as the group commit writes it), retry-now, configuration changes
/// and wall-clock steps. Every event checks the invariants.
@Suite("RefreshMachine under generated event sequences", .paced)
struct RefreshMachineGeneratedTests {
    @Test("2,000 seeded sequences of 50 events: never served past the floor or once invalidated, one fetch at a time, no retry before the backoff")
    func invariants() async {
        // A new seed each run, printed with any failure; REFRESH_MACHINE_SEED replays one.
        let seed = ProcessInfo.processInfo.environment["REFRESH_MACHINE_SEED"].flatMap { UInt64($0) }
            ?? UInt64.random(in: 1...UInt64.max)
        // Seconds of pure computation run on a thread of their own: on a cooperative thread they
        // would take one of the few (two on a 2-core machine) that every other test in this
        // process shares, and their waits on engines and processes would time out meanwhile.
        let violation = await withCheckedContinuation { continuation in
            Thread { continuation.resume(returning: Self.firstViolation(seed: seed)) }.start()
        }
        if let violation { Issue.record(Comment(rawValue: violation)) }
    }

    /// The first invariant broken in the 2,000 sequences `seed` makes, described; nil when none is.
    static func firstViolation(seed: UInt64) -> String? {
        var seeds = SeededGenerator(seed: seed)
        for sequence in 0..<2000 {
            var simulation = KeySimulation(random: SeededGenerator(seed: seeds.next()))
            for event in 0..<50 {
                if let violation = simulation.step() {
                    return """
                        seed \(seed) (REFRESH_MACHINE_SEED=\(seed) replays it), sequence \(sequence), event \(event): \
                        \(violation); events: \(simulation.trace.joined(separator: " "))
                        """
                }
            }
        }
        return nil
    }
}

/// One key and its owner, reduced to values: what the engine's memory, coordinator, flight and
/// change follower do with the machine's answers, without clocks, tasks or a store.
private struct KeySimulation {
    let key = try! TokenKey.vehicle("sim")
    let policy = RefreshPolicy()
    var machine: RefreshMachine { RefreshMachine(policy: policy) }
    var random: SeededGenerator
    var local = Date(timeIntervalSince1970: 1_800_000_000)
    /// Provider clock minus ours, as the skew tracker applies it.
    var offset: TimeInterval = 0
    var entry: MemoryEntry?
    /// An invalidation's removal waits for the group commit (the store still holds the token).
    var invalidationPending = false
    /// The values of the tokens invalidated so far: never to be served again.
    var invalidated: Set<String> = []
    /// What the store holds (another process writes it too).
    var store: TokenEntry?
    var flight: RefreshDecision?
    /// The flight's next step, not yet taken.
    var pending: RefreshDecision.Action?
    /// A caller was served past the soft point: a background flight follows this one.
    var refreshAfterFlight = false
    /// A hit told a caller to start the one refresh, and no flight, install or failure has ended it.
    var refreshStarted = false
    var fetchesInFlight = 0
    var digest = "configuration-1"
    var fetchDigest = "configuration-1"
    /// Retry-now or a configuration change since the last failure: an early retry is allowed.
    var earlyRetryAllowed = false
    var serial = 0
    /// Local time the running flight started (and decided whether a backoff holds).
    var flightStartedAt = Date.distantPast
    var trace: [String] = []

    init(random: SeededGenerator) { self.random = random }

    var now: RefreshMoment { RefreshMoment(corrected: local.addingTimeInterval(offset), local: local) }

    /// The key's whole state, as TokenMemory keeps it.
    var keyState: KeyRefreshState {
        KeyRefreshState(held: entry, flight: flight?.state, invalidationPending: invalidationPending)
    }

    mutating func chance(_ percent: Int) -> Bool { Int.random(in: 0..<100, using: &random) < percent }

    mutating func step() -> String? {
        let roll = Int.random(in: 0..<100, using: &random)
        let violation: String?
        switch roll {
        case 0..<20: trace.append("time"); local += chance(70) ? Double.random(in: 0.1...5, using: &random) : Double.random(in: 5...900, using: &random); violation = nil
        case 20..<42: trace.append("hit"); violation = hit()
        case 42..<72: violation = advanceFlight()
        case 72..<80: trace.append("deadline"); violation = deadline()
        case 80..<86: trace.append("store"); otherProcessWrites(); violation = nil
        case 86..<89: trace.append("invalidate"); invalidate(); violation = nil
        case 89: trace.append("removalCommitted"); removalCommitted(); violation = nil
        case 90..<93: trace.append("retryNow"); retryNow(); violation = nil
        case 93..<96: trace.append("config"); changeConfiguration(); violation = nil
        default: trace.append("clockStep"); stepClock(); violation = nil
        }
        if entry?.refreshRequested != true { refreshStarted = false }
        return violation
    }

    // MARK: - Invariants

    /// A token handed out must have more than its floor left: judged here from the policy's
    /// numbers, not by the machine.
    func served(_ token: StoredToken, _ how: String) -> String? {
        if invalidated.contains(token.value) { return "\(how) served an invalidated token" }
        let floor = min(policy.floorSeconds, policy.floorFraction * token.lifetime)
        guard now.corrected < token.expiresAt.addingTimeInterval(-floor) else {
            return "\(how) served a token \(token.expiresAt.timeIntervalSince(now.corrected)) s before expiry, floor \(floor) s"
        }
        return nil
    }

    // MARK: - Events

    mutating func hit() -> String? {
        guard var held = entry else { return startFlight(.caller) }
        let lookup = machine.hit(&held, at: now)
        entry = held
        switch lookup {
        case .fresh(let token):
            return served(token, "a fresh hit")
        case .stale(let token, let start, _):
            if let violation = served(token, "a hit past the soft point") { return violation }
            guard start else { return nil }
            if refreshStarted { return "a second caller was told to start the refresh" }
            refreshStarted = true
            return startFlight(.background)
        case .miss:
            return startFlight(.caller)
        }
    }

    mutating func deadline() -> String? {
        // The deadline itself never comes before a running backoff ends.
        if let failure = runningBackoff(at: local) {
            let end = failure.nextAttemptAt.addingTimeInterval(offset)
            let due = machine.nextRefresh(of: entry, at: now)
            if due < end { return "due \(end.timeIntervalSince(due)) s before the backoff ends" }
        }
        // The scheduler skips a key whose flight runs; a tracked key is always wanted.
        guard flight == nil, machine.wantsProactiveRefresh(tracked: true, held: entry, at: now.corrected),
              now.corrected >= machine.nextRefresh(of: entry, at: now) else { return nil }
        return startFlight(.background)
    }

    mutating func otherProcessWrites() {
        switch Int.random(in: 0..<4, using: &random) {
        case 0, 1:
            let lifetime = [3600.0, 600, 100, 20].randomElement(using: &random)!
            store = TokenEntry(key: key, token: mint(age: .random(in: 0...lifetime, using: &random), lifetime: lifetime), failure: nil)
        case 2:
            store?.token = nil // a purge keeps the failure
        default:
            store = nil // a deleted row takes it along
        }
        // The change follower.
        guard let held = entry else { return }
        switch machine.storeChanged(held: held, stored: admitted(store), commitPending: false, at: now.corrected) {
        case .adopt(let token, let failure): adoptIfNewer(token, failure: failure)
        case .removed(let failure): entry?.clearToken(keeping: failure)
        case .none: break
        }
    }

    /// The removal is queued for the group commit; the store keeps the token until it is written.
    mutating func invalidate() {
        if let value = entry?.token?.value { invalidated.insert(value) }
        if let value = store?.token?.value { invalidated.insert(value) }
        invalidationPending = true
        switch machine.invalidate(held: entry, tracked: true) {
        case .dropToken(let failure): makeEntry(); entry?.clearToken(keeping: failure)
        case .nothingHeld: break
        }
    }

    /// The group commit wrote the invalidation's removal.
    mutating func removalCommitted() {
        guard invalidationPending else { return }
        store?.token = nil
        invalidationPending = false
    }

    mutating func retryNow() {
        guard var held = entry else { return }
        if machine.retryNow(&held, at: local, configurationDigest: digest) { earlyRetryAllowed = true }
        entry = held
    }

    mutating func changeConfiguration() {
        digest = "configuration-\(Int.random(in: 1...3, using: &random))"
        let judged = machine.judged(entry?.failure, under: digest, at: local)
        entry?.failure = judged
        earlyRetryAllowed = true
    }

    mutating func stepClock() {
        let sign: Double = chance(50) ? 1 : -1
        local += sign * Double.random(in: 30...3600, using: &random)
        offset = [0, 0, 90, -90].randomElement(using: &random)!
    }

    // MARK: - The flight, as RefreshFlight drives it

    mutating func startFlight(_ request: RefreshDecision.Request) -> String? {
        guard flight == nil else { return nil } // joins the running flight
        trace.append("start(\(request))")
        if entry == nil { load() }
        flightStartedAt = local
        var decision = RefreshDecision(request: request, policy: policy)
        let action = decision.start(held: entry, at: now)
        flight = decision
        return perform(action)
    }

    mutating func advanceFlight() -> String? {
        guard var decision = flight, let action = pending else { return nil }
        trace.append("step")
        let next: RefreshDecision.Action
        switch action {
        case .acquireFetchSlot:
            next = decision.isServed(by: entry, at: now)
                ? decision.slotWaitEnded(held: entry, at: now) : decision.slotGranted(held: entry, at: now)
        case .takeLease, .takeOverLease:
            switch Int.random(in: 0..<10, using: &random) {
            case 0..<6: next = decision.leaseGranted(current: admitted(store), held: entry, at: now)
            case 6..<9: next = decision.leaseBusy(holder: "other", holderIsDead: chance(30), until: local + 30,
                                                  current: admitted(store), held: entry, at: now)
            default: next = decision.leaseUnavailable(held: entry)
            }
        case .adopt(let token, let failure):
            adoptIfNewer(token, failure: failure)
            next = decision.adopted(held: entry, at: now)
        case .waitForHolder(let seconds):
            local += Double.random(in: 0...seconds, using: &random)
            if chance(30) { otherProcessWrites() }
            next = decision.holderWaitEnded(feedMentionedKey: chance(50), held: entry, at: now)
        case .readStoredEntry:
            next = decision.storedEntryRead(admitted(store), held: entry, at: now)
        case .fetch(let previous):
            fetchesInFlight -= 1
            let token = mint(age: 0, lifetime: [3600.0, 600, 100].randomElement(using: &random)!)
            if chance(40), token.expiresAt > (previous?.expiresAt ?? .distantPast) {
                next = decision.fetchSucceeded(token)
            } else {
                let errors: [TokenProviderError] = [
                    .timeout(seconds: 5), .httpStatus(code: 503, retryAfter: nil), .httpStatus(code: 429, retryAfter: 40),
                    .httpStatus(code: 503, retryAfter: 7200), .httpStatus(code: 403, retryAfter: nil),
                    .invalidToken(.noProgress(expiresAt: previous?.expiresAt ?? local)),
                ]
                next = decision.fetchFailed(errors.randomElement(using: &random)!, held: entry, at: now,
                                            random: .random(in: 0...1, using: &random), configurationDigest: fetchDigest)
            }
        default:
            return "a terminal action \(action) was left pending"
        }
        flight = decision
        return perform(next)
    }

    /// Does what `action` says; a terminal one ends the flight.
    mutating func perform(_ action: RefreshDecision.Action) -> String? {
        switch action {
        case .serve(let token, _):
            let violation = served(token, "a flight")
            return violation ?? endFlight()
        case .serveAndRefreshInBackground(let token):
            refreshAfterFlight = true
            let violation = served(token, "a caller's flight past the soft point")
            return violation ?? endFlight()
        case .fail:
            let caller = flight?.request.isCaller ?? false
            if caller, case .serveOffline(let token) = machine.flightFailed(held: entry, at: now.corrected),
               let violation = served(token, "offline serving") {
                return violation
            }
            return endFlight()
        case .failedElsewhere(let failure):
            recordFailure(failure, error: RefreshDecision.persistedError(failure))
            return endFlight()
        case .accept(let token, _):
            install(token, source: .provider, failure: nil)
            // The new token's commit replaces a removal still waiting (the committer keeps one
            // write per key, the newest).
            store = TokenEntry(key: key, token: token, failure: nil)
            invalidationPending = false
            return endFlight()
        case .backOff(let failure, let error):
            let violation = checkBackoff(failure, error)
            recordFailure(failure, error: error)
            store = TokenEntry(key: key, token: store?.token, failure: failure)
            earlyRetryAllowed = false
            return violation ?? endFlight()
        case .adopt(let token, let failure):
            // RefreshFlight offers a stored token to memory right after the read that found it,
            // with no suspension point between: one step here.
            guard var decision = flight else { return "an adoption without a flight" }
            adoptIfNewer(token, failure: failure)
            let next = decision.adopted(held: entry, at: now)
            flight = decision
            return perform(next)
        case .fetch:
            if fetchesInFlight > 0 { return "a second fetch started while one runs" }
            fetchesInFlight += 1
            fetchDigest = digest
            pending = action
            return checkRetryTime()
        default:
            pending = action
            return nil
        }
    }

    /// The backoff memory holds, if one runs at local `time` (judged here from the failure's
    /// times, not by the machine); nil once it ended, was ended on purpose, or the wall clock was
    /// stepped back past the failure.
    func runningBackoff(at time: Date) -> RefreshFailureState? {
        guard let failure = entry?.failure, !earlyRetryAllowed, time < failure.nextAttemptAt,
              failure.lastFailureAt <= time.addingTimeInterval(policy.hostClockTolerance) else { return nil }
        return failure
    }

    /// A fetch starts only when no backoff ran as its flight decided to attempt (a flight
    /// decides once, at its start: a second wall-clock step while it runs is not a new decision),
    /// and none runs now.
    func checkRetryTime() -> String? {
        guard let failure = runningBackoff(at: local), runningBackoff(at: flightStartedAt) != nil else { return nil }
        return "a fetch started \(failure.nextAttemptAt.timeIntervalSince(local)) s before the backoff ends"
    }

    /// A new failure waits at least half the policy's nominal delay (equal jitter), at most the
    /// nominal delay or the honoured Retry-After, and counts on from the failure memory held.
    func checkBackoff(_ failure: RefreshFailureState, _ error: TokenProviderError) -> String? {
        let nominal = policy.nominalBackoff(afterFailures: failure.consecutiveFailures, retryable: error.isRetryable)
        let retryAfter = error.retryAfter.map { min($0, RefreshPolicy.maximumRetryAfter) } ?? 0
        let delay = failure.nextAttemptAt.timeIntervalSince(failure.lastFailureAt)
        if delay < max(nominal / 2, retryAfter) - 1e-9 { return "a backoff of \(delay) s, under the policy's \(max(nominal / 2, retryAfter)) s" }
        if delay > max(nominal, retryAfter) + 1e-9 { return "a backoff of \(delay) s, over the policy's \(max(nominal, retryAfter)) s" }
        let expected = (entry?.failure?.consecutiveFailures ?? 0) + 1
        if failure.consecutiveFailures != expected { return "failure count \(failure.consecutiveFailures), expected \(expected)" }
        return nil
    }

    /// Ends the flight as the coordinator does; a follow-up background flight starts at once.
    mutating func endFlight() -> String? {
        flight = nil
        pending = nil
        entry?.refreshRequested = false
        refreshStarted = false
        guard refreshAfterFlight else { return nil }
        refreshAfterFlight = false
        return startFlight(.background)
    }

    // MARK: - Memory, as TokenMemory and EngineParts apply the machine

    mutating func mint(age: TimeInterval, lifetime: TimeInterval) -> StoredToken {
        serial += 1
        let issued = now.corrected.addingTimeInterval(-age)
        return StoredToken(key: key, value: "token-\(serial)", expiresAt: issued.addingTimeInterval(lifetime), issuedAt: issued,
                           fetchedAt: issued)
    }

    func admitted(_ stored: TokenEntry?) -> TokenEntry? {
        guard var stored else { return nil }
        stored.failure = machine.judged(stored.failure, under: digest, at: local)
        return stored
    }

    mutating func load() {
        switch machine.loaded(admitted(store), into: keyState, at: now.corrected) {
        case .keep: break
        case .install(let token, let failure): install(token, source: .store, failure: failure)
        case .empty(let failure): makeEntry(); entry?.clearToken(keeping: failure)
        }
    }

    mutating func adoptIfNewer(_ token: StoredToken, failure: RefreshFailureState?) {
        guard machine.adopts(token, into: keyState, at: now.corrected) else { return }
        install(token, source: .otherProcess, failure: machine.judged(failure, under: digest, at: local))
    }

    mutating func install(_ token: StoredToken, source: TokenSource, failure: RefreshFailureState?) {
        entry = machine.installing(token, source: source, failure: failure, lastError: entry?.lastError,
                                   lastUsed: entry?.lastUsed ?? .distantPast, jitter: .random(in: 0...1, using: &random))
    }

    mutating func recordFailure(_ failure: RefreshFailureState, error: TokenProviderError) {
        makeEntry()
        entry?.failure = failure
        entry?.lastError = error
        entry?.refreshRequested = false
    }

    mutating func makeEntry() {
        if entry == nil {
            entry = MemoryEntry(token: nil, source: .store, softPoint: .distantPast, usableUntil: .distantPast, failure: nil,
                                lastError: nil, lastUsed: .distantPast, refreshRequested: false)
        }
    }
}
