// Sync layer: one key's flight, doing the I/O that its RefreshDecision asks for: the fetch
// slot, the lease, the provider, validation, memory, the store and the events.
import CoreMetrics
import Foundation
import Logging

/// Drives a ``RefreshDecision`` to its end: reports each event with memory's entry as it is
/// then, performs each action, and releases the slot and lease the decision lets go of.
struct RefreshFlight {
    /// How a flight ended.
    enum Outcome: Sendable {
        case token(StoredToken)
        case failed(TokenUnavailable.Reason, nextAttemptAt: Date?)
    }

    let key: TokenKey
    let parts: EngineParts
    /// A caller was served a token past its soft point: once this flight has ended, a
    /// background flight of the key must start (the owner starts it; this one still runs).
    private(set) var wantsBackgroundRefresh = false
    private var decision: RefreshDecision
    /// Whether this flight holds a fetch slot now (the decision says when to give it back).
    private var holdsSlot = false

    init(key: TokenKey, request: RefreshDecision.Request, parts: EngineParts) {
        self.key = key
        self.parts = parts
        decision = RefreshDecision(request: request, policy: parts.policy)
    }

    private var held: MemoryEntry? { parts.memory.entry(key) }

    mutating func run() async -> Outcome {
        if parts.shutdown.isSet { return .failed(.shuttingDown, nextAttemptAt: nil) }
        if held == nil { await parts.load([key]) }
        var action = decision.start(held: held, at: parts.moment)
        while true {
            parts.phases.set(key, decision.state)
            settleSlot()
            if parts.shutdown.isSet || Task.isCancelled, !Self.isTerminal(action) {
                action = decision.shutdown()
            }
            switch action {
            case .serve(let token, let markUsed):
                if markUsed { parts.memory.markUsed(key, at: parts.moment.corrected) }
                parts.scheduleNextRefresh(key)
                return await end(.token(token))
            case .serveAndRefreshInBackground(let token):
                parts.memory.markUsed(key, at: parts.moment.corrected)
                // Not left to the scheduler, which runs only inside run().
                wantsBackgroundRefresh = true
                return await end(.token(token))
            case .fail(let reason, let next):
                if reason.code == .provider { parts.scheduleNextRefresh(key) }
                return await end(.failed(reason, nextAttemptAt: next))
            case .acquireFetchSlot:
                let (flight, parts, key) = (decision, parts, key)
                if await parts.slots.acquire(for: key, unless: { flight.isServed(by: parts.memory.entry(key), at: parts.moment) }) {
                    holdsSlot = true
                    action = decision.slotGranted(held: held, at: parts.moment)
                } else {
                    action = decision.slotWaitEnded(held: held, at: parts.moment)
                }
            case .takeLease:
                action = report(await parts.lease.take(key))
            case .takeOverLease(let deadHolder):
                action = report(await parts.lease.takeOver(key, from: deadHolder))
            case .adopt(let token, let failure):
                parts.adoptIfNewer(token, failure: failure)
                action = decision.adopted(held: held, at: parts.moment)
            case .failedElsewhere(let failure):
                let error = RefreshDecision.persistedError(failure)
                parts.memory.recordFailure(key, failure: failure, error: error)
                parts.scheduleNextRefresh(key)
                return await end(.failed(.provider(error), nextAttemptAt: failure.nextAttemptAt))
            case .waitForHolder(let seconds):
                let mentioned = await parts.lease.waitForChange(of: key, seconds: seconds)
                action = decision.holderWaitEnded(feedMentionedKey: mentioned, held: held, at: parts.moment)
            case .readStoredEntry:
                let stored = try? await parts.repository.entry(for: key)
                action = decision.storedEntryRead(parts.admitted(stored ?? nil), held: held, at: parts.moment)
            case .fetch(let previous):
                action = await fetch(previous: previous)
            case .accept(let token, let markUsed):
                return accept(token, markUsed: markUsed)
            case .backOff(let failure, let error):
                await backOff(failure, error)
                return await end(.failed(.provider(error), nextAttemptAt: failure.nextAttemptAt))
            }
        }
    }

    private mutating func report(_ answer: CrossProcessLease.Answer) -> RefreshDecision.Action {
        switch answer {
        case .granted(let current):
            decision.leaseGranted(current: parts.admitted(current), held: held, at: parts.moment)
        case .busy(let holder, let dead, let until, let current):
            decision.leaseBusy(holder: holder, holderIsDead: dead, until: until,
                               current: parts.admitted(current), held: held, at: parts.moment)
        case .unavailable:
            decision.leaseUnavailable(held: held)
        }
    }

