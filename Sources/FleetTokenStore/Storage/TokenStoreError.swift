// Storage layer: why a store could not be opened, read or written. A struct with a code, so
// that a new failure can add a code without breaking users' exhaustive switches.

/// Why the token store could not do what was asked, worded for the operator who must fix it.
///
/// Check ``code`` against the static values of ``Code`` (`error.code == .busy`); ``path`` is
/// always set, the other details are optional properties, set for the codes that have them.
/// Build one with the static functions, e.g. `.busy(path:timeoutSeconds:)`. No error carries a
/// token value. Messages speak of the store and its configuration, never of a program's flags:
/// a program that opens the store adds how its own options set the path.
public struct TokenStoreError: Error, Sendable, Equatable, CustomStringConvertible {
    /// What went wrong. More codes may come: match them with `==`, keep a `default`.
    public struct Code: Hashable, Sendable, CustomStringConvertible {
        fileprivate enum Value: String, Sendable {
            case directoryMissing, directoryNotWritable, notAFile, storeMissing, storeNewerThanBuild
            case storeOlderThanBuild, corrupt, migrationFailed, diskFull, busy, readOnly, closed, sqlite
            case symbolicLink, notOwnedByUser, fileModeTooOpen
            case databaseUnavailable, database
            case encryptionKeyMissing
            case sessionPoolingRequired
        }

        fileprivate let value: Value

        /// The store's directory does not exist and the store was not allowed to create it.
        public static let directoryMissing = Code(value: .directoryMissing)
        /// The store's directory (or one the store had to create) cannot be written.
        public static let directoryNotWritable = Code(value: .directoryNotWritable)
        /// The path names a directory (or other non-file), not a store file.
        public static let notAFile = Code(value: .notAFile)
        /// There is no store file and the open mode does not create one.
        public static let storeMissing = Code(value: .storeMissing)
        /// The store records migrations this build does not know.
        public static let storeNewerThanBuild = Code(value: .storeNewerThanBuild)
        /// The store's schema is older than this build's and the open mode does not migrate.
        public static let storeOlderThanBuild = Code(value: .storeOlderThanBuild)
        /// The file is not a usable SQLite database, or failed its integrity check.
        public static let corrupt = Code(value: .corrupt)
        /// A migration failed and was rolled back.
        public static let migrationFailed = Code(value: .migrationFailed)
        /// The disk (or the store's size limit) is full.
        public static let diskFull = Code(value: .diskFull)
        /// Another connection held the write lock longer than the busy timeout.
        public static let busy = Code(value: .busy)
        /// The store file or its directory is read-only for this process.
        public static let readOnly = Code(value: .readOnly)
        /// The store was closed.
        public static let closed = Code(value: .closed)
        /// Any other SQLite failure.
        public static let sqlite = Code(value: .sqlite)
        /// The store or one of its side files is a symbolic link.
        public static let symbolicLink = Code(value: .symbolicLink)
        /// The store or one of its side files belongs to another user.
        public static let notOwnedByUser = Code(value: .notOwnedByUser)
        /// The store or one of its side files grants access to group or others.
        public static let fileModeTooOpen = Code(value: .fileModeTooOpen)
        /// A database server (PostgreSQL) could not be reached or did not answer in time.
        public static let databaseUnavailable = Code(value: .databaseUnavailable)
        /// A database server (PostgreSQL) refused a statement.
        public static let database = Code(value: .database)
        /// The store holds token values sealed with keys that were not given.
        public static let encryptionKeyMissing = Code(value: .encryptionKeyMissing)
        /// The database (PostgreSQL) is reached through a pooler that shares server sessions
        /// between clients (PgBouncer in transaction or statement mode); the store needs a
        /// session of its own per connection.
        public static let sessionPoolingRequired = Code(value: .sessionPoolingRequired)

        /// The code's stable name, e.g. `busy`.
        public var description: String { value.rawValue }
    }

