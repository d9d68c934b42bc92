import FleetTokenStoreTesting
import Foundation
import Logging
import Synchronization
import Testing
@testable import FleetTokenStore

/// The coordinator driven through a recording ``CoordinatorEffects``: the key state, the
/// schedule, the commit queue, the store and the reporting answer what each test sets, and each
/// effect the coordinator asks for is written down in order. No store and no sleep beyond the
/// scheduler's 5 ms turns: what is checked is which effects each entry point asks for, and in
/// which order.
@Suite("RefreshCoordinator through its effects: what each entry point does, recorded", .paced)
struct RefreshCoordinatorEffectsTests {
    static let key = try! TokenKey.vehicle("truck-9")
    static let t0 = Date(timeIntervalSince1970: 1_800_000_000)

    static func coordinator(_ effects: RecordingCoordinatorEffects) -> RefreshCoordinator<RecordingCoordinatorEffects> {
        let sweeper = RetentionSweeper(repository: InMemoryTokenRepository(), retention: 0, clock: ContinuousClock(),
                                       now: { t0 }, logger: Logger(label: "test"), shutdown: ShutdownFlag())
        return RefreshCoordinator(effects: effects, sweeper: sweeper)
    }

    @Test("invalidating a tracked key queues the removal before memory lets the token go, then reschedules it")
    func invalidateTracked() async {
        let effects = RecordingCoordinatorEffects()
        let coordinator = Self.coordinator(effects)
        await coordinator.track([Self.key])
        #expect(effects.takeSteps() == ["load(0)", "scheduleNextRefresh"], "held already: nothing to load")
        await coordinator.invalidate(Self.key)
        #expect(effects.takeSteps() == [
            "queueRemoval", "dropForInvalidation(tracked: true)", "unschedule", "reportInvalidated", "scheduleNextRefresh",
        ])
    }

    @Test("invalidating a key nobody tracks or uses, which memory does not hold, leaves it unscheduled")
    func invalidateIdle() async {
        let effects = RecordingCoordinatorEffects()
        effects.with { $0.holdsEntries = false }
        await Self.coordinator(effects).invalidate(Self.key)
        #expect(effects.takeSteps() == ["queueRemoval", "dropForInvalidation(tracked: false)", "unschedule", "reportInvalidated"])
    }

    @Test("invalidating an idle key memory still holds gives it a turn, in which the idle rule evicts it")
    func invalidateIdleHeld() async {
        let effects = RecordingCoordinatorEffects()
        await Self.coordinator(effects).invalidate(Self.key)
        #expect(effects.takeSteps() == [
            "queueRemoval", "dropForInvalidation(tracked: false)", "unschedule", "reportInvalidated", "scheduleNextRefresh",
        ])
    }

    @Test("retrying failed keys now schedules each key whose backoff ended and counts them")
    func retryNow() async throws {
        let effects = RecordingCoordinatorEffects()
        let other = try TokenKey.vehicle("truck-10")
        effects.with { $0.backingOff = [Self.key, other] }
        #expect(await Self.coordinator(effects).retryFailedNow() == 2)
        #expect(effects.takeSteps() == ["endBackoffs", "scheduleNow(2)"])
    }

    @Test("a caller's miss runs one flight through the same effects; its end is reported to the key state")
    func callerMiss() async {
        let fresh = StoredToken(key: Self.key, value: "fresh", expiresAt: Self.t0 + 3600, issuedAt: Self.t0, fetchedAt: Self.t0)
        let effects = RecordingCoordinatorEffects()
        effects.with { $0.fetch = .fetched(fresh) }
        guard case .token(let served) = await Self.coordinator(effects).obtain(Self.key) else {
            Issue.record("no token"); return
        }
        #expect(served == fresh)
        #expect(effects.takeSteps() == [
            "acquireFetchSlot", "takeLease", "fetch", "releaseFetchSlot", "accept(fresh)", "flightEnded",
        ])
    }

    @Test("a run stopped while it re-reads what memory holds reads no further and reports no failure for it")
    func stoppedDuringReread() async throws {
        // 1,000 held keys: ten reads of 100. The first read stops the run, as a SIGTERM at
        // start-up does; the store then fails every read with the cancellation (as GRDB does).
        // Each later chunk used to be read anyway and reported as a store failure: an agent of
        // 100,000 subjects stopped early logged 990 "could not read another process's changes".
        let effects = RecordingCoordinatorEffects()
        let keys = try (0..<1_000).map { try TokenKey.vehicle("v-\($0)") }
        let running = Mutex<Task<Void, Never>?>(nil)
        effects.with {
            $0.heldKeys = keys
            $0.onRead = { running.withLock { $0?.cancel() } }
        }
        let coordinator = Self.coordinator(effects)
        running.withLock { $0 = Task { await coordinator.runUntilCancelled() } }
        await running.withLock { $0! }.value
        let steps = effects.takeSteps()
        #expect(steps.filter { $0.hasPrefix("readStored") } == ["readStored(100)"])
        #expect(!steps.contains("reportChangesUnreadable"))
    }

    @Test("shutting down with nothing in flight: begin, drain the store's work, then report and end events")
    func shutDown() async {
        let effects = RecordingCoordinatorEffects()
        await Self.coordinator(effects).shutDown()
        #expect(effects.takeSteps() == ["beginShutdown", "drainForShutdown", "endShutdown(finished: true)"])
    }
}

