// Token service, file layer: each tracked subject's current token as a file, for programs that
// read a file rather than call an API. Files are replaced atomically, never rewritten in place.

import Dispatch
public import FleetTokenStore
public import Foundation
public import Logging
public import ServiceLifecycle
#if canImport(Glibc)
import Glibc
#endif

/// Keeps `DIRECTORY/{kind}/{name}.jwt` holding the current token of every subject the engine
/// tracks, for programs that read a file (`token-agent --sink DIR`). Add it to the
/// `ServiceGroup` after the engine; it ends on graceful shutdown by itself.
///
/// - **Content:** the bare token (a JWT), no trailing newline.
/// - **Atomicity:** a new token is written to a hidden temporary file (`.token-sink-….tmp`) in the
///   same directory, `fsync`ed, renamed over the old file, and the directory is `fsync`ed; a
///   reader sees the old file or the new one, never a partial one.
/// - **When:** at start (tokens the store already holds), on every refresh event, and in a check
///   every `checkInterval` (default 5 s) that also repairs missed or failed writes.
/// - **Removal:** the file of a subject that is no longer tracked, or whose token the engine no
///   longer holds usable (purged by `tokenctl purge`, or below the floor), is deleted. A purged
///   subject that is still tracked is fetched again at once, and its file comes back with the
///   new token. Other `*.jwt` files in the kind directories are deleted as stale; other files are
///   left alone.
/// - **Modes:** files `fileMode` (default 0640); directories it creates get the same bits plus
///   `x` wherever `r` is set (0640 gives 0750).
/// - **File names** (``fileName(for:)``): the id's UTF-8 text with `/` written `%2F`, `%` written
///   `%25` and a leading `.` written `%2E`; everything else (spaces, quotes, Unicode) is kept. So
///   `truck-7` is `truck-7.jwt` and `fleet/a b` is `fleet%2Fa b.jwt`. Percent-decoding gives the
///   id back, so distinct ids get distinct names; no name is hidden, `.` or `..`. A name that
///   would exceed 255 bytes is cut to at most 237 bytes (on a character boundary) followed by
///   `%%` and 12 hex digits of the id's SHA-256: `%%` never occurs in a short name, and two long
///   ids meet only if prefix and 48-bit hash both match.
///
/// Write errors are logged (with the key and path, never the token) and retried at the next
/// event or check; they never stop the service.
public struct TokenFileSink: Service, CustomStringConvertible {
    /// The sink's root directory.
    public let directory: String
    /// Mode of the token files.
    public let fileMode: mode_t
    let engine: TokenSyncEngine
    let checkInterval: Duration
    let logger: Logger

    /// A sink of `engine`'s tracked tokens under `directory`, with files of `fileMode`, checked
    /// every `checkInterval`.
    public init(engine: TokenSyncEngine, directory: String, fileMode: mode_t = 0o640,
                checkInterval: Duration = .seconds(5), logger: Logger) {
        self.engine = engine
        self.directory = directory
        self.fileMode = fileMode
        self.checkInterval = checkInterval
        self.logger = logger
    }

    /// `TokenFileSink(DIRECTORY, mode 640)`, as service logs name it.
    public var description: String { "TokenFileSink(\(directory), mode \(String(fileMode, radix: 8)))" }

    /// Mode of the directories the sink creates: `fileMode` plus `x` wherever `r` is set, and
    /// always `rwx` for the owner.
    public var directoryMode: mode_t {
        fileMode | (fileMode & 0o444) >> 2 | 0o700
    }

    /// The file name of a subject id: see the type's description.
    public static func fileName(for subjectID: String) -> String {
        var units: [String] = []
        for (index, scalar) in subjectID.unicodeScalars.enumerated() {
            switch scalar {
            case "/": units.append("%2F")
            case "%": units.append("%25")
            case "." where index == 0: units.append("%2E")
            default: units.append(String(scalar))
            }
        }
        let encoded = units.joined()
        if encoded.utf8.count + 4 <= 255 { return encoded + ".jwt" }
        var prefix = ""
        for unit in units {
            guard prefix.utf8.count + unit.utf8.count <= 237 else { break }
            prefix += unit
        }
        return prefix + "%%" + TokenFingerprint(of: subjectID).description + ".jwt"
    }

