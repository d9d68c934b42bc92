// Storage layer: the store's files as judged before opening: owners, modes, links.

import Foundation
import GRDB
import GRDBSQLite
import Logging
#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// The store's files as the library judges them before opening: who owns them, their modes,
/// and what would make the store refuse to open. Nothing is opened or changed to find out.
package struct StoreFileReport: Sendable, Equatable {
    /// One existing file among the store and its `-wal`/`-shm` side files.
    package struct File: Sendable, Equatable {
        /// The file's path.
        package let path: String
        /// Its permission bits (0600 for a private file).
        package let mode: Int
        /// The user id that owns it.
        package let ownerID: UInt32
        let device: UInt64
        let inode: UInt64
    }

    /// The store file the library opens: the path given, or with
    /// ``StoreConfiguration/allowsSymlinkedStore`` the file a link there points to.
    package let storePath: String
    /// The store and side files that exist, as regular files (links are never followed here).
    package let files: [File]
    /// What is wrong, worded for the operator: symbolic links, files that are not regular
    /// files, files another user owns, and modes looser than 0600 (which a writable open
    /// tightens and a read-only one only reports). Empty for a sound store and for a missing one.
    package let problems: [TokenStoreError]

    /// True when opening would be refused (anything but a mode the opener may still tighten).
    var refusal: TokenStoreError? {
        problems.first { $0.code != .fileModeTooOpen }
    }
}

extension SQLiteTokenRepository {
    /// Judges the files of the store at `path` by the rules every open applies, without opening
    /// or changing anything: `tokenctl check` reports what this finds.
    ///
    /// The rules: the store must be a regular file owned by the running user, and so must its
    /// `-wal` and `-shm` files when they exist; the store may be a symbolic link only with
    /// ``StoreConfiguration/allowsSymlinkedStore`` (side files never); every file should be
    /// 0600 (a writable open sets it, and refuses the store when it cannot).
    package static func inspectFiles(at path: String, configuration: StoreConfiguration = StoreConfiguration()) -> StoreFileReport {
        StoreFiles(path: path, allowsSymlink: configuration.allowsSymlinkedStore).inspect()
    }
}

extension StoreFiles {
    /// The store and its side files as they are now, with what is wrong with them.
    func inspect() -> StoreFileReport {
        let user = UInt32(geteuid())
        var files: [StoreFileReport.File] = []
        var problems: [TokenStoreError] = []
        for file in [path, walPath, shmPath] {
            var info = stat()
            guard lstat(file, &info) == 0 else { continue }
            switch info.st_mode & S_IFMT {
            case S_IFREG:
                break
            case S_IFLNK:
                problems.append(.symbolicLink(path: path, file: file, target: Self.linkTarget(file)))
                continue
            default:
                problems.append(.notAFile(path: file))
                continue
            }
            let entry = StoreFileReport.File(path: file, mode: Int(info.st_mode & 0o7777), ownerID: UInt32(info.st_uid),
                                             device: UInt64(info.st_dev), inode: UInt64(info.st_ino))
            files.append(entry)
            if entry.ownerID != user {
                problems.append(.notOwnedByUser(path: path, file: file, ownerID: entry.ownerID, userID: user))
            } else if entry.mode & 0o077 != 0 {
                problems.append(.fileModeTooOpen(path: path, file: file, mode: entry.mode, reason: nil))
            }
        }
        return StoreFileReport(storePath: path, files: files, problems: problems)
    }

    /// Refuses links, special files and other users' files among the store and its side files;
    /// sets loose modes to 0600 (when `tighten`; a read-only open only warns) and returns the
    /// files it changed.
    /// - Throws: the first refusal, or ``TokenStoreError/fileModeTooOpen(path:file:mode:reason:)``
    ///   with the reason when a mode cannot be set.
    func secure(tighten: Bool, logger: Logger) throws(TokenStoreError) -> [String] {
        let report = inspect()
        if let refusal = report.refusal { throw refusal }
        var tightened: [String] = []
        for file in report.files where file.mode & 0o077 != 0 {
            guard tighten else {
                logger.warning("token store file mode is too open (read-only command, not changed): run the agent or `chmod 600`", metadata: [
                    "file": .string(file.path), "mode": .string(String(file.mode, radix: 8)),
                ])
                continue
            }
            try makePrivate(file)
            logger.warning("token store file mode was too open; set to 0600", metadata: [
                "file": .string(file.path), "previous_mode": .string(String(file.mode, radix: 8)),
            ])
            tightened.append(file.path)
        }
        return tightened
    }

    /// Sets 0600 through a descriptor opened without following links, on the very file inspected.
    private func makePrivate(_ file: StoreFileReport.File) throws(TokenStoreError) {
        func refuse(_ reason: String) -> TokenStoreError {
            .fileModeTooOpen(path: path, file: file.path, mode: file.mode, reason: reason)
        }
        let descriptor = open(file.path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC)
        guard descriptor >= 0 else { throw refuse(Self.errnoText()) }
        defer { close(descriptor) }
        var info = stat()
        guard fstat(descriptor, &info) == 0 else { throw refuse(Self.errnoText()) }
        guard UInt64(info.st_dev) == file.device, UInt64(info.st_ino) == file.inode else {
            throw refuse("the file was replaced while it was being checked")
        }
        guard fchmod(descriptor, 0o600) == 0 else { throw refuse(Self.errnoText()) }
        guard fstat(descriptor, &info) == 0, info.st_mode & 0o077 == 0 else {
            throw refuse("the file system did not keep the new mode")
        }
    }

    /// The path SQLite must report for a connection to this store: SQLite resolves every
    /// symbolic link of the path, so a connection that reports another name went through a
    /// link at the last component (one swapped in after the checks, say).
    var pathAsSQLiteNamesIt: String {
        let directory = Self.resolved(self.directory) ?? self.directory
        return (directory == "/" ? "" : directory) + "/" + (path as NSString).lastPathComponent
    }

    /// Throws unless `db` is a connection to this very store file: `O_NOFOLLOW` semantics for
    /// every connection SQLite opens, which GRDB does not let us ask SQLite for directly.
    func verifyConnection(_ db: Database, expected: String) throws(TokenStoreError) {
        guard let name = sqlite3_db_filename(db.sqliteConnection, "main").map({ String(cString: $0) }) else { return }
        guard name == expected else {
            throw .symbolicLink(path: path, file: path, target: name)
        }
    }

    /// Where a link points, resolved to an absolute path when possible.
    static func linkTarget(_ file: String) -> String {
        if let resolved = resolved(file) { return resolved }
        var buffer = [CChar](repeating: 0, count: Int(PATH_MAX) + 1)
        let count = readlink(file, &buffer, buffer.count - 1)
        guard count >= 0 else { return "an unreadable target" }
        return String(decoding: buffer[..<count].map { UInt8(bitPattern: $0) }, as: UTF8.self) + " (missing)"
    }

    /// `realpath(3)`: every link resolved; nil when the path or its target does not exist.
    static func resolved(_ path: String) -> String? {
        guard let pointer = realpath(path, nil) else { return nil }
        defer { free(pointer) }
        return String(cString: pointer)
    }

    static func isSymbolicLink(_ path: String) -> Bool {
        var info = stat()
        return lstat(path, &info) == 0 && info.st_mode & S_IFMT == S_IFLNK
    }
}
