// Sync layer: the engine's shutdown work, out of reach of the cancellation that asked for it and
// bounded in time.
import Logging
import Synchronization

/// Runs the engine's shutdown work (joining flights, writing pending tokens, releasing leases)
/// where the cancellation of the task stopping the engine cannot reach it, for at most
/// ``bound``.
///
/// Why: leaving the scope that runs the engine cancels `run()`, and in a cancelled task every
/// store call that waits fails at once (GRDB's queued writes, every PostgreSQL call): the
/// fetched tokens would be dropped and the leases left for other processes to wait out. Why
/// bounded: a store that stays locked or unreachable must not keep the process from stopping;
/// the work is then cancelled and left to end by itself, and what it did not do is logged.
enum ShieldedShutdown {
    /// How long stopping the engine waits for its flights, store writes and lease releases.
    static let bound: Duration = .seconds(5)

    /// Runs `work` in a task that does not inherit the caller's cancellation, and waits for it
    /// at most `limit`: true when it finished in time. Otherwise the work is cancelled and not
    /// waited for.
    static func run(within limit: Duration = bound, _ work: @escaping @Sendable () async -> Void) async -> Bool {
        await withCheckedContinuation { (continuation: CheckedContinuation<Bool, Never>) in
            let answer = FirstAnswer(continuation)
            // Unstructured tasks: neither is cancelled with the caller.
            let worker = Task { await work() }
            let timer = Task {
                guard (try? await Task.sleep(for: limit)) != nil, answer.give(false) else { return }
                worker.cancel()
            }
            Task {
                await worker.value
                if answer.give(true) { timer.cancel() }
            }
        }
    }

    /// Logs what the shutdown left undone: tokens not written (memory held them; the next
    /// start reads the store or fetches), and leases not released (other processes wait for
    /// them to expire).
    static func report(finished: Bool, unwritten: [TokenKey], unreleased: [TokenKey], leaseDuration: Double, logger: Logger) {
        if !finished {
            logger.warning("stopping the engine gave up waiting for the store after \(bound)", metadata: [
                "unwritten": .stringConvertible(unwritten.count), "unreleased_leases": .stringConvertible(unreleased.count),
            ])
        }
        if !unwritten.isEmpty {
            logger.warning("fetched tokens or invalidations were not written to the store before stopping; a token not written is fetched again when next needed", metadata: [
                "count": .stringConvertible(unwritten.count), "keys": .string(listed(unwritten)),
            ])
        }
        if !unreleased.isEmpty {
            logger.warning("refresh leases were not released before stopping; other processes wait for them to expire", metadata: [
                "count": .stringConvertible(unreleased.count), "keys": .string(listed(unreleased)),
                "expires_within_seconds": .stringConvertible(leaseDuration),
            ])
        }
    }

    /// The first few keys, and how many more: a log line stays short whatever the fleet's size.
    private static func listed(_ keys: [TokenKey]) -> String {
        let shown = keys.prefix(20).map(\.description).joined(separator: ", ")
        return keys.count > 20 ? shown + " and \(keys.count - 20) more" : shown
    }
}

/// Resumes a continuation with the first answer given; later answers are ignored.
private final class FirstAnswer: Sendable {
    private let continuation: Mutex<CheckedContinuation<Bool, Never>?>

    init(_ continuation: CheckedContinuation<Bool, Never>) {
        self.continuation = Mutex(continuation)
    }

    /// True when this was the first answer.
    func give(_ value: Bool) -> Bool {
        guard let continuation = continuation.withLock({ stored in defer { stored = nil }; return stored }) else { return false }
        continuation.resume(returning: value)
        return true
    }
}
