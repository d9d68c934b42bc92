// Storage layer: the SQLite store's durable note that token values it replaced (sealing a
// plaintext store, rekey) may still be in its file's free space or its write-ahead log, kept in
// the file header's `user_version` and written in the replacing transaction itself.
import GRDB

/// Whether the SQLite store owes the clean-up of replaced values (`VACUUM`, then emptying the
/// write-ahead log), as SQLite's `PRAGMA user_version`: the 32-bit integer the file header keeps
/// for the application. Nothing else of this store uses it; it needs no schema change, so a
/// build before it opens the store as it did and ignores it, and it reads in constant time
/// (page 1, which SQLite keeps cached): a start checks it whatever the store's size.
///
/// - `0`: nothing owed.
/// - `n > 0`: values were replaced; the file must be rewritten and its log emptied. Each
///   replacing transaction sets a new `n`, so a clean-up that read the record before a
///   replacement committed (another process sealing beside it) leaves that replacement's
///   record in place instead of clearing it.
/// - `-n`: the file was rewritten after replacement `n`; only emptying the log is still owed
///   (another process's read kept it), which costs no second rewrite.
///
/// `sqlite3 tokens.sqlite 'PRAGMA user_version'` shows it; any other value a tool left there
/// reads as a clean-up owed (run once, then `0`).
struct DiscardOwedRecord: Sendable, Equatable {
    /// The header's value.
    let value: Int

    /// Nothing owed.
    static let nothingOwed = DiscardOwedRecord(value: 0)

    /// Some clean-up is owed.
    var isOwed: Bool { value != 0 }
    /// The file was rewritten since the last replacement; only its log is left to empty.
    var fileRewritten: Bool { value < 0 }
    /// The record once the file has been rewritten after the same replacement.
    var rewritten: DiscardOwedRecord { DiscardOwedRecord(value: -abs(value)) }

    /// The store's record, read inside the caller's transaction.
    static func read(_ db: Database) throws -> DiscardOwedRecord {
        try DiscardOwedRecord(value: Int.fetchOne(db, sql: "PRAGMA user_version") ?? 0)
    }

    /// Notes, inside the caller's replacing transaction, that values were replaced: a new
    /// positive value, committed or rolled back with the replacement.
    static func noteReplacement(_ db: Database) throws {
        let current = try abs(read(db).value)
        try write(current >= Int(Int32.max) ? 1 : current + 1, db)
    }

    /// Sets the record to `new` only while it is still `expected` (a replacement committed
    /// since keeps its own), inside the caller's transaction. Returns whether it did.
    static func replace(_ expected: DiscardOwedRecord, with new: DiscardOwedRecord, _ db: Database) throws -> Bool {
        guard try read(db) == expected else { return false }
        try write(new.value, db)
        return true
    }

    private static func write(_ value: Int, _ db: Database) throws {
        // A pragma takes no bound argument; the value is an integer of this type's making.
        try db.execute(sql: "PRAGMA user_version = \(value)")
    }
}