    /// Where the token of `key` is kept: `directory/{kind}/{fileName}`.
    public func path(for key: TokenKey) -> String {
        "\(directory)/\(key.kind.rawValue)/\(Self.fileName(for: key.subjectID))"
    }

    /// Creates the directory (with ``directoryMode``) if it is missing and checks that it can be
    /// written, so a wrong `--sink` fails at start.
    /// - Throws: ``TokenFileSinkError``.
    public func prepare() throws(TokenFileSinkError) {
        do {
            try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true,
                                                    attributes: [.posixPermissions: Int(directoryMode)])
        } catch {
            throw TokenFileSinkError("cannot create the sink directory \(directory): \(error.localizedDescription); create it, or choose another --sink")
        }
        guard access(directory, W_OK | X_OK) == 0 else {
            throw TokenFileSinkError("cannot write in the sink directory \(directory): \(String(cString: strerror(errno))); give this user write access, or choose another --sink")
        }
    }

    private enum Work: Sendable {
        case event(TokenSyncEvent)
        case check
    }

    /// Writes the tokens held now, then follows the engine's events and the periodic check until
    /// graceful shutdown or cancellation.
    public func run() async {
        // Subscribed before the first pass, so nothing that happens in between is missed.
        let events = engine.events()
        let (work, feed) = AsyncStream<Work>.makeStream(bufferingPolicy: .bufferingNewest(10_000))
        let interval = checkInterval
        await cancelWhenGracefulShutdown {
            await withDiscardingTaskGroup { group in
                group.addTask { for await event in events { feed.yield(.event(event)) } }
                group.addTask {
                    while (try? await Task.sleep(for: interval)) != nil { feed.yield(.check) }
                }
                // One consumer: writes and removals happen in event order, never concurrently.
                var files = SinkFiles(sink: self)
                await files.reconcile(tracked: await self.trackedKeys())
                for await item in work {
                    switch item {
                    case .check:
                        await files.reconcile(tracked: await self.trackedKeys())
                    case .event(let event):
                        let tracked = await self.trackedKeys()
                        if let key = event.key { await files.sync(key, tracked: tracked) }
                        await files.dropUntrackedAndRetry(tracked: tracked, except: event.key.map { [$0] } ?? [])
                    }
                }
                group.cancelAll()
            }
        }
    }

    func trackedKeys() async -> Set<TokenKey> {
        Set(await engine.subjects().lazy.filter(\.tracked).map(\.key))
    }
}

extension TokenSyncEvent {
    /// The key an event is about, if any.
    fileprivate var key: TokenKey? {
        switch self {
        case .refreshed(let key, _, _, _), .removedExternally(let key), .refreshFailed(let key, _, _, _): key
        case .storeDegraded, .storeRecovered: nil
        }
    }
}

/// A token sink problem at start, said for an operator.
public struct TokenFileSinkError: Error, Sendable, Equatable, CustomStringConvertible {
    /// What is wrong and what to do.
    public let description: String
    init(_ description: String) { self.description = description }
}

/// What the sink has written, and the work of keeping the files in line with the engine.
struct SinkFiles {
    let sink: TokenFileSink
    /// The fingerprint of the token each file holds, as this sink last wrote it.
    var written: [TokenKey: TokenFingerprint] = [:]
    /// Keys whose last write or removal failed: retried at the next event.
    var failed: Set<TokenKey> = []

    init(sink: TokenFileSink) { self.sink = sink }

