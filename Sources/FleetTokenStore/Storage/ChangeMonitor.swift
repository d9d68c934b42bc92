// Storage layer: the change feed: which tokens other connections changed.

import Foundation
import GRDB
import Logging
import Synchronization

/// Tells subscribers which tokens other connections changed.
///
/// GRDB cannot observe other processes, so one fixed read-only connection polls
/// `PRAGMA data_version` (a single cheap query, off the hot path); only when it moves does the
/// monitor read the `token_changes` log that the schema's triggers fill, so every writer, even a
/// stock `sqlite3` shell, is seen. Changes this process's own repository wrote are skipped: their
/// log sequence numbers are noted inside the writing transaction, before they can be read.
final class ChangeMonitor: Sendable {
    private struct State: Sendable {
        var ownRanges: [ClosedRange<Int64>] = []
        var pollTask: Task<Void, Never>?
        var closed = false
    }

    /// The watching connection and where it starts reading from.
    private struct Watcher: Sendable {
        let reader: DatabaseQueue
        let dataVersion: Int64
        let lastSequence: Int64
    }

    /// More changes than this in one poll are reported as ``TokenStoreChange/unknown``.
    static let maximumItemizedChanges = 5000

    private let state = Mutex(State())
    /// The subscribers; unbounded, as a reader that misses a change would serve a stale token.
    private let subscribers = EventBroadcaster<TokenStoreChange>(buffering: .unbounded)
    private let path: String
    private let interval: Duration
    private let busyTimeout: TimeInterval
    private let clock: any Clock<Duration>
    private let logger: Logger
    /// Polls done (whether or not they found changes): tests wait for the next one.
    private let polls = Mutex<Int>(0)

    init(path: String, interval: TimeInterval, busyTimeout: TimeInterval, clock: any Clock<Duration>, logger: Logger) {
        self.path = path
        self.interval = .milliseconds(Int64(max(interval, 0.01) * 1000))
        self.busyTimeout = busyTimeout
        self.clock = clock
        self.logger = logger
    }

    /// How many polls have completed since the monitor was made.
    var completedPolls: Int { polls.withLock { $0 } }

    /// A stream of changes; polling runs while at least one stream is alive. When this call
    /// starts the polling, it takes the starting point before returning, so every change
    /// committed after it returns is reported.
    func subscribe() -> AsyncStream<TokenStoreChange> {
        let stream = subscribers.subscribe()
        state.withLock { state in
            guard !state.closed, state.pollTask == nil else { return }
            // A read of two numbers, once per start of polling: under the lock, so no write's
            // own-change note falls between the starting point and the task.
            let watcher = openWatcher(logFailure: false)
            state.pollTask = Task { [weak self] in await self?.poll(from: watcher) }
        }
        return stream
    }

    /// Marks log rows written by this process's repository, so they are not echoed back.
    /// Nothing is noted while no stream polls (polling starts from the log's end); each poll
    /// drops the ranges it has passed, so the list stays short.
    func noteOwnChanges(_ range: ClosedRange<Int64>) {
        state.withLock { state in
            guard state.pollTask != nil else { return }
            state.ownRanges.append(range)
        }
    }

    /// Forgets a noted range whose transaction did not commit. Exactly that range: a later
    /// write may reuse its numbers (the rollback reset the sequence) and must stay noted.
    func forgetOwnChanges(_ range: ClosedRange<Int64>) {
        state.withLock { state in
            if let index = state.ownRanges.firstIndex(of: range) { state.ownRanges.remove(at: index) }
        }
    }

    /// Ends every stream and stops polling.
    func close() {
        let task = state.withLock { state in
            state.closed = true
            defer { state.pollTask = nil }
            return state.pollTask
        }
        task?.cancel()
        subscribers.finish()
    }

    /// True while someone listens; otherwise forgets the poll task in the same critical
    /// section, so the next subscriber starts a new one.
    private func keepPolling() -> Bool {
        state.withLock { state in
            if !subscribers.hasSubscribers || state.closed {
                state.pollTask = nil
                return false
            }
            return true
        }
    }

    /// Opens the read-only watching connection and reads the starting point; nil on failure.
    private func openWatcher(logFailure: Bool) -> Watcher? {
        var configuration = Configuration()
        configuration.readonly = true
        configuration.busyMode = .timeout(busyTimeout)
        configuration.label = "FleetTokenStore.changes"
        do {
            let queue = try DatabaseQueue(path: path, configuration: configuration)
            let (version, sequence) = try queue.read { db in
                (try Int64.fetchOne(db, sql: "PRAGMA data_version") ?? 0, try ChangeLog.lastSequence(db))
            }
            return Watcher(reader: queue, dataVersion: version, lastSequence: sequence)
        } catch {
            if logFailure {
                logger.error("cannot watch the token store for changes by other processes; retrying", metadata: [
                    "store": .string(path), "error": .string(TokenStoreError(error, path: path).description),
                ])
            }
            return nil
        }
    }