    /// What went wrong.
    public let code: Code
    /// The store's path, as given.
    public let path: String
    /// The file at fault: the store itself (equal to ``path``) or one of its `-wal`/`-shm`
    /// side files (``Code/symbolicLink``, ``Code/notOwnedByUser``, ``Code/fileModeTooOpen``).
    public let file: String?
    /// What the system said (``Code/directoryNotWritable``, ``Code/migrationFailed``); for
    /// ``Code/fileModeTooOpen``, why setting 0600 failed, when it did.
    public let reason: String?
    /// The schema version recorded in the store (``Code/storeNewerThanBuild``,
    /// ``Code/storeOlderThanBuild``).
    package let storeVersion: Int?
    /// The schema version this build migrates to (``Code/storeNewerThanBuild``,
    /// ``Code/storeOlderThanBuild``).
    package let buildVersion: Int?
    /// What SQLite or the integrity check found (``Code/corrupt``).
    public let detail: String?
    /// The migration that failed (``Code/migrationFailed``).
    package let migrationIdentifier: String?
    /// The busy timeout that passed, in seconds (``Code/busy``).
    package let timeoutSeconds: Double?
    /// SQLite's extended result code, or -1 for a failure outside SQLite (``Code/sqlite``).
    package let sqliteCode: Int32?
    /// SQLite's own message (``Code/sqlite``); never statement arguments.
    package let sqliteMessage: String?
    /// Where the symbolic link points (``Code/symbolicLink``).
    package let target: String?
    /// The uid owning ``file`` (``Code/notOwnedByUser``).
    package let ownerID: UInt32?
    /// The uid of this process (``Code/notOwnedByUser``).
    package let userID: UInt32?
    /// The permission bits of ``file`` (``Code/fileModeTooOpen``).
    package let mode: Int?
    /// The server's SQLSTATE code (``Code/database``), e.g. `42P01`.
    package let sqlState: String?
    /// The ids of the keys the store needs and was not given (``Code/encryptionKeyMissing``).
    package let keyIDs: [String]?
    /// How many stored token values are sealed with those keys (``Code/encryptionKeyMissing``).
    package let valueCount: Int?

    private init(_ code: Code, path: String, file: String? = nil, reason: String? = nil, storeVersion: Int? = nil,
                 buildVersion: Int? = nil, detail: String? = nil, migrationIdentifier: String? = nil,
                 timeoutSeconds: Double? = nil, sqliteCode: Int32? = nil, sqliteMessage: String? = nil,
                 target: String? = nil, ownerID: UInt32? = nil, userID: UInt32? = nil, mode: Int? = nil,
                 sqlState: String? = nil, keyIDs: [String]? = nil, valueCount: Int? = nil) {
        self.code = code
        self.path = path
        self.file = file
        self.reason = reason
        self.storeVersion = storeVersion
        self.buildVersion = buildVersion
        self.detail = detail
        self.migrationIdentifier = migrationIdentifier
        self.timeoutSeconds = timeoutSeconds
        self.sqliteCode = sqliteCode
        self.sqliteMessage = sqliteMessage
        self.target = target
        self.ownerID = ownerID
        self.userID = userID
        self.mode = mode
        self.sqlState = sqlState
        self.keyIDs = keyIDs
        self.valueCount = valueCount
    }

