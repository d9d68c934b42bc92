// Storage layer: a new store is made whole under a private name and linked into place, so a
// power cut while it is made leaves no store or a complete one.

import Foundation
#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// The private file a new store is built in before it appears at its path:
/// `<store>.new-<pid>-<random>`, mode 0600, in the store's directory.
///
/// Until it is linked into place nobody opens it, so a power cut that tears its unsynced pages
/// leaves only this file behind (removed by the next opening once its process is gone), never a
/// store that the next start would find unreadable and quarantine.
struct StoreStaging {
    /// The store the staging file will become.
    let files: StoreFiles
    /// The staging file's path.
    let path: String

    /// Names a new staging file beside the store, and removes staging files that processes now
    /// gone left behind (a cut or a crash mid-creation).
    init(for files: StoreFiles) {
        self.files = files
        self.path = "\(files.path).new-\(getpid())-\(String(UInt32.random(in: .min ... .max), radix: 16))"
        Self.removeAbandoned(for: files)
    }

    /// Creates the empty staging file with mode 0600 (SQLite gives its side files the same).
    func create() throws(TokenStoreError) {
        let fd = open(path, O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC | O_NOFOLLOW, 0o600)
        guard fd >= 0 else {
            if errno == EACCES || errno == EROFS { throw .directoryNotWritable(path: files.path, reason: StoreFiles.errnoText()) }
            throw .sqlite(path: files.path, code: 14, message: "cannot create the new store file \(path): \(StoreFiles.errnoText())")
        }
        _ = fchmod(fd, 0o600)
        close(fd)
    }

    /// Throws unless the staging file's write-ahead log is gone or empty: frames left in it are
    /// commits the file alone lacks.
    func requireNoLog() throws(TokenStoreError) {
        var info = stat()
        guard stat(path + "-wal", &info) != 0 || info.st_size == 0 else {
            throw .sqlite(path: files.path, code: 10, message: "the new store's log could not be written into its file (\(info.st_size) bytes left in \(path)-wal); nothing was put in place")
        }
    }

    /// Makes the finished staging file the store: synced, then linked to the store's path (which
    /// fails when another process put its store there first: false), then the directory synced
    /// so the new name survives a power cut.
    func install() throws(TokenStoreError) -> Bool {
        try Self.sync(path, what: "the new store file")
        if link(path, files.path) != 0 {
            if errno == EEXIST { return false }
            // File systems without hard links: a rename, which cannot tell a concurrent creator's
            // store from none, so it is the fallback only.
            guard errno == EPERM || errno == ENOTSUP || errno == EOPNOTSUPP || errno == EMLINK else {
                throw .directoryNotWritable(path: files.path, reason: "cannot put the new store in place: \(StoreFiles.errnoText())")
            }
            if StoreFiles.exists(files.path) { return false }
            guard rename(path, files.path) == 0 else {
                throw .directoryNotWritable(path: files.path, reason: "cannot put the new store in place: \(StoreFiles.errnoText())")
            }
        }
        try Self.sync(files.directory, what: "the store's directory")
        return true
    }

    /// Removes the staging file and any side files SQLite left with it.
    func remove() {
        for suffix in ["", "-wal", "-shm", "-journal"] { unlink(path + suffix) }
    }

    private static func sync(_ path: String, what: String) throws(TokenStoreError) {
        let fd = open(path, O_RDONLY | O_CLOEXEC)
        guard fd >= 0, fsync(fd) == 0 else {
            let reason = StoreFiles.errnoText()
            if fd >= 0 { close(fd) }
            throw .sqlite(path: path, code: 10, message: "cannot sync \(what): \(reason)")
        }
        close(fd)
    }

    /// Staging files of this store whose process is gone (a process of another user counts as
    /// alive: its files are not ours to judge).
    private static func removeAbandoned(for files: StoreFiles) {
        let prefix = (files.path as NSString).lastPathComponent + ".new-"
        guard let names = try? FileManager.default.contentsOfDirectory(atPath: files.directory) else { return }
        for name in names where name.hasPrefix(prefix) {
            let rest = name.dropFirst(prefix.count)
            guard let pid = rest.split(separator: "-").first.flatMap({ pid_t($0) }), pid != getpid() else { continue }
            guard kill(pid, 0) != 0, errno == ESRCH else { continue }
            let side = ["-wal", "-shm", "-journal"].first { name.hasSuffix($0) }
            let base = side.map { String(name.dropLast($0.count)) } ?? name
            StoreStaging(files: files, path: files.directory + "/" + base).remove()
        }
    }

    private init(files: StoreFiles, path: String) {
        self.files = files
        self.path = path
    }
}
