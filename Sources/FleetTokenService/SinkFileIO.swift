// Service layer: the file sink's blocking file operations: atomic replacement, removal and
// directory creation, each followed by the `fsync`s that make it survive a crash.

import Dispatch
import Foundation
#if canImport(Glibc)
import Glibc
#endif

/// Blocking file operations, run on one serial queue off the cooperative thread pool (an
/// `fsync` can take milliseconds; the engine's tasks should not wait behind it).
enum SinkFileIO {
    /// A failed system call, without any file content.
    struct Failure: Error, CustomStringConvertible {
        let operation: String
        let path: String
        let code: Int32
        var description: String { "\(operation) \(path): \(String(cString: strerror(code)))" }
    }

    private static let queue = DispatchQueue(label: "FleetTokenService.TokenFileSink")

    /// Runs `body` on the I/O queue; returns its failure, if any.
    static func attempt(_ body: @escaping @Sendable () throws(Failure) -> Void) async -> Failure? {
        await perform { () -> Failure? in
            do throws(Failure) { try body(); return nil } catch { return error }
        }
    }

    /// Runs `body` on the I/O queue.
    static func perform<T: Sendable>(_ body: @escaping @Sendable () -> T) async -> T {
        await withCheckedContinuation { continuation in queue.async { continuation.resume(returning: body()) } }
    }

    /// Creates `path` with `mode` unless it exists as a directory.
    static func ensureDirectory(_ path: String, mode: mode_t) throws(Failure) {
        if mkdir(path, mode) == 0 {
            chmod(path, mode) // the umask may have cleared bits
            return
        }
        let code = errno
        var info = stat()
        guard code == EEXIST, stat(path, &info) == 0 else { throw Failure(operation: "create directory", path: path, code: code) }
        guard info.st_mode & S_IFMT == S_IFDIR else { throw Failure(operation: "use directory", path: path, code: ENOTDIR) }
    }

    /// Replaces `path` with `contents` atomically: temporary file, `fsync`, `rename`, `fsync` of
    /// the directory.
    static func replace(_ path: String, with contents: String, mode: mode_t) throws(Failure) {
        let directory = (path as NSString).deletingLastPathComponent
        let temporary = "\(directory)/.token-sink-\(String(UInt64.random(in: 0...UInt64.max), radix: 36)).tmp"
        let descriptor = open(temporary, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, mode)
        guard descriptor >= 0 else { throw Failure(operation: "create", path: temporary, code: errno) }
        var closed = false
        var renamed = false
        defer {
            if !closed { close(descriptor) }
            if !renamed { unlink(temporary) }
        }
        guard fchmod(descriptor, mode) == 0 else { throw Failure(operation: "chmod", path: temporary, code: errno) }
        var bytes = Array(contents.utf8)[...]
        while !bytes.isEmpty {
            let count = bytes.withUnsafeBytes { write(descriptor, $0.baseAddress, $0.count) }
            if count < 0 {
                if errno == EINTR { continue }
                throw Failure(operation: "write", path: temporary, code: errno)
            }
            bytes = bytes.dropFirst(count)
        }
        guard fsync(descriptor) == 0 else { throw Failure(operation: "fsync", path: temporary, code: errno) }
        closed = true
        guard close(descriptor) == 0 else { throw Failure(operation: "close", path: temporary, code: errno) }
        guard rename(temporary, path) == 0 else { throw Failure(operation: "rename to", path: path, code: errno) }
        renamed = true
        try syncDirectory(directory)
    }

    /// Removes `path` (a missing file is fine) and `fsync`s its directory.
    static func remove(_ path: String) throws(Failure) {
        if unlink(path) == 0 {
            try syncDirectory((path as NSString).deletingLastPathComponent)
        } else if errno != ENOENT {
            throw Failure(operation: "remove", path: path, code: errno)
        }
    }

    private static func syncDirectory(_ directory: String) throws(Failure) {
        let descriptor = open(directory, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        guard descriptor >= 0 else { throw Failure(operation: "open directory", path: directory, code: errno) }
        defer { close(descriptor) }
        guard fsync(descriptor) == 0 else { throw Failure(operation: "fsync directory", path: directory, code: errno) }
    }
}