    /// Writes the held token of `key` if tracked and changed; removes its file if the key is
    /// untracked or holds no usable token.
    mutating func sync(_ key: TokenKey, tracked: Set<TokenKey>) async {
        let held = tracked.contains(key) ? sink.engine.heldToken(for: key)?.token : nil
        let path = sink.path(for: key)
        let logger = sink.logger
        if let held {
            guard written[key] != held.fingerprint || failed.contains(key) else { return }
            let value = held.value, fileMode = sink.fileMode, directoryMode = sink.directoryMode
            let result = await FileIO.attempt { () throws(FileIO.Failure) in
                try FileIO.ensureDirectory((path as NSString).deletingLastPathComponent, mode: directoryMode)
                try FileIO.replace(path, with: value, mode: fileMode)
            }
            if let failure = result {
                failed.insert(key)
                logger.error("could not write a token file; retrying at the next event", metadata: [
                    "key": "\(key)", "path": "\(path)", "error": "\(failure)",
                ])
            } else {
                failed.remove(key)
                written[key] = held.fingerprint
                logger.debug("token file written", metadata: ["key": "\(key)", "path": "\(path)", "fingerprint": "\(held.fingerprint)"])
            }
        } else {
            let result = await FileIO.attempt { () throws(FileIO.Failure) in try FileIO.remove(path) }
            if let failure = result {
                failed.insert(key)
                logger.error("could not remove a token file; retrying at the next event", metadata: [
                    "key": "\(key)", "path": "\(path)", "error": "\(failure)",
                ])
            } else {
                failed.remove(key)
                if written.removeValue(forKey: key) != nil {
                    logger.info("token file removed", metadata: ["key": "\(key)", "path": "\(path)",
                                                                 "reason": tracked.contains(key) ? "no usable token" : "not tracked"])
                }
            }
        }
    }

    /// Removes the files written for keys no longer tracked, and retries failed keys, except
    /// those just synced.
    mutating func dropUntrackedAndRetry(tracked: Set<TokenKey>, except synced: Set<TokenKey>) async {
        for key in Set(written.keys).subtracting(tracked).union(failed).subtracting(synced) { await sync(key, tracked: tracked) }
    }

    /// Brings every file in line: each tracked key, then deletes `*.jwt` files in the kind
    /// directories that belong to no tracked key (left by an earlier run, or missed).
    mutating func reconcile(tracked: Set<TokenKey>) async {
        for key in tracked.sorted() { await sync(key, tracked: tracked) }
        await dropUntrackedAndRetry(tracked: tracked, except: tracked)
        let root = sink.directory
        let expected = Dictionary(grouping: tracked, by: \.kind).mapValues { Set($0.map { Array(TokenFileSink.fileName(for: $0.subjectID).utf8) }) }
        let removed = await FileIO.perform { () -> [String] in
            var removed: [String] = []
            for kind in TokenKind.allCases {
                let directory = "\(root)/\(kind.rawValue)"
                guard let names = try? FileManager.default.contentsOfDirectory(atPath: directory) else { continue }
                for name in names {
                    let stale: Bool
                    if name.hasPrefix(".token-sink-") && name.hasSuffix(".tmp") {
                        // A temporary file of a write that crashed (a minute old: not one in progress).
                        var info = stat()
                        stale = stat("\(directory)/\(name)", &info) == 0 && time(nil) - info.st_mtim.tv_sec > 60
                    } else {
                        stale = name.hasSuffix(".jwt") && !name.hasPrefix(".") && expected[kind]?.contains(Array(name.utf8)) != true
                    }
                    if stale, (try? FileIO.remove("\(directory)/\(name)")) != nil { removed.append("\(kind.rawValue)/\(name)") }
                }
            }
            return removed
        }
        for file in removed { sink.logger.info("stale token file removed", metadata: ["file": "\(file)"]) }
    }
}

/// Blocking file operations, run on one serial queue off the cooperative thread pool (an
/// `fsync` can take milliseconds; the engine's tasks should not wait behind it).
enum FileIO {
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
