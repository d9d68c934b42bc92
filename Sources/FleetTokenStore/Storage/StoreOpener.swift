// Storage layer: the steps of opening a store, in order.

import FleetTokenMigrations
import Foundation
import GRDB
import Logging

/// The steps of opening a store, in order: path checks, file creation with safe modes, the
/// connection pool, the integrity check, the newer-store refusal, migrations, and quarantine of
/// a corrupt store when the mode allows it.
struct StoreOpener {
    let files: StoreFiles
    let mode: StoreOpenMode
    let configuration: StoreConfiguration
    let logger: Logger
    let migrator: SchemaMigrator

    func open() throws(TokenStoreError) -> (pool: DatabasePool, report: StoreOpenReport) {
        // Several processes opening a new store at once can meet SQLite's deadlock rule: a
        // connection that must upgrade its lock while another waits to (switching the file to
        // WAL, say) gets SQLITE_BUSY at once, without its busy handler. Such an open is tried
        // again until the busy timeout has passed; a store really held by a long write still
        // fails after it, as before.
        let started = ContinuousClock.now
        while true {
            do {
                return try openHandlingCorruption()
            } catch let error {
                guard error.code == .busy, ContinuousClock.now - started < .seconds(configuration.busyTimeout) else { throw error }
                Thread.sleep(forTimeInterval: Double.random(in: 0.01...0.05))
            }
        }
    }

    private func openHandlingCorruption() throws(TokenStoreError) -> (pool: DatabasePool, report: StoreOpenReport) {
        do {
            return try openOnce(report: StoreOpenReport())
        } catch let error {
            guard error.code == .corrupt, let detail = error.detail, mode.quarantineCorrupt, !mode.readOnly else { throw error }
            let moved = try files.quarantine()
            logger.error("token store is corrupt; moved it aside and started a fresh one (tokens will be refetched)", metadata: [
                "store": .string(files.path), "moved_to": .string(moved), "detail": .string(detail),
            ])
            var report = StoreOpenReport()
            report.quarantinedTo = moved
            report.corruptionDetail = detail
            return try openOnce(report: report)
        }
    }

    private func openOnce(report: StoreOpenReport) throws(TokenStoreError) -> (pool: DatabasePool, report: StoreOpenReport) {
        var report = report
        // Links and special files at the store path are refused before anything is created or
        // opened; ownership, side files and modes right after (see StoreFileSafety.swift).
        let existing = files.inspect()
        if let refusal = existing.refusal { throw refusal }
        if !existing.files.contains(where: { $0.path == files.path }) {
            guard mode.createIfMissing, !mode.readOnly else { throw .storeMissing(path: files.path) }
            try files.prepareDirectory(create: configuration.createParentDirectories)
            report.created = try createStore()
        }
        report.tightenedFiles = try files.secure(tighten: !mode.readOnly, logger: logger)

        // Judge an existing file through one read-only connection first: a corrupt or newer
        // store must be refused before anything writes to it (opening a writable pool does).
        let state = try inspect(report: &report)
        report.schemaVersionBefore = report.created ? 0 : state.storeVersion
        report.schemaVersion = state.storeVersion
        if !state.unknownIdentifiers.isEmpty {
            throw .storeNewerThanBuild(path: files.path, storeVersion: state.storeVersion, buildVersion: migrator.latestVersion)
        }
        let migrate = !state.pending.isEmpty
        if migrate && !(mode.applyMigrations && !mode.readOnly) {
            throw .storeOlderThanBuild(path: files.path, storeVersion: state.storeVersion, buildVersion: migrator.latestVersion)
        }

        let pool: DatabasePool
        do {
            pool = try DatabasePool(path: files.path, configuration: poolConfiguration())
        } catch {
            throw TokenStoreError(error, path: files.path, busyTimeout: configuration.busyTimeout)
        }
        if migrate {
            try applyMigrations(to: pool)
            report.schemaVersion = migrator.latestVersion
            if state.storeVersion > 0 {
                logger.notice("token store schema upgraded", metadata: [
                    "store": .string(files.path), "from": .stringConvertible(state.storeVersion),
                    "to": .stringConvertible(migrator.latestVersion),
                ])
            }
        }
        if !mode.readOnly {
            // SQLite created -wal/-shm with the store's mode and owner; make sure of both.
            do {
                report.tightenedFiles += try files.secure(tighten: true, logger: logger)
            } catch {
                try? pool.close()
                throw error
            }
        }
        return (pool, report)
    }

    /// Makes a new store whole (every migration applied, synced) under a private name and links
    /// it into place: a power cut while it is made leaves no store or a complete one, never a
    /// torn file the next start would quarantine. False when another process put its store
    /// there first (this one is then opened as theirs).
    private func createStore() throws(TokenStoreError) -> Bool {
        let staging = StoreStaging(for: files)
        try staging.create()
        defer { staging.remove() }
        // The staging file is not at the store's path yet: connections are checked against its own.
        var config = poolConfiguration(for: StoreFiles(path: staging.path))
        config.label = "FleetTokenStore.create"
        do {
            let pool = try DatabasePool(path: staging.path, configuration: config)
            try applyMigrations(to: pool)
            // Everything into the file, synced: the file alone is the store. A checkpoint that
            // fails throws here (closing would ignore it and keep the log, which the file
            // linked into place would not have).
            do {
                try pool.writeWithoutTransaction { db in _ = try db.checkpoint(.truncate) }
            } catch {
                try? pool.close()
                throw error
            }
            try pool.close()
        } catch {
            throw TokenStoreError(error, path: files.path, busyTimeout: configuration.busyTimeout)
        }
        try staging.requireNoLog()
        return try staging.install()
    }

