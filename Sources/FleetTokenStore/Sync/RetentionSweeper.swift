// Sync layer: keeps the store from growing without bound by deleting, in small batches, the
// rows of subjects nobody uses any more once the retention period has passed: about when the
// earliest of them becomes eligible, not on a fixed period.
import Foundation
import Logging

/// When the retention sweep runs next, from plain values: when the earliest row becomes
/// eligible (it died, and the retention period passed since), but never within
/// ``minimumInterval`` of the last sweep (a sweep scans the table) and never more than
/// ``maximumInterval`` after it (rows kept back because they were in use are looked at again).
struct RetentionSchedule: Sendable, Equatable {
    /// Sweeps scan the table: never closer than this, however short the retention.
    static let minimumInterval: TimeInterval = 60
    /// The longest time between sweeps.
    static let maximumInterval: TimeInterval = 3600

    /// How long after their death rows are kept.
    let retention: TimeInterval

    /// When to sweep next. `earliestEligible`: when the earliest row not yet looked at becomes
    /// eligible (nil: none is known); `lastSweep`: when the last sweep ran (nil: none yet, and
    /// the longest interval counts from `started`, when the sweeper began); `now`: the time now.
    /// A time not after `now` means "sweep now".
    func nextSweep(earliestEligible: Date?, lastSweep: Date?, started: Date, now: Date) -> Date {
        let notBefore = lastSweep.map { $0.addingTimeInterval(Self.minimumInterval) } ?? now
        let notAfter = (lastSweep ?? started).addingTimeInterval(Self.maximumInterval)
        return max(notBefore, min(earliestEligible ?? notAfter, notAfter))
    }

    /// How often the store is asked again for its earliest row between sweeps. A row written
    /// after a look dies no earlier than it was written, so it becomes eligible at least
    /// ``retention`` later: looking that often (within the bounds) never finds one late.
    var recheckInterval: TimeInterval {
        min(max(retention, Self.minimumInterval), Self.maximumInterval)
    }
}

/// Deletes the rows of keys nobody here tracks or holds that have been dead for the retention
/// period, when the earliest becomes eligible (``RetentionSchedule``), ``batch`` rows per
/// transaction so readers and writers never wait long; with them, refresh leases that expired
/// as long ago (their holders died holding them). Runs as a child task of the engine's `run()`.
struct RetentionSweeper: Sendable {
    /// Rows deleted per transaction.
    static let batch = 500
    /// The store is first looked at this soon after start, off start-up's own work: agents restart.
    static let firstSweepDelay: TimeInterval = 5
    /// A row is deleted once it died more than the retention ago (the cutoff is strict): the
    /// sweep for it runs this long after the period ends, so that it finds the row eligible.
    static let eligibilityMargin: TimeInterval = 1

    let repository: any TokenRepository
    /// Where refresh leases are kept, when their expired rows are to be swept too.
    var leases: (any RefreshLeaseStore)? = nil
    let retention: TimeInterval
    let clock: any Clock<Duration>
    let now: @Sendable () -> Date
    let logger: Logger
    let shutdown: ShutdownFlag

    /// Sweeps until cancelled. `unused` narrows candidate keys to those nobody here uses.
    func run(unused: @escaping @Sendable ([TokenKey]) async -> [TokenKey]) async {
        guard retention > 0 else { return }
        let schedule = RetentionSchedule(retention: retention)
        let started = now()
        guard await sleep(seconds: min(Self.firstSweepDelay, retention)) else { return }
        var lastSweep: Date?
        // The cutoff of the last complete sweep: rows that died before it were looked at then
        // (those kept because in use wait for the longest interval, not every minute).
        var lookedAtBefore: Date?
        while !Task.isCancelled && !shutdown.isSet {
            let current = now()
            var earliestEligible: Date?
            do {
                earliestEligible = try await repository.earliestDeath(notBefore: lookedAtBefore)?
                    .addingTimeInterval(retention + Self.eligibilityMargin)
            } catch {
                logger.warning("could not ask the store when its rows expire; will retry", metadata: ["error": .string(error.description)])
            }
            let next = schedule.nextSweep(earliestEligible: earliestEligible, lastSweep: lastSweep, started: started, now: current)
            if next <= current {
                let cutoff = current.addingTimeInterval(-retention)
                if await sweep(unused: unused, before: cutoff) { lookedAtBefore = cutoff }
                lastSweep = current
                continue
            }
            guard await sleep(seconds: min(next.timeIntervalSince(current), schedule.recheckInterval)) else { return }
        }
    }

    /// One sweep over the whole table, in batches, of rows dead since before `cutoff`
    /// (now less the retention when not given), then of the leases expired before it. Returns
    /// false when the store failed on the rows (a failure on the leases is retried at the next
    /// sweep, and does not bring the rows kept for being in use back to every minute).
    @discardableResult
    func sweep(unused: @Sendable ([TokenKey]) async -> [TokenKey], before cutoff: Date? = nil) async -> Bool {
        let cutoff = cutoff ?? now().addingTimeInterval(-retention)
        var after: TokenKey?
        var deleted = 0
        var complete = true
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
            complete = false
            logger.warning("could not delete the rows of finished subjects; will retry", metadata: ["error": .string(error.description)])
        }
        if deleted > 0 {
            logger.info("deleted the rows of subjects unused past the retention period", metadata: [
                "rows": .stringConvertible(deleted), "retention_seconds": .stringConvertible(Int(retention)),
            ])
        }
        await sweepLeases(before: cutoff)
        return complete && !Task.isCancelled && !shutdown.isSet
    }

    /// Deletes the leases that expired before `cutoff`, in batches; a failure is logged.
    private func sweepLeases(before cutoff: Date) async {
        guard let leases else { return }
        var deleted = 0
        do {
            while !Task.isCancelled && !shutdown.isSet {
                let batch = try await leases.deleteExpiredRefreshLeases(before: cutoff, limit: Self.batch)
                deleted += batch
                if batch < Self.batch { break }
                await Task.yield()
            }
        } catch {
            logger.warning("could not delete expired refresh leases; will retry at the next sweep", metadata: ["error": .string(error.description)])
            return
        }
        if deleted > 0 {
            // Each was left by a process that ended while fetching (killed, or the power cut).
            logger.info("deleted refresh leases left by processes that ended while fetching", metadata: [
                "leases": .stringConvertible(deleted), "retention_seconds": .stringConvertible(Int(retention)),
            ])
        }
    }

    /// Sleeps on the engine's clock; false when cancelled.
    private func sleep(seconds: TimeInterval) async -> Bool {
        do { try await clock.sleep(for: .milliseconds(Int64(max(0, seconds) * 1000))) } catch { return false }
        return !Task.isCancelled && !shutdown.isSet
    }
}
