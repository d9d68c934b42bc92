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
///
/// The polling is the owner's long-running work: it runs inside ``run()`` (a child task of the
/// engine's `run()`, through ``SQLiteTokenRepository/runBackgroundWork()``), never in a task of
/// its own. The loop around each poll (one loop at a time, a pause after a failure, closing) is
/// the ``ChangeFeedRunner`` the PostgreSQL feed runs too.
final class ChangeMonitor: ChangeFeedWatch {
    private struct State: Sendable {
        var ownRanges: [ClosedRange<Int64>] = []
        /// Where the loop polls from next: the starting point the first subscriber took, the
        /// position an interrupted loop reached, or none (`.some(nil)`: open the watching
        /// connection first, and report `.unknown` since streams started before it).
        var pendingStart: Watcher??
        /// Whether changes are being watched (a starting point was taken and polling has not
        /// stopped): only then are own changes noted.
        var watching = false
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
    /// The loop, and the subscribers (its broadcaster). A reader that missed a change would
    /// serve a stale token: one far behind gets `.unknown` in place of what it has not read.
    private let runner: ChangeFeedRunner
    private var subscribers: StoreChangeBroadcaster { runner.broadcaster }
    /// A subscriber arrived or the monitor closed: the loop looks again.
    private let wakes = WakeSignal()
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
        // The open of the watching connection is retried each second; a second loop looks
        // whether the first has ended once per poll interval.
        self.runner = ChangeFeedRunner(pacing: .init(takeOverCheck: self.interval, retryInitial: .seconds(1),
                                                     retryMaximum: .seconds(1)), clock: clock)
    }

    /// How many polls have completed since the monitor was made.
    var completedPolls: Int { polls.withLock { $0 } }

    /// A stream of changes, reported while ``run()`` runs. When no stream was alive, this call
    /// takes the starting point before returning, so every change committed after it returns
    /// is reported (once run() runs, if it does not yet).
    func subscribe() -> AsyncStream<TokenStoreChange> {
        let stream = subscribers.subscribe()
        let started = state.withLock { state -> Bool in
            guard !runner.isClosed, !state.watching else { return false }
            // A read of two numbers, once per start of watching: under the lock, so no write's
            // own-change note falls between the starting point and the loop.
            state.pendingStart = .some(try? openWatcher())
            state.watching = true
            return true
        }
        if started { wakes.signal() }
        return stream
    }

    /// Most own-change ranges kept while no loop drains them (a stream kept without
    /// ``run()``): beyond it the oldest go, and their changes are echoed, which costs a re-read.
    static let maximumOwnRanges = 4096

    /// Marks log rows written by this process's repository, so they are not echoed back.
    /// Nothing is noted while nobody watches (watching starts from the log's end); each poll
    /// drops the ranges it has passed, so the list stays short.
    func noteOwnChanges(_ range: ClosedRange<Int64>) {
        state.withLock { state in
            guard state.watching else { return }
            if !runner.isRunning && !subscribers.hasSubscribers {
                // Every stream ended before a loop ran: stop watching; the next stream starts anew.
                state.watching = false
                state.pendingStart = nil
                state.ownRanges = []
                return
            }
            if let last = state.ownRanges.last, last.upperBound + 1 == range.lowerBound {
                state.ownRanges[state.ownRanges.count - 1] = last.lowerBound...range.upperBound
            } else {
                state.ownRanges.append(range)
                if state.ownRanges.count > Self.maximumOwnRanges { state.ownRanges.removeFirst() }
            }
        }
    }

    /// Forgets a noted range whose transaction did not commit. Exactly that range: a later
    /// write may reuse its numbers (the rollback reset the sequence) and must stay noted.
    func forgetOwnChanges(_ range: ClosedRange<Int64>) {
        state.withLock { state in
            if let index = state.ownRanges.firstIndex(of: range) { state.ownRanges.remove(at: index) }
        }
    }

    /// Ends every stream; a running ``run()`` returns.
    func close() {
        runner.close()
        wakes.signal()
    }

    /// Polls for other connections' changes while streams are alive, and waits for the next
    /// subscriber while none is, until the task is cancelled or the monitor closes. One loop
    /// polls at a time: a second call waits and takes over when the first ends.
    func run() async {
        await runner.run(self)
    }

