// Agent runtime: the file sink's blocking file operations: atomic replacement, removal and the
// stale-file sweep, each relative to a held directory descriptor (SinkDirectories) and followed
// by the `fsync`s that make it survive a crash.

import Dispatch
import Foundation
#if canImport(Glibc)
import Glibc
#endif

/// Blocking file operations, run on one serial queue off the cooperative thread pool (an
/// `fsync` can take milliseconds; the engine's tasks should not wait behind it). Every one works
/// inside a directory given by a held descriptor, never by a path.
enum SinkFileIO {
    /// A failed file operation, without any file content.
    struct Failure: Error, CustomStringConvertible {
        let description: String

        /// A failed system call on `path`.
        init(operation: String, path: String, code: Int32) {
            description = "\(operation) \(path): \(String(cString: strerror(code)))"
        }

        /// A directory that is unsafe, or could not be opened.
        init(_ error: TokenFileSinkError) { description = error.description }
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

    /// Replaces `name` in the directory `directory` with `contents` atomically: temporary file,
    /// `fchmod`, `fsync`, `renameat`, `fsync` of the directory. `path` names it in errors.
    static func replace(_ name: String, in directory: Int32, path: String, with contents: String, mode: mode_t) throws(Failure) {
        let temporary = ".token-sink-\(String(UInt64.random(in: 0...UInt64.max), radix: 36)).tmp"
        let shown = ((path as NSString).deletingLastPathComponent as NSString).appendingPathComponent(temporary)
        let descriptor = openat(directory, temporary, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, mode)
        guard descriptor >= 0 else { throw Failure(operation: "create", path: shown, code: errno) }
        var closed = false
        var renamed = false
        defer {
            if !closed { close(descriptor) }
            if !renamed { unlinkat(directory, temporary, 0) }
        }
        guard fchmod(descriptor, mode) == 0 else { throw Failure(operation: "chmod", path: shown, code: errno) }
        var bytes = Array(contents.utf8)[...]
        while !bytes.isEmpty {
            let count = bytes.withUnsafeBytes { write(descriptor, $0.baseAddress, $0.count) }
            if count < 0 {
                if errno == EINTR { continue }
                throw Failure(operation: "write", path: shown, code: errno)
            }
            bytes = bytes.dropFirst(count)
        }
        guard fsync(descriptor) == 0 else { throw Failure(operation: "fsync", path: shown, code: errno) }
        closed = true
        guard close(descriptor) == 0 else { throw Failure(operation: "close", path: shown, code: errno) }
        guard renameat(directory, temporary, directory, name) == 0 else { throw Failure(operation: "rename to", path: path, code: errno) }
        renamed = true
        guard fsync(directory) == 0 else { throw Failure(operation: "fsync directory of", path: path, code: errno) }
    }

    /// Removes `name` from the directory `directory` (a missing file is fine) and `fsync`s the
    /// directory. `path` names it in errors.
    static func remove(_ name: String, in directory: Int32, path: String) throws(Failure) {
        if unlinkat(directory, name, 0) == 0 {
            guard fsync(directory) == 0 else { throw Failure(operation: "fsync directory of", path: path, code: errno) }
        } else if errno != ENOENT {
            throw Failure(operation: "remove", path: path, code: errno)
        }
    }

    /// Deletes the stale files of the directory `directory`: `*.jwt` files (not hidden) whose
    /// UTF-8 name is not in `keeping`, and temporary files of a crashed write (over a minute
    /// old). Returns the names removed.
    static func removeStale(in directory: Int32, keeping: Set<[UInt8]>) -> [String] {
        // A descriptor of its own ("." of the held one): its own read position.
        let listing = openat(directory, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        guard listing >= 0, let stream = fdopendir(listing) else {
            if listing >= 0 { close(listing) }
            return []
        }
        defer { closedir(stream) }
        var removed: [String] = []
        while let entry = readdir(stream) {
            let name: [UInt8] = withUnsafeBytes(of: entry.pointee.d_name) { Array($0.prefix { $0 != 0 }) }
            let text = String(decoding: name, as: UTF8.self)
            let stale: Bool
            if name.starts(with: Array(".token-sink-".utf8)) && name.reversed().starts(with: Array(".tmp".utf8).reversed()) {
                // A temporary file of a write that crashed (a minute old: not one in progress).
                var info = stat()
                stale = fstatat(directory, name.cString, &info, AT_SYMLINK_NOFOLLOW) == 0 && time(nil) - info.st_mtim.tv_sec > 60
            } else {
                stale = name.reversed().starts(with: Array(".jwt".utf8).reversed()) && name.first != UInt8(ascii: ".") && !keeping.contains(name)
            }
            if stale && unlinkat(directory, name.cString, 0) == 0 { removed.append(text) }
        }
        if !removed.isEmpty { fsync(directory) }
        return removed
    }
}

extension Array where Element == UInt8 {
    /// The bytes as a NUL-terminated C string.
    fileprivate var cString: [CChar] { map { CChar(bitPattern: $0) } + [0] }
}
