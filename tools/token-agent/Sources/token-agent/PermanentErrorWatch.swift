// `--exit-on-permanent-error`: when the provider answers 401 or 403 to every configured subject
// for N attempts in a row, retrying will not help (wrong credentials, a revoked client
// certificate), so the agent exits with its own code for systemd's restart limit and the
// operator's alerting, instead of backing off forever.

import FleetTokenStore
import Logging
import ServiceLifecycle

/// Consecutive refusals per subject, from the engine's events. Plain state, no I/O.
struct ProviderRefusals: Equatable {
    /// Refusals in a row that count as permanent.
    let attempts: Int
    private(set) var consecutive: [TokenKey: Int] = [:]

    init(attempts: Int) { self.attempts = attempts }

    /// A 401 or 403 of a subject `isConfigured` lets through counts; any other outcome of a
    /// refresh starts the count again. Only subjects being refused are kept: a count of 0 was
    /// kept for every subject ever refreshed, and a count for every id callers asked for that
    /// the provider refused, for as long as the agent ran.
    mutating func record(_ event: TokenSyncEvent, isConfigured: (TokenKey) -> Bool = { _ in true }) {
        switch event {
        case .refreshFailed(let key, let error, _, _):
            if error.code == .httpStatus, let status = error.statusCode, status == 401 || status == 403 {
                guard isConfigured(key) else {
                    consecutive.removeValue(forKey: key)
                    return
                }
                consecutive[key, default: 0] += 1
            } else {
                consecutive.removeValue(forKey: key)
            }
        case .refreshed(let key, _, _, _):
            consecutive.removeValue(forKey: key)
        case .removedExternally, .storeDegraded, .storeRecovered:
            break
        }
    }

    /// Forgets every subject `isConfigured` no longer lets through (a reload removed it): one
    /// refused when it was removed got no later event to clear its count.
    mutating func forgetUnconfigured(_ isConfigured: (TokenKey) -> Bool) {
        consecutive = consecutive.filter { isConfigured($0.key) }
    }

    /// True when every one of `subjects` (at least one) has been refused ``attempts`` times in a row.
    func allRefused(_ subjects: [TokenKey]) -> Bool {
        !subjects.isEmpty && subjects.allSatisfy { consecutive[$0, default: 0] >= attempts }
    }
}

/// The agent gave up: the provider keeps refusing every subject. Exit code ``exitCode``.
struct ProviderRefusesEverySubject: Error, CustomStringConvertible {
    /// EX_CONFIG from sysexits.h: a configuration error. The shipped unit does not restart on it.
    static let exitCode: Int32 = 78
    let subjects: Int
    let attempts: Int

    var description: String {
        "the token provider refused every subject (\(subjects)) with 401/403 \(attempts) times in a row: "
            + "check the credentials (--header, --header-file, --client-cert); exiting (--exit-on-permanent-error)"
    }
}

/// Follows the engine's events and fails (ending the service group) when ``ProviderRefusals`` says so.
struct PermanentErrorWatch: Service {
    let engine: TokenSyncEngine
    let subjects: ConfiguredSubjects
    let attempts: Int
    let logger: Logger

    func run() async throws {
        var refusals = ProviderRefusals(attempts: attempts)
        var generation = engine.tracked.generation
        for await event in engine.events().cancelOnGracefulShutdown() {
            // Configured subjects are the tracked ones; ids callers ask for are not counted.
            let tracked = engine.tracked
            if tracked.generation != generation {
                generation = tracked.generation
                refusals.forgetUnconfigured(tracked.keys.contains)
            }
            refusals.record(event, isConfigured: tracked.keys.contains)
            let current = subjects.current
            if refusals.allRefused(current) {
                let error = ProviderRefusesEverySubject(subjects: current.count, attempts: attempts)
                logger.critical("\(error.description)")
                throw error
            }
        }
    }
}

extension PermanentErrorWatch: CustomStringConvertible {
    /// ServiceLifecycle's log lines name services by their description.
    var description: String { "PermanentErrorWatch(attempts: \(attempts))" }
}