    /// Applies the pending migrations; on failure closes `pool` and says which migration failed
    /// and why (named by the store's path, also while the store is made under a private name).
    private func applyMigrations(to pool: DatabasePool) throws(TokenStoreError) {
        do {
            try migrator.migrate(pool)
        } catch {
            try? pool.close()
            throw .migrationFailed(path: files.path, identifier: error.identifier,
                                   reason: TokenStoreError(error.underlying, path: files.path).description)
        }
    }

    /// Integrity check (when due, see ``IntegrityCheckTiming``) and schema state, through a
    /// read-only connection. Reading the schema catches, at constant cost, a file that is not
    /// a database, a damaged header, and truncation (SQLite refuses a file shorter than its
    /// header says).
    private func inspect(report: inout StoreOpenReport) throws(TokenStoreError) -> SchemaMigrator.State {
        let path = files.path
        let fullCheck = switch configuration.integrityCheck {
        case .beforeOpening: true
        case .whenNeeded: files.fullCheckNeeded
        case .never: false
        }
        var config = Configuration()
        config.readonly = true
        config.busyMode = .timeout(configuration.busyTimeout)
        config.label = "FleetTokenStore.inspect"
        let expected = files.pathAsSQLiteNamesIt
        config.prepareDatabase { [files] db in try files.verifyConnection(db, expected: expected) }
        do {
            let queue = try DatabaseQueue(path: path, configuration: config)
            defer { try? queue.close() }
            let state = try queue.read { db in
                let state = try migrator.state(db)
                if fullCheck { try IntegrityCheck.run(db, path: path) }
                return state
            }
            report.checkedBeforeOpening = fullCheck
            if fullCheck && !mode.readOnly { files.clearCheckMark() }
            return state
        } catch {
            throw TokenStoreError(error, path: path, busyTimeout: configuration.busyTimeout)
        }
    }

    private func poolConfiguration(for files: StoreFiles? = nil) -> Configuration {
        let files = files ?? self.files
        var config = Configuration()
        config.readonly = mode.readOnly
        config.busyMode = .timeout(configuration.busyTimeout)
        config.label = "FleetTokenStore"
        config.maximumReaderCount = 4
        let expected = files.pathAsSQLiteNamesIt
        config.prepareDatabase { [files] db in
            // Every connection, readers opened later included, must be to the file checked.
            try files.verifyConnection(db, expected: expected)
            // WAL makes NORMAL durable against crashes of the process; only a power loss can
            // drop the last commits, and tokens are refetchable (README, "What a power cut can
            // take"). GRDB sets the writer's NORMAL again after this closure, so a different
            // setting for commits would have to run on the writer once the pool is open.
            try db.execute(sql: "PRAGMA synchronous = NORMAL")
            // A purged or replaced token must not stay readable in free pages: SQLite's default
            // is off, and only some builds (Debian's) turn it on.
            try db.execute(sql: "PRAGMA secure_delete = ON")
            // 8 KiB pages for a store this opening creates (SQLite ignores it for an existing
            // one): a table WITHOUT ROWID keeps at most about a quarter page of a row in place,
            // and a sealed token (encryption at rest) of a typical ~900-character JWT is
            // ~1,250 bytes, which spilled every write onto an overflow page at 4 KiB.
            try db.execute(sql: "PRAGMA page_size = 8192")
        }
        return config
    }
}

/// The full check of every page.
enum IntegrityCheck {
    /// Throws ``TokenStoreError/corrupt(path:detail:)`` with the first findings.
    static func run(_ db: Database, path: String) throws {
        // integrity_check, not quick_check: quick_check skips the comparison of indexes with
        // their tables, so a store whose pages were mixed with another database's (a `-wal`
        // file from another store) passed it, and every later write failed as corrupt while
        // nothing moved the store aside. On a token store both cost about the same.
        let findings = try String.fetchAll(db, sql: "PRAGMA integrity_check")
        if findings != ["ok"] {
            throw TokenStoreError.corrupt(path: path, detail: "integrity_check: " + findings.prefix(3).joined(separator: "; "))
        }
    }
}

extension TokenStoreError {
    /// Maps a GRDB/SQLite error to the store's typed error. Uses SQLite's message only: GRDB's
    /// full description includes statement arguments, which may hold a token.
    init(_ error: any Error, path: String, busyTimeout: TimeInterval = StoreConfiguration().busyTimeout) {
        if let error = error as? TokenStoreError {
            self = error
            return
        }
        guard let error = error as? DatabaseError else {
            self = .sqlite(path: path, code: -1, message: String(describing: type(of: error)))
            return
        }
        let message = error.message ?? "no message"
        switch error.resultCode {
        case .SQLITE_FULL: self = .diskFull(path: path)
        case .SQLITE_BUSY, .SQLITE_LOCKED: self = .busy(path: path, timeoutSeconds: busyTimeout)
        case .SQLITE_READONLY: self = .readOnly(path: path)
        case .SQLITE_CORRUPT, .SQLITE_NOTADB: self = .corrupt(path: path, detail: message)
        case .SQLITE_MISUSE where message.contains("closed"): self = .closed(path: path)
        default: self = .sqlite(path: path, code: error.extendedResultCode.rawValue, message: message)
        }
    }
}
