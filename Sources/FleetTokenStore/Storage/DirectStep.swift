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

    /// Binds positional parameters (1-based) on a reset statement.
    struct Binder {
        let handle: OpaquePointer

        func bind(_ index: Int32, _ text: String) { sqlite3_bind_text(handle, index, text, -1, DirectStep.transient) }
        func bind(_ index: Int32, _ value: Double?) {
            if let value { sqlite3_bind_double(handle, index, value) } else { sqlite3_bind_null(handle, index) }
        }
        func bind(_ index: Int32, _ value: Int64) { sqlite3_bind_int64(handle, index, value) }
    }

    /// Steps `sql` to completion; returns the first column of the first row as an integer, if any.
    @discardableResult
    static func run(_ db: Database, _ sql: String, bind: (Binder) -> Void = { _ in }) throws -> Int64? {
        let handle = try db.cachedStatement(sql: sql).sqliteStatement
        sqlite3_reset(handle)
        sqlite3_clear_bindings(handle)
        defer { sqlite3_reset(handle) }
        bind(Binder(handle: handle))
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
