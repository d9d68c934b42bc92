// Sync layer: the engine's I/O for its flights: memory, the store, the fetch slots, the lease,
// the provider and validation, the group commit, the events, metrics and logs.
import CoreMetrics
import Foundation
import Logging

extension EngineParts: RefreshEffects {
    func jitter() -> Double { random() }

    var isShuttingDown: Bool { shutdown.isSet }

    func held(_ key: TokenKey) -> MemoryEntry? { memory.entry(key) }

    func flightReached(_ key: TokenKey, _ phase: RefreshDecision.State) {
        memory.setFlightPhase(key, phase)
    }

    func markUsed(_ key: TokenKey) {
        memory.markUsed(key, at: moment.corrected)
    }

    func readStoredEntry(_ key: TokenKey) async -> TokenEntry? {
        let stored = try? await repository.entry(for: key)
        return admitted(stored ?? nil)
    }

    func acquireFetchSlot(for key: TokenKey, unless served: () -> Bool) async -> Bool {
        await slots.acquire(for: key, unless: served)
    }

    func releaseFetchSlot() { slots.release() }

    func takeLease(_ key: TokenKey) async -> CrossProcessLease.Answer {
        admitted(await lease.take(key))
    }

    func takeOverLease(_ key: TokenKey, from deadHolder: String) async -> CrossProcessLease.Answer {
        admitted(await lease.takeOver(key, from: deadHolder))
    }

    /// `answer` with the entry read along as the engine may use it (see ``admitted(_:)``).
    private func admitted(_ answer: CrossProcessLease.Answer) -> CrossProcessLease.Answer {
        switch answer {
        case .granted(let current): .granted(current: admitted(current))
        case .busy(let holder, let dead, let until, let current):
            .busy(holder: holder, holderIsDead: dead, until: until, current: admitted(current))
        case .unavailable: .unavailable
        }
    }

    func waitForHolder(of key: TokenKey, seconds: TimeInterval) async -> Bool {
        await lease.waitForChange(of: key, seconds: seconds)
    }

    func releaseLease(_ key: TokenKey) async { await lease.release(key) }

    /// Fetches (renewing the lease when held) and validates the answer: fetcher, then
    /// validation, then the engine; nothing flows back.
    func fetch(_ key: TokenKey, previous: StoredToken?) async -> FetchResult {
        let fetcher = self.fetcher
        let started = ContinuousClock.now
        // Before the request: a failure is bound to the configuration that made it.
        let digest = fetcher.configurationDigest
        let result: Result<FetchedToken, TokenProviderError> = await lease.renewing(key) {
            do throws(TokenProviderError) { return .success(try await fetcher.fetchToken(for: key)) } catch { return .failure(error) }
        }
        metrics.fetchLatency.recordNanoseconds(Int64((ContinuousClock.now - started) / .nanoseconds(1)))
        if shutdown.isSet || Task.isCancelled { return .interrupted }
        switch result {
        case .failure(let error):
            return .failed(error, configurationDigest: digest)
        case .success(let fetched):
            let answer = ProviderAnswer(fetched)
            // A wall-clock step this answer saw first must still reach the scheduler's deadlines.
            if skew.learn(providerDate: fetched.providerDate, issuedAt: fetched.providerDate == nil ? answer.issuedAt : nil) {
                scheduler.wake()
            }
            do throws(TokenValidationError) {
                let moment = self.moment
                var token = try validator.validate(answer, for: key, now: moment.corrected, previous: previous)
                // Received by our own clock: after a restart, `iat` minus this shows how far ahead
                // the provider's clock at least was (ProviderClockOffset.learnFromStored). A token
                // without `iat` keeps the provider's time: its lifetime is measured from it.
                if token.issuedAt != nil { token.fetchedAt = moment.local }
                return .fetched(token)
            } catch {
                return .failed(.invalidToken(error), configurationDigest: digest)
            }
        }
    }

    func accept(_ fetched: StoredToken, for key: TokenKey, markUsed: Bool) -> StoredToken {
        let corrected = moment.corrected
        var token = fetched
        token.lastUsedAt = markUsed ? corrected : memory.entry(key)?.lastUsed.nonDistant
        // Counted first, so that whoever sees the token (served, or by its event) sees it counted.
        metrics.refreshes.increment()
        lease.handOver(key)
        // Drawn before: the injected jitter source is not called under the committer's lock.
        let jitter = memory.random()
        // Queued for the commit and installed in one step of the committer's lock: whoever sees
        // the new token in memory also sees its commit pending (the change follower must not
        // drop it as removed), and its `.refreshed` event, sent once it is written, comes after
        // memory holds it (a sink woken by it must find it).
        committer.enqueue(token) {
            memory.install(token, source: .provider, lastUsed: markUsed ? corrected : nil, jitter: jitter)
        }
        // Debug, not info: thousands of keys refresh every hour; events() reports them.
        logger.debug("token refreshed", metadata: [
            "key": .string(key.description), "fingerprint": .string(token.fingerprint.description),
            "expires_at": .string(token.expiresAt.formatted(.iso8601)),
        ])
        scheduleNextRefresh(key)
        return token
    }

    func backOff(_ key: TokenKey, failure: RefreshFailureState, error: TokenProviderError) async {
        memory.recordFailure(key, failure: failure, error: error)
        metrics.failure(kind: error.kind)
        logger.warning("token refresh failed; backing off", metadata: [
            "key": .string(key.description), "error": .string(error.description),
            "failures": .stringConvertible(failure.consecutiveFailures),
            "next_attempt_at": .string(failure.nextAttemptAt.formatted(.iso8601)),
        ])
        if let entry = memory.entry(key), let token = machine.usableToken(of: entry, at: moment.corrected) {
            logger.notice("serving the current token while the provider fails (offline mode)", metadata: [
                "key": .string(key.description), "fingerprint": .string(token.fingerprint.description),
                "usable_until": .string(entry.usableUntil.formatted(.iso8601)),
            ])
        }
        do {
            try await repository.recordFailure(failure, for: key)
            health.writeSucceeded()
        } catch {
            health.writeFailed(error)
        }
        // Stored first: a process waiting on the lease then finds the failure and shares it.
        await lease.release(key)
        events.emit(.refreshFailed(key: key, error: error, consecutiveFailures: failure.consecutiveFailures,
                                   nextAttemptAt: failure.nextAttemptAt))
        scheduleNextRefresh(key)
    }

    func recordFailure(_ key: TokenKey, failure: RefreshFailureState, error: TokenProviderError) {
        memory.recordFailure(key, failure: failure, error: error)
    }
}

private extension Date {
    /// nil for `distantPast` (the "never" marker in memory entries).
    var nonDistant: Date? { self == .distantPast ? nil : self }
}
