/// Why the token store could not do what was asked, worded for the operator who must fix it.
///
/// No case carries a token value.
public enum TokenStoreError: Error, Sendable, Equatable, CustomStringConvertible {
    /// The store's directory does not exist and the store was not allowed to create it.
    case directoryMissing(path: String)
    /// The store's directory (or one the store had to create) cannot be written.
    case directoryNotWritable(path: String, reason: String)
    /// The path names a directory (or other non-file), not a store file.
    case notAFile(path: String)
    /// There is no store file and the command only reads existing stores.
    case storeMissing(path: String)
    /// The store was written by a newer release: it records migrations this build does not know.
    case storeNewerThanBuild(path: String, storeVersion: Int, buildVersion: Int)
    /// The store's schema is older than this build's and the command does not migrate.
    case storeOlderThanBuild(path: String, storeVersion: Int, buildVersion: Int)
    /// The file is not a usable SQLite database, or failed its integrity check.
    case corrupt(path: String, detail: String)
    /// A migration failed; it was rolled back and the previous schema is intact.
    case migrationFailed(path: String, identifier: String, reason: String)
    /// The disk (or the store's size limit) is full; the write was rolled back whole.
    case diskFull(path: String)
    /// Another connection held the write lock longer than the busy timeout.
    case busy(path: String, timeoutSeconds: Double)
    /// The store file or its directory is read-only for this process.
    case readOnly(path: String)
    /// The store was closed.
    case closed(path: String)
    /// Any other SQLite failure, with SQLite's own code and message.
    case sqlite(path: String, code: Int32, message: String)
    /// The store (`file` equal to `path`) or one of its `-wal`/`-shm` side files is a symbolic
    /// link, to `target`. Refused unless ``StoreConfiguration/allowsSymlinkedStore`` (for the
    /// store file; side files never are followed): whoever can change a link decides where
    /// tokens are written.
    case symbolicLink(path: String, file: String, target: String)
    /// The store or a side file belongs to another user (`ownerID`), not to the running one
    /// (`userID`): its owner can read every token written to it, whatever its mode.
    case notOwnedByUser(path: String, file: String, ownerID: UInt32, userID: UInt32)
    /// The store or a side file grants access to group or others (`mode`, permission bits).
    /// With a `reason`, setting 0600 failed and the store was refused; without one, it is
    /// reported (read-only opens, ``SQLiteTokenRepository/inspectFiles(at:configuration:)``).
    case fileModeTooOpen(path: String, file: String, mode: Int, reason: String?)

    /// What happened and what to do next.
    public var description: String {
        switch self {
        case .directoryMissing(let path):
            "the directory of token store \(path) does not exist: create it (mode 0700) or pass another --db path"
        case .directoryNotWritable(let path, let reason):
            "cannot write in the directory of token store \(path) (\(reason)): give this user write access or choose another --db path"
        case .notAFile(let path):
            "\(path) is a directory or special file, not a token store: pass the path of the store file itself"
        case .storeMissing(let path):
            "no token store at \(path): check --db / TOKEN_STORE_DB, or create one with `tokenctl migrate`"
        case .storeNewerThanBuild(let path, let storeVersion, let buildVersion):
            "token store \(path) is newer than this build (store schema version \(storeVersion), this build knows up to \(buildVersion)): run the newer release, or move the file aside to start a fresh store; it was left untouched"
        case .storeOlderThanBuild(let path, let storeVersion, let buildVersion):
            "token store \(path) has schema version \(storeVersion), older than this build's \(buildVersion): run `tokenctl migrate` (or start the agent, which migrates)"
        case .corrupt(let path, let detail):
            "token store \(path) is corrupt (\(detail)): the agent moves it aside to <name>.corrupt-<time> and starts fresh; tokens are refetched"
        case .migrationFailed(let path, let identifier, let reason):
            "migration \(identifier) of token store \(path) failed and was rolled back (\(reason)); the previous schema is intact: report this with the store file"
        case .diskFull(let path):
            "the disk holding token store \(path) is full: nothing was half-written; free space, then the next refresh stores again"
        case .busy(let path, let timeout):
            "token store \(path) stayed locked by another process for more than \(timeout) s: find the process holding a long write transaction (e.g. an open sqlite3 shell) and end it"
        case .readOnly(let path):
            "token store \(path) is read-only for this user: fix the file and directory ownership (the store's files are 0600)"
        case .closed(let path):
            "token store \(path) was closed: open it again"
        case .sqlite(let path, let code, let message):
            "token store \(path): SQLite error \(code): \(message)"
        case .symbolicLink(let path, let file, let target) where file == path:
            "token store \(path) is a symbolic link (to \(target)), and whoever can change a link decides where tokens are written: pass the path of the file itself (--db \(target)), or, when embedding, set StoreConfiguration.allowsSymlinkedStore"
        case .symbolicLink(let path, let file, let target):
            "\(file), a side file of token store \(path), is a symbolic link (to \(target)), through which SQLite would write tokens: find out who made it, then remove it (SQLite recreates it)"
        case .notOwnedByUser(let path, let file, let owner, let user):
            "\(file == path ? "token store \(path)" : "\(file), a side file of token store \(path),") belongs to uid \(owner), not to this user (uid \(user)), so its owner could read every token written to it: find out who made it, then remove it or chown it to this user; run the agent and tokenctl as the store's owner, and keep the store in a directory only that user can write"
        case .fileModeTooOpen(_, let file, let mode, nil):
            "token store file \(file) has mode \(String(mode, radix: 8)), so other users can read its tokens: chmod 600 it (the agent tightens it when it starts)"
        case .fileModeTooOpen(_, let file, let mode, let reason?):
            "token store file \(file) has mode \(String(mode, radix: 8)) and could not be set to 0600 (\(reason)), so other users could read its tokens: chmod 600 it as its owner, or keep the store on a file system that keeps Unix modes"
        }
    }
}