    /// Fetches (renewing the lease when held), gives the slot back, and validates the answer:
    /// fetcher, then validation, then the engine; nothing flows back.
    private mutating func fetch(previous: StoredToken?) async -> RefreshDecision.Action {
        let fetcher = parts.fetcher
        let key = self.key
        let started = ContinuousClock.now
        // Before the request: a failure is bound to the configuration that made it.
        let digest = fetcher.configurationDigest
        let result: Result<FetchedToken, TokenProviderError> = await parts.lease.renewing(key) {
            do throws(TokenProviderError) { return .success(try await fetcher.fetchToken(for: key)) } catch { return .failure(error) }
        }
        parts.metrics.fetchLatency.recordNanoseconds(Int64((ContinuousClock.now - started) / .nanoseconds(1)))
        if parts.shutdown.isSet || Task.isCancelled { return decision.shutdown() }
        switch result {
        case .failure(let error):
            return decision.fetchFailed(error, held: held, at: parts.moment, random: parts.random(), configurationDigest: digest)
        case .success(let fetched):
            let answer = ProviderAnswer(fetched)
            // A wall-clock step this answer saw first must still reach the scheduler's deadlines.
            if parts.skew.learn(providerDate: fetched.providerDate, issuedAt: fetched.providerDate == nil ? answer.issuedAt : nil) {
                parts.scheduler.wake()
            }
            do throws(TokenValidationError) {
                let moment = parts.moment
                var token = try parts.validator.validate(answer, for: key, now: moment.corrected, previous: previous)
                // Received by our own clock: after a restart, `iat` minus this shows how far ahead
                // the provider's clock at least was (ProviderClockOffset.learnFromStored). A token
                // without `iat` keeps the provider's time: its lifetime is measured from it.
                if token.issuedAt != nil { token.fetchedAt = moment.local }
                return decision.fetchSucceeded(token)
            } catch {
                return decision.fetchFailed(.invalidToken(error), held: held, at: parts.moment, random: parts.random(),
                                            configurationDigest: digest)
            }
        }
    }

    private func accept(_ fetched: StoredToken, markUsed: Bool) -> Outcome {
        let corrected = parts.moment.corrected
        var token = fetched
        token.lastUsedAt = markUsed ? corrected : held?.lastUsed.nonDistant
        // Queued for the commit before memory holds it: whoever sees the new token in memory
        // also sees its commit pending (the change follower must not drop it as removed).
        parts.lease.handOver(key)
        parts.committer.enqueue(token)
        parts.memory.install(token, source: .provider, lastUsed: markUsed ? corrected : nil)
        parts.metrics.refreshes.increment()
        // Debug, not info: thousands of keys refresh every hour; events() reports them.
        parts.logger.debug("token refreshed", metadata: [
            "key": .string(key.description), "fingerprint": .string(token.fingerprint.description),
            "expires_at": .string(token.expiresAt.formatted(.iso8601)),
        ])
        parts.scheduleNextRefresh(key)
        return .token(token)
    }

    private func backOff(_ failure: RefreshFailureState, _ error: TokenProviderError) async {
        parts.memory.recordFailure(key, failure: failure, error: error)
        parts.metrics.failure(kind: error.kind)
        parts.logger.warning("token refresh failed; backing off", metadata: [
            "key": .string(key.description), "error": .string(error.description),
            "failures": .stringConvertible(failure.consecutiveFailures),
            "next_attempt_at": .string(failure.nextAttemptAt.formatted(.iso8601)),
        ])
        if let entry = held, let token = parts.machine.usableToken(of: entry, at: parts.moment.corrected) {
            parts.logger.notice("serving the current token while the provider fails (offline mode)", metadata: [
                "key": .string(key.description), "fingerprint": .string(token.fingerprint.description),
                "usable_until": .string(entry.usableUntil.formatted(.iso8601)),
            ])
        }
        do {
            try await parts.repository.recordFailure(failure, for: key)
            parts.health.writeSucceeded()
        } catch {
            parts.health.writeFailed(error)
        }
        // Stored first: a process waiting on the lease then finds the failure and shares it.
        await parts.lease.release(key)
        parts.events.emit(.refreshFailed(key: key, error: error, consecutiveFailures: failure.consecutiveFailures,
                                         nextAttemptAt: failure.nextAttemptAt))
        parts.scheduleNextRefresh(key)
    }

    /// Gives the fetch slot back once the decision no longer holds it.
    private mutating func settleSlot() {
        if holdsSlot && !decision.holdsSlot {
            parts.slots.release()
            holdsSlot = false
        }
    }

    /// Releases what the flight still holds (after the final action's own I/O).
    private mutating func end(_ outcome: Outcome) async -> Outcome {
        if holdsSlot {
            parts.slots.release()
            holdsSlot = false
        }
        if decision.holdsLease { await parts.lease.release(key) }
        return outcome
    }

    private static func isTerminal(_ action: RefreshDecision.Action) -> Bool {
        switch action {
        case .serve, .serveAndRefreshInBackground, .fail, .failedElsewhere, .accept, .backOff: true
        default: false
        }
    }
}

private extension Date {
    /// nil for `distantPast` (the "never" marker in memory entries).
    var nonDistant: Date? { self == .distantPast ? nil : self }
}