    /// The store's directory does not exist and the store was not allowed to create it.
    package static func directoryMissing(path: String) -> Self { Self(.directoryMissing, path: path) }
    /// The store's directory (or one the store had to create) cannot be written.
    package static func directoryNotWritable(path: String, reason: String) -> Self {
        Self(.directoryNotWritable, path: path, reason: reason)
    }
    /// The path names a directory (or other non-file), not a store file.
    package static func notAFile(path: String) -> Self { Self(.notAFile, path: path) }
    /// There is no store file and the open mode only reads existing stores.
    package static func storeMissing(path: String) -> Self { Self(.storeMissing, path: path) }
    /// The store was written by a newer release: it records migrations this build does not know.
    package static func storeNewerThanBuild(path: String, storeVersion: Int, buildVersion: Int) -> Self {
        Self(.storeNewerThanBuild, path: path, storeVersion: storeVersion, buildVersion: buildVersion)
    }
    /// The store's schema is older than this build's and the open mode does not migrate.
    package static func storeOlderThanBuild(path: String, storeVersion: Int, buildVersion: Int) -> Self {
        Self(.storeOlderThanBuild, path: path, storeVersion: storeVersion, buildVersion: buildVersion)
    }
    /// The file is not a usable SQLite database, or failed its integrity check.
    package static func corrupt(path: String, detail: String) -> Self { Self(.corrupt, path: path, detail: detail) }
    /// A migration failed; it was rolled back and the previous schema is intact.
    package static func migrationFailed(path: String, identifier: String, reason: String) -> Self {
        Self(.migrationFailed, path: path, reason: reason, migrationIdentifier: identifier)
    }
    /// The disk (or the store's size limit) is full; the write was rolled back whole.
    package static func diskFull(path: String) -> Self { Self(.diskFull, path: path) }
    /// Another connection held the write lock longer than the busy timeout.
    package static func busy(path: String, timeoutSeconds: Double) -> Self { Self(.busy, path: path, timeoutSeconds: timeoutSeconds) }
    /// The store file or its directory is read-only for this process.
    package static func readOnly(path: String) -> Self { Self(.readOnly, path: path) }
    /// The store was closed.
    package static func closed(path: String) -> Self { Self(.closed, path: path) }
    /// Any other SQLite failure, with SQLite's own code and message.
    package static func sqlite(path: String, code: Int32, message: String) -> Self {
        Self(.sqlite, path: path, sqliteCode: code, sqliteMessage: message)
    }
    /// The store (`file` equal to `path`) or one of its `-wal`/`-shm` side files is a symbolic
    /// link, to `target`. Refused unless ``StoreConfiguration/allowsSymlinkedStore`` (for the
    /// store file; side files never are followed): whoever can change a link decides where
    /// tokens are written.
    package static func symbolicLink(path: String, file: String, target: String) -> Self {
        Self(.symbolicLink, path: path, file: file, target: target)
    }
    /// The store or a side file belongs to another user (`ownerID`), not to the running one
    /// (`userID`): its owner can read every token written to it, whatever its mode.
    package static func notOwnedByUser(path: String, file: String, ownerID: UInt32, userID: UInt32) -> Self {
        Self(.notOwnedByUser, path: path, file: file, ownerID: ownerID, userID: userID)
    }
    /// The store or a side file grants access to group or others (`mode`, permission bits).
    /// With a `reason`, setting 0600 failed and the store was refused; without one, it is
    /// reported (read-only opens, ``SQLiteTokenRepository/inspectFiles(at:configuration:)``).
    package static func fileModeTooOpen(path: String, file: String, mode: Int, reason: String?) -> Self {
        Self(.fileModeTooOpen, path: path, file: file, reason: reason, mode: mode)
    }

    /// The database server (PostgreSQL) at `path` (its URL without a password) could not be
    /// reached, or did not answer within the statement timeout: `reason` says which.
    package static func databaseUnavailable(path: String, reason: String) -> Self {
        Self(.databaseUnavailable, path: path, reason: reason)
    }
    /// The database server (PostgreSQL) at `path` refused a statement, with its SQLSTATE code
    /// and message (never statement arguments).
    package static func database(path: String, sqlState: String, message: String) -> Self {
        Self(.database, path: path, reason: message, sqlState: sqlState)
    }

    /// The store at `path` holds `valueCount` token values sealed with the keys `keyIDs`, and
    /// no key given has those ids (`keyGiven` false: no key was given at all). Nothing was
    /// changed: opening it without them would hand out no token and lose none.
    package static func encryptionKeyMissing(path: String, keyIDs: [String], valueCount: Int, keyGiven: Bool) -> Self {
        Self(.encryptionKeyMissing, path: path, reason: keyGiven ? "given keys differ" : nil, keyIDs: keyIDs, valueCount: valueCount)
    }

    /// The database server at `path` is reached through a pooler that hands one client's server
    /// session to others (`evidence`: what the check at open saw). Nothing was changed.
    package static func sessionPoolingRequired(path: String, evidence: String) -> Self {
        Self(.sessionPoolingRequired, path: path, reason: evidence)
    }

