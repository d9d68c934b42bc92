// Sync layer: one key's flight, doing the steps that its RefreshDecision asks for through its
// RefreshEffects: the fetch slot, the lease, the provider, memory, the store and the reporting.
import Foundation

/// Drives a ``RefreshDecision`` to its end: reports each event with memory's entry as it is
/// then, performs each action through `Effects`, and releases the slot and lease the decision
/// lets go of. Everything it may do is a requirement of ``RefreshEffects``.
struct RefreshFlight<Effects: RefreshEffects> {
    let key: TokenKey
    let effects: Effects
    /// A caller was served a token past its soft point: once this flight has ended, a
    /// background flight of the key must start (the owner starts it; this one still runs).
    private(set) var wantsBackgroundRefresh = false
    private var decision: RefreshDecision
    /// Whether this flight holds a fetch slot now (the decision says when to give it back).
    private var holdsSlot = false

    init(key: TokenKey, request: RefreshDecision.Request, effects: Effects) {
        self.key = key
        self.effects = effects
        decision = RefreshDecision(request: request, policy: effects.policy)
    }

    private var held: MemoryEntry? { effects.held(key) }

    mutating func run() async -> RefreshOutcome {
        if effects.isShuttingDown { return .failed(.shuttingDown, nextAttemptAt: nil) }
        if held == nil { await effects.load([key]) }
        var action = decision.start(held: held, at: effects.moment)
        while true {
            effects.flightReached(key, decision.state)
            settleSlot()
            if effects.isShuttingDown || Task.isCancelled, !Self.isTerminal(action) {
                action = decision.shutdown()
            }
            switch action {
            case .serve(let token, let markUsed):
                if markUsed { effects.markUsed(key) }
                effects.scheduleNextRefresh(key)
                return await end(.token(token))
            case .serveAndRefreshInBackground(let token):
                effects.markUsed(key)
                // Not left to the scheduler, which runs only inside run().
                wantsBackgroundRefresh = true
                return await end(.token(token))
            case .fail(let reason, let next):
                if reason.code == .provider { effects.scheduleNextRefresh(key) }
                return await end(.failed(reason, nextAttemptAt: next))
            case .acquireFetchSlot:
                let (flight, effects, key) = (decision, effects, key)
                if await effects.acquireFetchSlot(for: key, unless: { flight.isServed(by: effects.held(key), at: effects.moment) }) {
                    holdsSlot = true
                    action = decision.slotGranted(held: held, at: effects.moment)
                } else {
                    action = decision.slotWaitEnded(held: held, at: effects.moment)
                }
            case .takeLease:
                action = report(await effects.takeLease(key))
            case .takeOverLease(let deadHolder):
                action = report(await effects.takeOverLease(key, from: deadHolder))
            case .adopt(let token, let failure):
                effects.adoptIfNewer(token, failure: failure)
                action = decision.adopted(held: held, at: effects.moment)
            case .failedElsewhere(let failure):
                let error = RefreshDecision.persistedError(failure)
                effects.recordFailure(key, failure: failure, error: error)
                effects.scheduleNextRefresh(key)
                return await end(.failed(.provider(error), nextAttemptAt: failure.nextAttemptAt))
            case .waitForHolder(let seconds):
                let mentioned = await effects.waitForHolder(of: key, seconds: seconds)
                action = decision.holderWaitEnded(feedMentionedKey: mentioned, held: held, at: effects.moment)
            case .readStoredEntry:
                let stored = await effects.readStoredEntry(key)
                action = decision.storedEntryRead(stored, held: held, at: effects.moment)
            case .fetch(let previous):
                action = await fetch(previous: previous)
            case .accept(let token, let markUsed):
                return .token(effects.accept(token, for: key, markUsed: markUsed))
            case .backOff(let failure, let error):
                await effects.backOff(key, failure: failure, error: error)
                return await end(.failed(.provider(error), nextAttemptAt: failure.nextAttemptAt))
            }
        }
    }

    private mutating func report(_ answer: CrossProcessLease.Answer) -> RefreshDecision.Action {
        switch answer {
        case .granted(let current):
            decision.leaseGranted(current: current, held: held, at: effects.moment)
        case .busy(let holder, let dead, let until, let current):
            decision.leaseBusy(holder: holder, holderIsDead: dead, until: until, current: current, held: held, at: effects.moment)
        case .unavailable:
            decision.leaseUnavailable(held: held)
        }
    }

    /// Fetches through the effects and reports what the fetch came to.
    private mutating func fetch(previous: StoredToken?) async -> RefreshDecision.Action {
        switch await effects.fetch(key, previous: previous) {
        case .interrupted:
            return decision.shutdown()
        case .fetched(let token):
            return decision.fetchSucceeded(token)
        case .failed(let error, let digest):
            return decision.fetchFailed(error, held: held, at: effects.moment, random: effects.jitter(), configurationDigest: digest)
        }
    }

    /// Gives the fetch slot back once the decision no longer holds it.
    private mutating func settleSlot() {
        if holdsSlot && !decision.holdsSlot {
            effects.releaseFetchSlot()
            holdsSlot = false
        }
    }

    /// Releases what the flight still holds (after the final action's own I/O).
    private mutating func end(_ outcome: RefreshOutcome) async -> RefreshOutcome {
        if holdsSlot {
            effects.releaseFetchSlot()
            holdsSlot = false
        }
        if decision.holdsLease { await effects.releaseLease(key) }
        return outcome
    }

    private static func isTerminal(_ action: RefreshDecision.Action) -> Bool {
        switch action {
        case .serve, .serveAndRefreshInBackground, .fail, .failedElsewhere, .accept, .backOff: true
        default: false
        }
    }
}

/// How a flight ended.
enum RefreshOutcome: Sendable {
    case token(StoredToken)
    case failed(TokenUnavailable.Reason, nextAttemptAt: Date?)
}
