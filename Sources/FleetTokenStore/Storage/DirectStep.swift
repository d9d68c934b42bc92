// Storage layer: cached statements run through SQLite's C API, for the write path's hot statements.

import GRDB
import GRDBSQLite

/// Runs a cached statement through SQLite's C API, for the few statements on the write path
/// (every refresh runs them): GRDB's general execution (argument arrays of existentials,
/// value conversion, observation hooks we do not use) cost as much as SQLite's own work when
/// profiled. The statement still comes from GRDB's cache, on GRDB's connection, inside the
/// transaction GRDB serialises.
enum DirectStep {
    /// SQLite copies bound text at bind time, so the Swift string may go away at once.
    private static let transient = unsafeBitCast(-1, to: sqlite3_destructor_type.self)

    /// Binds positional parameters (1-based) on a reset statement; the first failure is kept.
    final class Binder {
        let handle: OpaquePointer
        private(set) var failure: Int32 = SQLITE_OK

        init(handle: OpaquePointer) { self.handle = handle }

        /// With its byte length, so text holding a NUL is bound whole.
        func bind(_ index: Int32, _ text: String) {
            let length = Int32(text.utf8.count)
            record(text.withCString { sqlite3_bind_text(handle, index, $0, length, DirectStep.transient) })
        }
        func bind(_ index: Int32, _ value: Double?) {
            record(value.map { sqlite3_bind_double(handle, index, $0) } ?? sqlite3_bind_null(handle, index))
        }
        func bind(_ index: Int32, _ value: Int64) { record(sqlite3_bind_int64(handle, index, value)) }

        private func record(_ code: Int32) { if failure == SQLITE_OK && code != SQLITE_OK { failure = code } }
    }

    /// Steps `sql` to completion; returns the first column of the first row as an integer, if any.
    @discardableResult
    static func run(_ db: Database, _ sql: String, bind: (Binder) -> Void = { _ in }) throws -> Int64? {
        let handle = try db.cachedStatement(sql: sql).sqliteStatement
        sqlite3_reset(handle)
        sqlite3_clear_bindings(handle)
        return try step(handle, db, sql: sql, bind: bind)
    }

    /// Binds and steps `handle` to completion, then resets it; `sql` names it in errors. The
    /// caller resets it first, or knows it is reset (``WriterStatements`` resets after each run)
    /// and that `bind` sets every parameter.
    static func step(_ handle: OpaquePointer, _ db: Database, sql: String, bind: (Binder) -> Void) throws -> Int64? {
        defer { sqlite3_reset(handle) }
        let binder = Binder(handle: handle)
        bind(binder)
        if binder.failure != SQLITE_OK {
            throw DatabaseError(resultCode: ResultCode(rawValue: binder.failure), message: "cannot bind a parameter", sql: sql)
        }
        var first: Int64?
        while true {
            switch sqlite3_step(handle) {
            case SQLITE_ROW:
                if first == nil { first = sqlite3_column_int64(handle, 0) }
            case SQLITE_DONE:
                return first
            case let code:
                let message = db.sqliteConnection.map { String(cString: sqlite3_errmsg($0)) } ?? "connection closed"
                throw DatabaseError(resultCode: ResultCode(rawValue: code), message: message, sql: sql)
            }
        }
    }
}