    /// What happened and what to do next.
    public var description: String {
        switch code.value {
        case .directoryMissing:
            "the directory of token store \(path) does not exist: create it (mode 0700) or choose another store path"
        case .directoryNotWritable:
            "cannot write in the directory of token store \(path) (\(reason ?? "")): give this user write access or choose another store path"
        case .notAFile:
            "\(path) is a directory or special file, not a token store: pass the path of the store file itself"
        case .storeMissing:
            "no token store at \(path): check the store path, or create the store by opening it in a mode that creates it (StoreOpenMode.migrate or .agent)"
        case .storeNewerThanBuild:
            "token store \(path) is newer than this build (store schema version \(storeVersion ?? 0), this build knows up to \(buildVersion ?? 0)): run the newer release, or move the file aside to start a fresh store; it was left untouched"
        case .storeOlderThanBuild:
            "token store \(path) has schema version \(storeVersion ?? 0), older than this build's \(buildVersion ?? 0): migrate it by opening it in a mode that applies migrations (StoreOpenMode.migrate or .agent)"
        case .corrupt:
            "token store \(path) is corrupt (\(detail ?? "")): the agent moves it aside to <name>.corrupt-<time> and starts fresh; tokens are refetched"
        case .migrationFailed:
            "migration \(migrationIdentifier ?? "") of token store \(path) failed and was rolled back (\(reason ?? "")); the previous schema is intact: report this with the store file (for PostgreSQL, pg_dump's schema-only dump of its schema)"
        case .diskFull:
            "the disk holding token store \(path) is full: nothing was half-written; free space, then the next refresh stores again"
        case .busy:
            "token store \(path) stayed locked by another process for more than \(timeoutSeconds ?? 0) s: find the process holding a long write transaction (e.g. an open sqlite3 shell) and end it"
        case .readOnly:
            "token store \(path) is read-only for this user: fix the file and directory ownership (the store's files are 0600)"
        case .closed:
            "token store \(path) was closed: open it again"
        case .sqlite:
            "token store \(path): SQLite error \(sqliteCode ?? -1): \(sqliteMessage ?? "")"
        case .symbolicLink where file == path:
            "token store \(path) is a symbolic link (to \(target ?? "")), and whoever can change a link decides where tokens are written: open the file itself (\(target ?? "")), or, when embedding, set StoreConfiguration.allowsSymlinkedStore"
        case .symbolicLink:
            "\(file ?? ""), a side file of token store \(path), is a symbolic link (to \(target ?? "")), through which SQLite would write tokens: find out who made it, then remove it (SQLite recreates it)"
        case .notOwnedByUser:
            "\(file == path ? "token store \(path)" : "\(file ?? ""), a side file of token store \(path),") belongs to uid \(ownerID ?? 0), not to this user (uid \(userID ?? 0)), so its owner could read every token written to it: find out who made it, then remove it or chown it to this user; run every program that opens the store as the store's owner, and keep the store in a directory only that user can write"
        case .fileModeTooOpen where reason == nil:
            "token store file \(file ?? path) has mode \(String(mode ?? 0, radix: 8)), so other users can read its tokens: chmod 600 it (the agent tightens it when it starts)"
        case .databaseUnavailable:
            "cannot reach the token database \(path) (\(reason ?? "")): check that the server runs and that the URL, network, TLS settings and credentials are right; an agent keeps serving the tokens it holds and writes again once the database is back"
        case .database:
            "the token database \(path) refused a statement: PostgreSQL error \(sqlState ?? "?"): \(reason ?? "")"
        case .encryptionKeyMissing:
            "token store \(path) holds \(valueCount ?? 0) token value(s) sealed with encryption key id \((keyIDs ?? []).joined(separator: ", ")), and \(reason == nil ? "no encryption key was given" : "no key given has that id"): open it with that key file (keep it as a second key while rotating), or purge those tokens to refetch them; no token in the store was changed"
        case .sessionPoolingRequired:
            "the token database \(path) is reached through PgBouncer (or another pooler) in transaction or statement mode (\(reason ?? "")): the store needs session pooling (pool_mode = session) for LISTEN/NOTIFY (without it replicas would silently miss each other's changes), advisory locks and its session settings; set pool_mode = session for this database in the pooler, or connect to PostgreSQL directly. Nothing was changed in the database"
        case .fileModeTooOpen:
            "token store file \(file ?? path) has mode \(String(mode ?? 0, radix: 8)) and could not be set to 0600 (\(reason ?? "")), so other users could read its tokens: chmod 600 it as its owner, or keep the store on a file system that keeps Unix modes"
        }
    }
}
