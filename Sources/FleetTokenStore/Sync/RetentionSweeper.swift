// Sync layer: keeps the store from growing without bound by deleting, in small batches, the
// rows of subjects nobody uses any more once the retention period has passed.
import Foundation
import Logging

/// Deletes, shortly after start and then every ``sweepInterval`` (or
/// ``RefreshPolicy/retention`` when shorter), the rows of keys nobody here tracks or holds that
/// have been dead for the retention period, ``batch`` rows per transaction so readers and
/// writers never wait long. Runs as a child task of the engine's `run()`.
struct RetentionSweeper: Sendable {
    /// Rows deleted per transaction.
    static let batch = 500
    /// Time between sweeps (or the retention itself, when shorter).
    static let sweepInterval: TimeInterval = 3600
    /// The first sweep runs this soon after start, off start-up's own work: agents restart.
    static let firstSweepDelay: TimeInterval = 5
    /// Sweeps scan the table: never more often than this, however short the retention.
    static let minimumSweepInterval: TimeInterval = 60

    let repository: any TokenRepository
    let retention: TimeInterval
    let clock: any Clock<Duration>
    let now: @Sendable () -> Date
    let logger: Logger
    let shutdown: ShutdownFlag

    /// Sweeps until cancelled. `unused` narrows candidate keys to those nobody here uses.
    func run(unused: @escaping @Sendable ([TokenKey]) async -> [TokenKey]) async {
        guard retention > 0 else { return }
        var delay = min(Self.firstSweepDelay, retention)
        while !Task.isCancelled && !shutdown.isSet {
            do { try await clock.sleep(for: .milliseconds(Int64(delay * 1000))) } catch { return }
            await sweep(unused: unused)
            delay = max(Self.minimumSweepInterval, min(Self.sweepInterval, retention))
        }
    }

    /// One sweep over the whole table, in batches.
    func sweep(unused: @Sendable ([TokenKey]) async -> [TokenKey]) async {
        let cutoff = now().addingTimeInterval(-retention)
        var after: TokenKey?
        var deleted = 0
        do {
            while !Task.isCancelled && !shutdown.isSet {
                let candidates = try await repository.retiredKeys(before: cutoff, after: after, limit: Self.batch)
                after = candidates.last
                let deletable = await unused(candidates)
                if !deletable.isEmpty { deleted += try await repository.deleteRetired(deletable, before: cutoff) }
                if candidates.count < Self.batch { break }
                await Task.yield()
            }
        } catch {
            logger.warning("could not delete the rows of finished subjects; will retry", metadata: ["error": .string(error.description)])
        }
        if deleted > 0 {
            logger.info("deleted the rows of subjects unused past the retention period", metadata: [
                "rows": .stringConvertible(deleted), "retention_seconds": .stringConvertible(Int(retention)),
            ])
        }
    }
}