/// A ``CoordinatorEffects`` with plain values. Memory holds an empty entry for every key (so a
/// miss reads no store); the lease is granted with nothing stored; `fetch` answers what the test
/// set; a key is kept fresh exactly when tracked. Each effect asked for is recorded.
final class RecordingCoordinatorEffects: CoordinatorEffects {
    struct State {
        var steps: [String] = []
        var fetch: FetchResult = .interrupted
        var backingOff: [TokenKey] = []
        var shuttingDown = false
        /// What memory holds, for the change follower's re-read.
        var heldKeys: [TokenKey] = []
        /// Whether memory holds an (empty) entry for every key; false: for none.
        var holdsEntries = true
        /// Run on each read of the store, before it answers (cancelled: it fails).
        var onRead: (@Sendable () -> Void)?
    }

    let state = Mutex(State())
    let policy = RefreshPolicy()
    let events = EventBroadcaster<TokenSyncEvent>()
    var moment: RefreshMoment { RefreshMoment(corrected: RefreshCoordinatorEffectsTests.t0, local: RefreshCoordinatorEffectsTests.t0) }

    func with(_ change: (inout State) -> Void) { state.withLock { change(&$0) } }
    func takeSteps() -> [String] {
        state.withLock { state in
            defer { state.steps = [] }
            return state.steps
        }
    }
    private func record(_ step: String) { state.withLock { $0.steps.append(step) } }

    // MARK: RefreshEffects (a flight's)

    func jitter() -> Double { 0.5 }
    var isShuttingDown: Bool { state.withLock { $0.shuttingDown } }
    func held(_ key: TokenKey) -> MemoryEntry? {
        guard state.withLock({ $0.holdsEntries }) else { return nil }
        return MemoryEntry(token: nil, source: .store, softPoint: .distantPast, usableUntil: .distantPast,
                           failure: nil, lastError: nil, lastUsed: .distantPast, refreshRequested: false)
    }
    func flightReached(_ key: TokenKey, _ phase: RefreshDecision.State) {}
    func markUsed(_ key: TokenKey) { record("markUsed") }
    func load(_ keys: [TokenKey]) async { record("load(\(keys.count))") }
    func readStoredEntry(_ key: TokenKey) async -> TokenEntry? { record("readStoredEntry"); return nil }
    func adoptIfNewer(_ token: StoredToken, failure: RefreshFailureState?) -> Bool { record("adopt"); return false }
    func acquireFetchSlot(for key: TokenKey, unless served: () -> Bool) async -> Bool { record("acquireFetchSlot"); return !served() }
    func releaseFetchSlot() { record("releaseFetchSlot") }
    func takeLease(_ key: TokenKey) async -> CrossProcessLease.Answer { record("takeLease"); return .granted(current: nil) }
    func takeOverLease(_ key: TokenKey, from deadHolder: String) async -> CrossProcessLease.Answer {
        record("takeOverLease"); return .granted(current: nil)
    }
    func waitForHolder(of key: TokenKey, seconds: TimeInterval) async -> Bool { record("waitForHolder"); return false }
    func releaseLease(_ key: TokenKey) async { record("releaseLease") }
    func fetch(_ key: TokenKey, previous: StoredToken?) async -> FetchResult { record("fetch"); return state.withLock { $0.fetch } }
    func accept(_ token: StoredToken, for key: TokenKey, markUsed: Bool) -> StoredToken { record("accept(\(token.value))"); return token }
    func backOff(_ key: TokenKey, failure: RefreshFailureState, error: TokenProviderError) async { record("backOff") }
    func recordFailure(_ key: TokenKey, failure: RefreshFailureState, error: TokenProviderError) { record("recordFailure") }
    func scheduleNextRefresh(_ key: TokenKey) { record("scheduleNextRefresh") }