    private func poll(from start: Watcher?) async {
        var watcher = start
        // Open the watching connection; retried each second while someone listens.
        while watcher == nil {
            guard keepPolling() else { return }
            watcher = openWatcher(logFailure: true)
            if watcher == nil {
                do { try await Task.sleep(for: .seconds(1)) } catch { return }
            }
        }
        guard let watcher else { return }
        let reader = watcher.reader
        defer { try? reader.close() }
        var dataVersion = watcher.dataVersion
        var lastSeq = watcher.lastSequence

        while keepPolling() {
            do {
                try await clock.sleep(for: interval)
            } catch {
                state.withLock { $0.pollTask = nil }
                return // cancelled: the repository closed
            }
            do {
                let knownVersion = dataVersion
                let since = lastSeq
                let batch = try await reader.read { db -> ChangeLog.Batch? in
                    let version = try Int64.fetchOne(db, sql: "PRAGMA data_version") ?? 0
                    guard version != knownVersion else { return nil }
                    return try ChangeLog.read(db, after: since, dataVersion: version,
                                              limit: Self.maximumItemizedChanges)
                }
                if let batch {
                    dataVersion = batch.dataVersion
                    deliver(batch, after: lastSeq)
                    lastSeq = max(lastSeq, batch.lastSequence)
                }
            } catch {
                logger.warning("could not read the token store's change log; will retry", metadata: [
                    "store": .string(path), "error": .string(TokenStoreError(error, path: path).description),
                ])
            }
            polls.withLock { $0 += 1 }
        }
    }

    private func deliver(_ batch: ChangeLog.Batch, after lastSeq: Int64) {
        let changes = state.withLock { state -> [TokenStoreChange] in
            let own = state.ownRanges
            state.ownRanges.removeAll { $0.upperBound <= batch.lastSequence }
            if batch.truncated || (batch.firstRetained > lastSeq + 1 && batch.lastSequence > lastSeq) {
                // Too much happened, or the log was pruned past what we read: ask for a re-read.
                return [.unknown]
            }
            return batch.items.filter { item in !own.contains { $0.contains(item.seq) } }.map(\.change)
        }
        subscribers.emit(contentsOf: changes)
    }
}

/// Reading and pruning the `token_changes` table.
enum ChangeLog {
    struct Item: Sendable {
        let seq: Int64
        let change: TokenStoreChange
    }

    struct Batch: Sendable {
        let dataVersion: Int64
        let items: [Item]
        /// Highest sequence number assigned so far.
        let lastSequence: Int64
        /// Lowest sequence number still in the log (lastSequence + 1 when empty).
        let firstRetained: Int64
        /// More rows than the limit were waiting.
        let truncated: Bool
    }

    /// The highest sequence number ever assigned (AUTOINCREMENT keeps it past pruning).
    static func lastSequence(_ db: Database) throws -> Int64 {
        // Every write reads it twice: stepped through the C API (see DirectStep).
        try DirectStep.run(db, "SELECT seq FROM sqlite_sequence WHERE name = 'token_changes'") ?? 0
    }

    static func read(_ db: Database, after seq: Int64, dataVersion: Int64, limit: Int) throws -> Batch {
        let rows = try Row.fetchAll(db, sql: """
            SELECT seq, kind, subject_id, operation FROM token_changes
            WHERE seq > ? ORDER BY seq LIMIT ?
            """, arguments: [seq, limit + 1])
        let last = try lastSequence(db)
        let first = try Int64.fetchOne(db, sql: "SELECT min(seq) FROM token_changes") ?? (last + 1)
        var items: [Item] = []
        items.reserveCapacity(min(rows.count, limit))
        for row in rows.prefix(limit) {
            let kindText: String = row["kind"]
            let operation: String = row["operation"]
            guard let kind = TokenKind(rawValue: kindText) else { continue }
            let key = TokenKey(uncheckedKind: kind, subjectID: row["subject_id"])
            items.append(Item(seq: row["seq"], change: operation == "delete" ? .removed(key) : .upserted(key)))
        }
        return Batch(dataVersion: dataVersion, items: items, lastSequence: last,
                     firstRetained: first, truncated: rows.count > limit)
    }

    /// Deletes log rows older than `date`.
    static func prune(_ db: Database, olderThan date: Date) throws {
        try db.execute(sql: "DELETE FROM token_changes WHERE changed_at < ?",
                       arguments: [date.timeIntervalSince1970])
    }
}
