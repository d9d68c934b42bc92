// Agent runtime: each tracked subject's current token as a file, for programs that
// read a file rather than call an API. Files are replaced atomically, never rewritten in place.

import Dispatch
package import FleetTokenStore
package import Foundation
package import Logging
import ServiceLifecycle
import Synchronization
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
/// - **When:** at start (tokens the store already holds), on every refresh event of a tracked
///   subject, when a change of tracking has taken effect (the engine's `trackingChanges()`), and
///   in a check every `checkInterval` (default 5 s) that also repairs missed or failed writes.
///   An event costs what changed (see ``run()``), not a walk of every subject, so a file
///   follows its token's refresh however many untracked subjects refresh beside it.
/// - **Removal:** the file of a subject that is no longer tracked, or whose token the engine no
///   longer holds usable (purged by `tokenctl purge`, or below the floor), is deleted. A purged
///   subject that is still tracked is fetched again at once, and its file comes back with the
///   new token. Other `*.jwt` files in the kind directories are deleted as stale; other files are
///   left alone.
/// - **Modes:** files `fileMode` (default 0640); directories it creates get the same bits plus
///   `x` wherever `r` is set (0640 gives 0750), whatever the umask.
/// - **Directories, checked then held:** the root and each kind directory are opened with
///   `O_NOFOLLOW | O_DIRECTORY`, checked, and held open; every write, rename and removal is made
///   relative to the held descriptor (`openat`, `renameat`, `unlinkat`, `fchmod` of the
///   temporary file), and directories it creates are made with `mkdirat` in their held parent.
///   One that is a symbolic link, belongs to another user than the effective uid (root
///   excepted), is writable by group or others, or is set-group-ID is refused: ``prepare()``
///   throws, and later writes to it fail (logged, retried). Stale files are swept only in
///   directories that pass. A kind directory whose name leads elsewhere later (moved, replaced)
///   is opened and checked again before use.
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
package struct TokenFileSink: Service, CustomStringConvertible {
    /// The sink's root directory.
    package let directory: String
    /// Mode of the token files.
    package let fileMode: mode_t
    let engine: TokenSyncEngine
    let checkInterval: Duration
    let logger: Logger
    /// The root and kind directories, checked, then held open.
    let directories: SinkDirectories

    /// A sink of `engine`'s tracked tokens under `directory`, with files of `fileMode`, checked
    /// every `checkInterval`.
    package init(engine: TokenSyncEngine, directory: String, fileMode: mode_t = 0o640,
                checkInterval: Duration = .seconds(5), logger: Logger) {
        self.engine = engine
        self.directory = directory
        self.fileMode = fileMode
        self.checkInterval = checkInterval
        self.logger = logger
        self.directories = SinkDirectories(root: directory, mode: Self.directoryMode(for: fileMode))
    }

    /// `TokenFileSink(DIRECTORY, mode 640)`, as service logs name it.
    package var description: String { "TokenFileSink(\(directory), mode \(String(fileMode, radix: 8)))" }

    /// Mode of the directories the sink creates: `fileMode` plus `x` wherever `r` is set, and
    /// always `rwx` for the owner.
    package var directoryMode: mode_t { Self.directoryMode(for: fileMode) }

    static func directoryMode(for fileMode: mode_t) -> mode_t {
        fileMode | (fileMode & 0o444) >> 2 | 0o700
    }

    /// The file name of a subject id: see the type's description.
    package static func fileName(for subjectID: String) -> String {
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
    package func path(for key: TokenKey) -> String {
        "\(directory)/\(key.kind.rawValue)/\(Self.fileName(for: key.subjectID))"
    }

    /// Opens the directory, creating it (and missing parents) with ``directoryMode`` if it is
    /// missing, checks it and every kind directory in it that exists, and holds them open: a
    /// wrong or unsafe `--sink` fails at start, and no later write or removal can be sent
    /// elsewhere by a symlink or a swapped directory.
    ///
    /// Refused: a sink or kind directory that is a symbolic link or not a directory, that
    /// belongs to a user other than this process's effective uid and root, that group or others
    /// may write in, or that is set-group-ID; a sink directory this user cannot write in. Kind
    /// directories missing now are created (``directoryMode``) and checked when first needed.
    /// Without this call the directories are opened and checked at the first write, and a
    /// refusal is logged and retried as a write error is.
    /// - Throws: ``TokenFileSinkError``, naming the directory at fault and the fix.
    package func prepare() throws(TokenFileSinkError) {
        try directories.prepare()
    }

    /// What ``prepare()`` would refuse at `directory`, judged without creating, changing or
    /// holding anything: the directories above it, and it and its kind directories where they
    /// exist (`token-agent --check-config`). One missing now is created at start.
    /// - Throws: ``TokenFileSinkError``, as ``prepare()`` throws it.
    package static func inspect(directory: String) throws(TokenFileSinkError) {
        try SinkDirectories(root: directory, mode: 0o700).inspect()
    }

    /// Writes the tokens held now, then follows the engine's events and the periodic check until
    /// graceful shutdown or cancellation.
    ///
    /// Each event costs what it is about: one reader takes the engine's events as they come and
    /// drops those about untracked subjects (a lock and a hash lookup: pattern-allowed subjects
    /// refreshed on demand never reach the writer); the one writer drains everything pending at
    /// once and syncs each distinct key once, and looks through the tracked keys only when a
    /// change of tracking has taken effect (the engine's `trackingChanges()`, after a reload: its
    /// files follow at once). So a burst never queues up behind itself, and a file follows its
    /// token's refresh within one pass of the writer. The check every `checkInterval` brings
    /// every file in line, whatever an event missed.
    package func run() async {
        // Subscribed before the first pass, so nothing that happens in between is missed.
        let events = engine.events()
        let trackingChanges = engine.trackingChanges()
        let inbox = SinkInbox()
        let interval = checkInterval
        let engine = self.engine
        await cancelWhenGracefulShutdown {
            await withDiscardingTaskGroup { group in
                group.addTask {
                    for await event in events {
                        if let key = event.key {
                            if engine.isTracked(key) { inbox.changed(key) }
                        } else {
                            // The store degraded or recovered: a moment to retry failed writes.
                            inbox.wake()
                        }
                    }
                }
                // A tracking change that has taken effect (a reload): the writer looks at the
                // tracked keys at once. A key tracked with a token already stored brings no
                // event, and a file of a key no longer tracked has no event to remove it. The
                // only way the writer looks at the tracked keys between checks.
                group.addTask {
                    for await _ in trackingChanges { inbox.trackingChanged() }
                }
                group.addTask {
                    while (try? await Task.sleep(for: interval)) != nil { inbox.check() }
                }
                // One writer: writes and removals never run concurrently.
                var files = SinkFiles(sink: self)
                await files.reconcile(tracked: engine.tracked.keys)
                for await _ in inbox.bell {
                    let work = inbox.take()
                    if work.check {
                        await files.reconcile(tracked: engine.tracked.keys)
                    } else {
                        await files.follow(work.keys, tracked: engine.tracked.keys, lookAtTracked: work.tracking)
                    }
                }
                group.cancelAll()
            }
        }
    }
}

/// What the sink's writer has yet to do: the keys whose tokens changed and whether the periodic
/// check is due, filled by the event reader and the timer, taken whole by the writer. Adding
/// is a lock and a set insertion, so the reader never falls behind the engine; a key changed
/// many times before the writer looks is synced once.
final class SinkInbox: Sendable {
    struct Work: Sendable {
        var keys: Set<TokenKey> = []
        var check = false
        /// Tracking changed: look at every tracked key.
        var tracking = false
    }

    private let pending = Mutex(Work())
    private let ring: AsyncStream<Void>.Continuation
    /// Rings when work is pending; rings pending while the writer is busy collapse into one.
    let bell: AsyncStream<Void>

    init() {
        (bell, ring) = AsyncStream<Void>.makeStream(bufferingPolicy: .bufferingNewest(1))
    }

    /// The token of `key` (tracked) changed or went away.
    func changed(_ key: TokenKey) {
        pending.withLock { _ = $0.keys.insert(key) }
        ring.yield()
    }

    /// Wakes the writer with nothing new: it retries failed writes on every pass.
    func wake() { ring.yield() }

    /// A change of the tracked keys has taken effect.
    func trackingChanged() {
        pending.withLock { $0.tracking = true }
        ring.yield()
    }

    /// The periodic check is due.
    func check() {
        pending.withLock { $0.check = true }
        ring.yield()
    }

    /// Everything pending, leaving nothing.
    func take() -> Work {
        pending.withLock { work in
            defer { work = Work() }
            return work
        }
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
