// Storage layer: SQLiteTransactionRunner, the SQLite store's transaction plumbing: reads through
// GRDB's pool, and writes in `BEGIN IMMEDIATE` that note their change-log rows (so the change
// feed does not echo them) and run inline on the caller's thread when the write lock is free.
import Foundation
import GRDB
import GRDBSQLite
import Logging
import Synchronization

/// Runs the store's reads and writes; every table type of ``SQLiteTokenRepository`` goes
/// through one runner, so the inline-write bookkeeping sees all writes of a repository.
final class SQLiteTransactionRunner: Sendable {
    let pool: DatabasePool
    let path: String
    private let monitor: ChangeMonitor
    private let busyTimeout: TimeInterval
    private let changeLogRetention: TimeInterval
    private let lastPrune = Mutex(Date.distantPast)
    /// Writes started and not finished; a write runs on its caller's thread only when it is
    /// the only one (see ``write(inline:_:)``). ``close(logger:)`` adds one for good.
    private let writesInFlight = Atomic<Int>(0)
    /// The write path's statements, prepared on the writer connection; finalized by ``close(logger:)``.
    let statements = WriterStatements()

    init(pool: DatabasePool, path: String, monitor: ChangeMonitor, configuration: StoreConfiguration) {
        self.pool = pool
        self.path = path
        self.monitor = monitor
        self.busyTimeout = configuration.busyTimeout
        self.changeLogRetention = configuration.changeLogRetention
    }

    func read<T: Sendable>(_ body: @escaping @Sendable (Database) throws -> T) async throws(TokenStoreError) -> T {
        do {
            return try await pool.read(body)
        } catch {
            throw TokenStoreError(error, path: path, busyTimeout: busyTimeout)
        }
    }

    /// Runs `body` in one `BEGIN IMMEDIATE` transaction. The change-log rows it causes are noted
    /// as this repository's own before commit, so the change monitor never echoes them.
    ///
    /// A small write (`inline`: a few rows, as every refresh makes) that can start at once (no
    /// other write of this repository in flight, the file's write lock free) runs right here on
    /// the calling thread: it commits in tens of microseconds with `synchronous=NORMAL`, and
    /// handing it to GRDB's writer queue and back cost several times that when profiled.
    /// Anything that would wait for the queue or another process's lock, big batches and the
    /// change log's pruning go through GRDB's queue with the full busy timeout, so a caller's
    /// thread never waits on a lock. Purges run inline too (see
    /// ``SQLiteTokenRepository/purge(_:scope:)``). An inline write still does the occasional WAL
    /// checkpoint SQLite runs at commit, as any SQLite commit would.
    ///
    /// The inline path steps BEGIN and COMMIT through the C API (``WriterStatements``), outside GRDB's
    /// statement bookkeeping: bodies must let every error propagate (none may swallow one and
    /// go on, since SQLite may have rolled back), and nothing may rely on GRDB's transaction
    /// date or observers, which this store does not use.
    func write<T: Sendable>(inline: Bool = true, _ body: @escaping @Sendable (Database) throws -> T) async throws(TokenStoreError) -> T {
        let noted = Mutex<ClosedRange<Int64>?>(nil)
        let monitor = self.monitor
        let retention = changeLogRetention
        let statements = self.statements
        let pruneDue = lastPrune.withLock { last in
            let now = Date()
            guard now.timeIntervalSince(last) > 60 else { return false }
            last = now
            return true
        }
        // Returns the change log's last sequence number too, for the inline path to note at commit.
        let transaction: @Sendable (Database) throws -> (T, Int64) = { db in
            let before = try statements.sequenceAtStart(db)
            let result = try body(db)
            let after = try statements.lastSequence(db)
            if after > before {
                let range = (before + 1)...after
                monitor.noteOwnChanges(range)
                noted.withLock { $0 = range }
            }
            if pruneDue { try ChangeLog.prune(db, olderThan: Date().addingTimeInterval(-retention)) }
            return (result, after)
        }
        let forget = { if let range = noted.withLock({ $0 }) { monitor.forgetOwnChanges(range) } }

        let claimedAtOnce = inline && !pruneDue
            && writesInFlight.compareExchange(expected: 0, desired: 1, ordering: .acquiringAndReleasing).exchanged
        if !claimedAtOnce { writesInFlight.add(1, ordering: .acquiringAndReleasing) }
        defer { writesInFlight.subtract(1, ordering: .acquiringAndReleasing) }
        do {
            if claimedAtOnce, let result = try writeAtOnce(transaction) { return result }
            return try await pool.write(transaction).0
        } catch {
            forget()
            throw TokenStoreError(error, path: path, busyTimeout: busyTimeout)
        }
    }

    /// Runs `transaction` in `BEGIN IMMEDIATE` on this thread, not waiting for the write lock:
    /// nil, with nothing run, when another connection holds it.
    private func writeAtOnce<T>(_ transaction: (Database) throws -> (T, Int64)) throws -> T? {
        let busyTimeoutMilliseconds = Int32(busyTimeout * 1000)
        let statements = self.statements
        return try pool.writeWithoutTransaction { db -> T? in
            guard let connection = db.sqliteConnection else { return nil }
            sqlite3_busy_timeout(connection, 0)
            defer { sqlite3_busy_timeout(connection, busyTimeoutMilliseconds) }
            // Prepared once and stepped directly (see WriterStatements): parsing BEGIN and
            // COMMIT anew, and GRDB's general execution, showed up in the profile.
            do {
                try statements.run(.begin, db)
            } catch let error as DatabaseError where error.resultCode == .SQLITE_BUSY {
                return nil
            }
            do {
                let (result, sequence) = try transaction(db)
                try statements.run(.commit, db)
                statements.noteCommit(sequence: sequence, db)
                return result
            } catch {
                if db.isInsideTransaction { try? db.rollback() }
                throw error
            }
        }
    }

    /// From now on every write takes GRDB's queue (which reports the store closed), so none
    /// waits inline behind the closing checkpoint.
    func stopInlineWrites() {
        writesInFlight.add(1, ordering: .acquiringAndReleasing)
    }

    /// Folds the write-ahead log into the store file as far as other processes allow, and
    /// closes the pool; what fails is logged, since closing cannot be refused.
    func close(logger: Logger) {
        do {
            if !pool.configuration.readonly {
                // GRDB closes the writer before its read-only readers, so SQLite's own
                // checkpoint-on-close never runs; do it here, without waiting: when another
                // process still reads or writes the store, fold what it allows and leave the
                // rest of the log to it.
                try pool.writeWithoutTransaction { db in
                    if let connection = db.sqliteConnection { sqlite3_busy_timeout(connection, 0) }
                    do {
                        try db.checkpoint(.truncate)
                    } catch let error as DatabaseError where error.resultCode == .SQLITE_BUSY || error.resultCode == .SQLITE_LOCKED {
                        _ = try? db.checkpoint(.passive)
                    }
                }
            }
            // GRDB closes the writer with sqlite3_close, which refuses while statements live.
            statements.close()
            try pool.close()
        } catch {
            logger.warning("token store did not close cleanly", metadata: [
                "store": .string(path), "error": .string(TokenStoreError(error, path: path).description),
            ])
        }
    }
}
