// Service layer: each tracked subject's current token as a file, for programs that
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
            throw TokenFileSinkError(.directoryNotCreated, directory: directory,
                                     "cannot create the sink directory \(directory): \(error.localizedDescription); create it, or choose another directory")
        }
        guard access(directory, W_OK | X_OK) == 0 else {
            throw TokenFileSinkError(.directoryNotWritable, directory: directory,
                                     "cannot write in the sink directory \(directory): \(String(cString: strerror(errno))); give this user write access, or choose another directory")
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

/// A token sink problem at start, said for an operator: thrown by ``TokenFileSink/prepare()``.
///
/// Check ``code`` against the static values of ``Code`` (`error.code == .directoryNotWritable`).
public struct TokenFileSinkError: Error, Sendable, Equatable, CustomStringConvertible {
    /// What is wrong. More codes may come: match them with `==`, keep a `default`.
    public struct Code: Hashable, Sendable, CustomStringConvertible {
        fileprivate enum Value: String, Sendable { case directoryNotCreated, directoryNotWritable }

        fileprivate let value: Value

        /// The sink directory is missing and could not be created.
        public static let directoryNotCreated = Code(value: .directoryNotCreated)
        /// This user cannot write in the sink directory.
        public static let directoryNotWritable = Code(value: .directoryNotWritable)

        /// The code's name, e.g. `directoryNotWritable`.
        public var description: String { value.rawValue }
    }

    /// What is wrong.
    public let code: Code
    /// The sink directory.
    public let directory: String
    /// What is wrong and what to do.
    public let description: String

    init(_ code: Code, directory: String, _ description: String) {
        self.code = code
        self.directory = directory
        self.description = description
    }
}