    /// One turn of the loop: polls from the starting point a subscriber took (or the position
    /// an interrupted loop reached) until nobody listens; with none, waits for a subscriber.
    func watchOnce(_ turn: ChangeFeedRunner.Turn) async throws {
        _ = wakes.take()
        if runner.isClosed { return }
        let start = state.withLock { state -> Watcher?? in
            defer { state.pendingStart = nil }
            return state.pendingStart
        }
        if let start {
            try await poll(from: start, turn)
        } else {
            await wakes.wait()
        }
    }

    /// The watching connection could not be opened: said at each attempt, a second apart.
    func watchFailed(_ error: any Error, again: Bool) {
        logger.error("cannot watch the token store for changes by other processes; retrying", metadata: [
            "store": .string(path), "error": .string(TokenStoreError(error, path: path).description),
        ])
    }

    /// The loop is over: leaves the position to the next loop while streams are alive, so a
    /// flight that polled for its own wait and stopped loses no change for the engine's loop;
    /// otherwise stops watching.
    func loopEnded() {
        let toClose = state.withLock { state -> DatabaseQueue? in
            // The position reached, or a start a stream took and no loop polled from yet.
            if !runner.isClosed && subscribers.hasSubscribers { return nil }
            defer {
                state.watching = false
                state.ownRanges = []
                state.pendingStart = nil
            }
            return state.pendingStart??.reader
        }
        try? toClose?.close()
    }

    /// True while someone listens; otherwise stops watching in the same critical section, so
    /// the next subscriber takes a new starting point.
    private func keepPolling() -> Bool {
        state.withLock { state in
            if !subscribers.hasSubscribers || runner.isClosed {
                state.watching = false
                state.ownRanges = []
                return false
            }
            return true
        }
    }

    /// Opens the read-only watching connection and reads the starting point.
    private func openWatcher() throws -> Watcher {
        var configuration = Configuration()
        configuration.readonly = true
        configuration.busyMode = .timeout(busyTimeout)
        configuration.label = "FleetTokenStore.changes"
        let queue = try DatabaseQueue(path: path, configuration: configuration)
        let (version, sequence) = try queue.read { db in
            (try Int64.fetchOne(db, sql: "PRAGMA data_version") ?? 0, try ChangeLog.lastSequence(db))
        }
        return Watcher(reader: queue, dataVersion: version, lastSequence: sequence)
    }

    /// Polls from `start` until nobody listens, the monitor closes, or the task is cancelled.
    /// - Throws: Why the watching connection could not be opened (the runner retries the open
    ///   after its pause, while someone listens).
    private func poll(from start: Watcher?, _ turn: ChangeFeedRunner.Turn) async throws {
        var watcher: Watcher
        if let start {
            watcher = start
        } else {
            guard keepPolling() else { return }
            do {
                watcher = try openWatcher()
            } catch {
                state.withLock { $0.pendingStart = .some(nil) }
                throw error
            }
        }
        // A start of nil: watching starts later than the streams did, and what committed
        // between is not itemized.
        turn.watching(afterGap: start == nil)
        while keepPolling() {
            do {
                try await clock.sleep(for: interval)
            } catch {
                // Cancelled: the reader stays open for the next loop, which resumes from here.
                state.withLock { $0.pendingStart = .some(watcher) }
                return
            }
            do {
                let known = watcher
                let batch = try await known.reader.read { db -> ChangeLog.Batch? in
                    let version = try Int64.fetchOne(db, sql: "PRAGMA data_version") ?? 0
                    guard version != known.dataVersion else { return nil }
                    return try ChangeLog.read(db, after: known.lastSequence, dataVersion: version,
                                              limit: Self.maximumItemizedChanges)
                }
                if let batch {
                    deliver(batch, after: known.lastSequence)
                    watcher = Watcher(reader: known.reader, dataVersion: batch.dataVersion,
                                      lastSequence: max(known.lastSequence, batch.lastSequence))
                }
            } catch {
                logger.warning("could not read the token store's change log; will retry", metadata: [
                    "store": .string(path), "error": .string(TokenStoreError(error, path: path).description),
                ])
            }
            polls.withLock { $0 += 1 }
        }
        try? watcher.reader.close()
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
