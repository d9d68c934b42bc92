// Storage layer: file-system work around a store: its path, directory, modes and quarantine.

import Foundation
import Logging
#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// File-system work around a store: its path, directory, modes and quarantine. Token stores
/// hold credentials, so every file is 0600 and every directory the store creates is 0700.
/// Ownership, links and modes are judged in StoreFileSafety.swift.
struct StoreFiles: Sendable {
    /// The store file's absolute path: with `allowsSymlink`, the file a link there points to.
    let path: String

    init(path: String, allowsSymlink: Bool = false) {
        let given = URL(fileURLWithPath: path).standardizedFileURL.path
        if allowsSymlink, Self.isSymbolicLink(given), let target = Self.resolved(given) {
            self.path = target
        } else {
            self.path = given
        }
    }

    var directory: String { (path as NSString).deletingLastPathComponent }
    var walPath: String { path + "-wal" }
    /// Present when a check found damage the store could not act on at once (see
    /// ``IntegrityCheckTiming/whenNeeded``): the next open checks every page first.
    var checkMarkerPath: String { path + ".needs-check" }

    /// Whether the next open should check every page first: the write-ahead log holds frames
    /// (the last run did not close cleanly, or another process has the store open) or damage
    /// was marked.
    var fullCheckNeeded: Bool {
        var info = stat()
        let walHoldsFrames = stat(walPath, &info) == 0 && info.st_size > 0
        return walHoldsFrames || Self.exists(checkMarkerPath)
    }

    /// Marks the store for a full check at its next open. Best effort: a failure is logged by the caller.
    func markForCheck() -> Bool {
        let descriptor = open(checkMarkerPath, O_WRONLY | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0o600)
        guard descriptor >= 0 else { return false }
        close(descriptor)
        return true
    }

    /// Removes the mark once a full check has passed or the store was moved aside.
    func clearCheckMark() { unlink(checkMarkerPath) }
    var shmPath: String { path + "-shm" }

    static func exists(_ path: String) -> Bool {
        var info = stat()
        return stat(path, &info) == 0
    }

    /// Makes sure the directory exists (creating missing levels with mode 0700 when allowed) and
    /// is writable.
    func prepareDirectory(create: Bool) throws(TokenStoreError) {
        var missing: [String] = []
        var current = directory
        while !Self.exists(current), current != "/", !current.isEmpty {
            missing.append(current)
            current = (current as NSString).deletingLastPathComponent
        }
        if !missing.isEmpty {
            guard create else { throw .directoryMissing(path: path) }
            for dir in missing.reversed() {
                if mkdir(dir, 0o700) != 0 && errno != EEXIST {
                    throw .directoryNotWritable(path: path, reason: "cannot create \(dir): \(Self.errnoText())")
                }
                // mkdir honours the umask, which can only remove bits; set exactly 0700.
                _ = chmod(dir, 0o700)
            }
        }
        if access(directory, W_OK | X_OK) != 0 {
            throw .directoryNotWritable(path: path, reason: "\(directory): \(Self.errnoText())")
        }
    }

    /// Renames the store and its side files to `<name>.corrupt-<UTC time>` (side files keep
    /// their `-wal`/`-shm` suffix after it, so `sqlite3` opens the evidence as it was).
    /// Nothing is deleted. Returns the new path of the main file.
    func quarantine(now: Date = Date()) throws(TokenStoreError) -> String {
        var stamp = Self.compactUTCTimestamp(now)
        var target = "\(path).corrupt-\(stamp)"
        var attempt = 1
        while Self.exists(target) {
            attempt += 1
            stamp = Self.compactUTCTimestamp(now) + "-\(attempt)"
            target = "\(path).corrupt-\(stamp)"
        }
        for (source, destination) in [(walPath, target + "-wal"), (shmPath, target + "-shm"), (path, target)]
        where Self.exists(source) {
            if rename(source, destination) != 0 {
                throw .directoryNotWritable(path: path, reason: "cannot move corrupt \(source) aside: \(Self.errnoText())")
            }
        }
        clearCheckMark()
        return target
    }

    /// Size of the store file plus its write-ahead log.
    var sizeInBytes: Int64 {
        [path, walPath].reduce(0) { total, file in
            var info = stat()
            return stat(file, &info) == 0 ? total + Int64(info.st_size) : total
        }
    }

    /// `20261121T081600Z`: sortable, no characters a shell or file system minds.
    static func compactUTCTimestamp(_ date: Date) -> String {
        var seconds = time_t(date.timeIntervalSince1970.rounded(.down))
        var parts = tm()
        gmtime_r(&seconds, &parts)
        return String(format: "%04d%02d%02dT%02d%02d%02dZ", Int(parts.tm_year) + 1900, Int(parts.tm_mon) + 1,
                      Int(parts.tm_mday), Int(parts.tm_hour), Int(parts.tm_min), Int(parts.tm_sec))
    }

    static func errnoText() -> String { String(cString: strerror(errno)) }
}