    // MARK: KeyStates

    var heldKeys: [TokenKey] { state.withLock { $0.heldKeys } }
    func flightPhase(of key: TokenKey) -> RefreshDecision.State? { nil }
    func flightEnded(_ key: TokenKey) { record("flightEnded") }
    func dropForInvalidation(_ key: TokenKey, tracked: Bool) { record("dropForInvalidation(tracked: \(tracked))") }
    func wantsProactiveRefresh(_ key: TokenKey, tracked: Bool) -> Bool { tracked }
    func endBackoffs() -> [TokenKey] { record("endBackoffs"); return state.withLock { $0.backingOff } }
    func evict(_ key: TokenKey) { record("evict") }
    func storeChanged(_ held: MemoryEntry, stored: TokenEntry?, commitPending: Bool) -> RefreshMachine.StoreChange { .none }
    func dropRemoved(_ key: TokenKey, failure: RefreshFailureState?, ifHolding token: StoredToken?) -> Bool {
        record("dropRemoved"); return true
    }

    // MARK: RefreshSchedule

    func scheduleNow(_ keys: [TokenKey]) { record("scheduleNow(\(keys.count))") }
    func unschedule(_ key: TokenKey) { record("unschedule") }
    func isScheduled(_ key: TokenKey) -> Bool { false }
    func dueAgainOnCommit(_ key: TokenKey) {}
    func forgetDueAgainOnCommit(_ key: TokenKey) -> Bool { true }
    var earliestDeadline: Date? { nil }
    func popDue(at now: Date, limit: Int) -> [TokenKey] { [] }
    func wakeScheduler() { record("wakeScheduler") }
    func takeWakeRequest() -> Bool { false }
    var isSchedulerParked: Bool { true }
    var schedulerNow: Duration { .zero }
    func sleepScheduler(seconds: TimeInterval, from start: Duration) async { try? await Task.sleep(for: .milliseconds(5)) }
    func setHeartbeat(every interval: Duration, _ beat: @escaping @Sendable () -> Void) {}
    func beatIfDue() -> Duration? { nil }
    func rescheduleAfterClockStep() {}
    var isCorrectingClock: Bool { false }

    // MARK: CommitQueue, StoreChangeFeed

    func queueRemoval(_ key: TokenKey) { record("queueRemoval") }
    func isCommitPending(_ key: TokenKey) -> Bool { false }
    var commitsIdle: Bool { true }
    func runCommits() async {}
    func runStoreWork() async {}
    func setFeedDriven(_ driven: Bool) {}
    func storeChanges() -> AsyncStream<TokenStoreChange> { AsyncStream { $0.finish() } }
    func readStored(_ keys: [TokenKey]) async throws(TokenStoreError) -> [TokenKey: TokenEntry] {
        record("readStored(\(keys.count))")
        state.withLock { $0.onRead }?()
        if Task.isCancelled { throw .sqlite(path: "test.sqlite", code: -1, message: "CancellationError") }
        return [:]
    }

    // MARK: EngineReporting, EngineLifecycle

    func reportInvalidated(_ key: TokenKey) { record("reportInvalidated") }
    func reportChangesUnreadable(_ error: TokenStoreError) { record("reportChangesUnreadable") }
    func reportRemovedExternally(_ key: TokenKey) { record("reportRemovedExternally") }
    func beginShutdown() { record("beginShutdown"); state.withLock { $0.shuttingDown = true } }
    func drainForShutdown() async { record("drainForShutdown") }
    func endShutdown(finished: Bool) { record("endShutdown(finished: \(finished))") }
}
