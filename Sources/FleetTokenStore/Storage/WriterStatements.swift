// Storage layer: WriterStatements, the statements every write runs, prepared once on the writer
// connection, and the change log's sequence as this connection last committed it.

import GRDB
import GRDBSQLite
import Synchronization

/// The statements every write runs (BEGIN IMMEDIATE, COMMIT, the change log's sequence, the
/// token upserts), prepared once and stepped through the C API (see ``DirectStep``): taking
/// them from GRDB's statement cache hashed their SQL text on every use, about 5k of the 125k
/// instructions a persisted token cost when profiled.
///
/// They belong to the connection they were prepared on: a write on another connection prepares
/// them anew there. SQLite recompiles a prepared statement itself when the schema changes
/// under it; besides, a failure other than busy or a constraint drops them all, so the next
/// write prepares from scratch rather than reuse one that went wrong. ``close()`` finalizes
/// them, and must come before GRDB closes the connection with `sqlite3_close`, which refuses
/// while any statement is alive; after it, writes take GRDB's statement cache, which GRDB
/// finalizes itself. A repository dropped without closing finalizes them in deinit (GRDB
/// closes a dropped connection with `sqlite3_close_v2`, which waits for them).
///
/// The lock is held while a statement steps, so ``close()`` never finalizes one in use; it is
/// never contended, since GRDB runs one write at a time on the writer connection.
final class WriterStatements: Sendable {
    enum Kind: Int, CaseIterable {
        case begin, commit, lastSequence, upsertClearingFailure, upsertKeepingFailure

        var sql: String {
            switch self {
            case .begin: "BEGIN IMMEDIATE"
            case .commit: "COMMIT"
            case .lastSequence: "SELECT seq FROM sqlite_sequence WHERE name = 'token_changes'"
            case .upsertClearingFailure: TokenRow.upsertClearingFailureSQL
            case .upsertKeepingFailure: TokenRow.upsertKeepingFailureSQL
            }
        }
    }

    /// The change log's last sequence number as of a commit on `connection`, valid while the
    /// main database's data version is still `dataVersion`.
    private struct CommittedSequence {
        let connection: Int
        let dataVersion: UInt32
        let sequence: Int64
    }

    /// A prepared statement.
    // @unchecked: a handle is only stepped, reset or finalized under the lock of `state`.
    private struct Handle: @unchecked Sendable {
        let pointer: OpaquePointer
    }

    /// Connections are kept as their addresses (identity only), which region checking accepts.
    private struct State {
        var connection: Int?
        var handles: [Handle?] = Array(repeating: nil, count: Kind.allCases.count)
        var committed: CommittedSequence?
        var closed = false

        mutating func finalizeAll() {
            for index in handles.indices {
                sqlite3_finalize(handles[index]?.pointer)
                handles[index] = nil
            }
            connection = nil
            committed = nil
        }
    }

    private let state = Mutex(State())

    deinit {
        state.withLock { $0.finalizeAll() }
    }

    /// Runs the statement of `kind` on `db`'s connection (see ``DirectStep/run(_:_:bind:)``);
    /// `bind` must set every parameter.
    @discardableResult
    func run(_ kind: Kind, _ db: Database, bind: (DirectStep.Binder) -> Void = { _ in }) throws -> Int64? {
        guard let connection = db.sqliteConnection else { return try DirectStep.run(db, kind.sql, bind: bind) }
        return try state.withLock { state throws -> Int64? in
            if state.closed { return try DirectStep.run(db, kind.sql, bind: bind) }
            if state.connection != Int(bitPattern: connection) {
                state.finalizeAll()
                state.connection = Int(bitPattern: connection)
            }
            let handle: OpaquePointer
            if let prepared = state.handles[kind.rawValue] {
                handle = prepared.pointer
            } else {
                var made: OpaquePointer?
                let code = sqlite3_prepare_v3(connection, kind.sql, -1, UInt32(SQLITE_PREPARE_PERSISTENT), &made, nil)
                guard code == SQLITE_OK, let made else {
                    sqlite3_finalize(made)
                    throw DatabaseError(resultCode: ResultCode(rawValue: code),
                                        message: String(cString: sqlite3_errmsg(connection)), sql: kind.sql)
                }
                state.handles[kind.rawValue] = Handle(pointer: made)
                handle = made
            }
            do {
                return try DirectStep.step(handle, db, sql: kind.sql, bind: bind)
            } catch let error as DatabaseError {
                switch error.resultCode.primaryResultCode {
                case .SQLITE_BUSY, .SQLITE_LOCKED, .SQLITE_CONSTRAINT: break
                default: state.finalizeAll()
                }
                throw error
            }
        }
    }

    /// The change log's last sequence number, read inside the write transaction.
    func lastSequence(_ db: Database) throws -> Int64 {
        try run(.lastSequence, db) ?? 0
    }

    /// The change log's last sequence number at the start of a write transaction: the one noted
    /// at this connection's last commit (``noteCommit(sequence:_:)``) when nothing has changed
    /// the file since, by this connection or any other (SQLite's data version, a C call, tells);
    /// read otherwise. Saves one of the two reads every write made. A noted sequence serves once.
    func sequenceAtStart(_ db: Database) throws -> Int64 {
        if let connection = db.sqliteConnection,
           let committed = state.withLock({ state in defer { state.committed = nil }; return state.committed }),
           committed.connection == Int(bitPattern: connection),
           Self.dataVersion(connection) == committed.dataVersion {
            return committed.sequence
        }
        return try lastSequence(db)
    }

    /// Notes the change log's last sequence number right after a commit on `db`'s connection.
    func noteCommit(sequence: Int64, _ db: Database) {
        guard let connection = db.sqliteConnection, let version = Self.dataVersion(connection) else { return }
        let address = Int(bitPattern: connection)
        state.withLock { state in
            guard !state.closed else { return }
            state.committed = CommittedSequence(connection: address, dataVersion: version, sequence: sequence)
        }
    }

    /// Finalizes the statements; later writes take GRDB's statement cache.
    func close() {
        state.withLock { state in
            state.closed = true
            state.finalizeAll()
        }
    }

    /// The main database's data version (`SQLITE_FCNTL_DATA_VERSION`): it changes with every
    /// commit, by this connection or, seen when the next transaction begins, by any other.
    private static func dataVersion(_ connection: OpaquePointer) -> UInt32? {
        var version: UInt32 = 0
        return sqlite3_file_control(connection, "main", SQLITE_FCNTL_DATA_VERSION, &version) == SQLITE_OK ? version : nil
    }
}
