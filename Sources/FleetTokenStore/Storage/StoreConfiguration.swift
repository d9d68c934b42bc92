// Storage layer: how to open a token store, and what opening did.

public import Foundation

/// How to open a token store: what the opener may create, change or repair.
///
/// The presets match the store's users: the agent (``agent``) creates, migrates and
/// quarantines; admin reads (``StoreOpenMode/readOnly-type.property``) change nothing; admin writes (``adminReadWrite``)
/// need an existing, current store; `tokenctl migrate` uses ``migrate``.
public struct StoreOpenMode: Sendable, Equatable {
    /// Create the store file (and its missing parent directories, mode 0700) when absent.
    public var createIfMissing: Bool
    /// Apply pending migrations. When false, a store older than this build is refused.
    public var applyMigrations: Bool
    /// Move a corrupt store aside (`<name>.corrupt-<UTC time>`) and start a fresh one,
    /// instead of failing with ``TokenStoreError/Code/corrupt``.
    public var quarantineCorrupt: Bool
    /// Open without the right to write: no file, mode or schema is changed.
    public var readOnly: Bool

    /// Creates a mode.
    public init(createIfMissing: Bool, applyMigrations: Bool, quarantineCorrupt: Bool, readOnly: Bool) {
        self.createIfMissing = createIfMissing
        self.applyMigrations = applyMigrations
        self.quarantineCorrupt = quarantineCorrupt
        self.readOnly = readOnly
    }

    /// A long-lived agent: availability first. Creates, migrates, quarantines corruption.
    public static let agent = StoreOpenMode(createIfMissing: true, applyMigrations: true,
                                            quarantineCorrupt: true, readOnly: false)
    /// Admin reads (`list`, `show`, `stats`, `check`): the store must exist; nothing is changed.
    public static let readOnly = StoreOpenMode(createIfMissing: false, applyMigrations: false,
                                               quarantineCorrupt: false, readOnly: true)
    /// Admin writes (`purge`): the store must exist and be current; corruption is reported.
    public static let adminReadWrite = StoreOpenMode(createIfMissing: false, applyMigrations: false,
                                                     quarantineCorrupt: false, readOnly: false)
    /// `tokenctl migrate`: creates and migrates; corruption is reported, not repaired.
    public static let migrate = StoreOpenMode(createIfMissing: true, applyMigrations: true,
                                              quarantineCorrupt: false, readOnly: false)
}

/// When a store's pages are all checked, by a scan that takes time in proportion to its size.
public enum IntegrityCheckTiming: Sendable, Equatable {
    /// Before opening, every time: damage anywhere is caught before anything is served, and
    /// start-up time grows with the store.
    case beforeOpening
    /// Before opening when the last run may not have ended cleanly or another process has the
    /// store open (either way the write-ahead log holds frames), or an earlier check found
    /// damage; otherwise in the background, 2 s after the store's background work begins (the
    /// engine's `run()` runs it; see ``SQLiteTokenRepository/runBackgroundWork()``; a store
    /// closed sooner skips it), so start-up does not scan the store. Damage found in the background is logged as an error
    /// and marked (`<store>.needs-check`), and the next open checks first and moves the store
    /// aside; until that restart the process serves from memory and its writes may fail as
    /// corrupt. Read-only opens never run the background check.
    case whenNeeded
    /// Never; only the constant-cost checks run.
    case never
}

/// Tuning of a token store connection. The defaults suit agents and admin tools alike.
public struct StoreConfiguration: Sendable, Equatable {
    /// How long a write waits for another process's write lock before failing with
    /// ``TokenStoreError/Code/busy``. Default 5 s.
    public var busyTimeout: TimeInterval = 5
    /// When every page of the store is checked (`PRAGMA integrity_check`; `quick_check` misses
    /// indexes that disagree with their tables). A file that is not a database, has a damaged
    /// header or was truncated is caught at every open regardless, at a cost that does not grow
    /// with the store. Default ``IntegrityCheckTiming/whenNeeded``.
    public var integrityCheck: IntegrityCheckTiming = .whenNeeded
    /// How often the store looks for changes made by other processes (`PRAGMA data_version`,
    /// one query on one connection). Default 0.25 s, so changes are seen well within a second.
    public var changePollInterval: TimeInterval = 0.25
    /// How long the change log keeps rows for slow readers. Default 300 s.
    public var changeLogRetention: TimeInterval = 300
    /// Create missing parent directories of the store (mode 0700). Default true.
    public var createParentDirectories: Bool = true
    /// Accept a store path whose last component is a symbolic link, and use the file it points
    /// to as the store (its side files live beside that file, and its owner and mode are
    /// checked). Default false: a link is refused with ``TokenStoreError/Code/symbolicLink``,
    /// since whoever can change it decides where tokens are written. Links among the parent
    /// directories are followed either way.
    public var allowsSymlinkedStore: Bool = false

    /// The default configuration.
    public init() {}
}

/// What opening a store did beyond opening it, for the caller to report.
public struct StoreOpenReport: Sendable, Equatable {
    /// Where a corrupt store was moved before a fresh one was created, if that happened.
    public var quarantinedTo: String?
    /// Why the quarantined store was judged corrupt.
    public var corruptionDetail: String?
    /// True when the full integrity check ran before opening (see ``IntegrityCheckTiming``).
    var checkedBeforeOpening: Bool = false
    /// Files whose modes were looser than 0600 and were tightened (each was also logged).
    var tightenedFiles: [String] = []
    /// Schema version found on disk before migrating (0 for a new store).
    public var schemaVersionBefore: Int = 0
    /// Schema version after opening.
    public var schemaVersion: Int = 0
    /// True when this open created the store file.
    public var created: Bool = false

    /// An empty report.
    public init() {}
}
