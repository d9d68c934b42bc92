// Agent runtime: the file sink's bookkeeping. What TokenFileSink has written, which writes
// failed and are retried, and the work of keeping the files in line with the engine.

import FleetTokenStore
import Foundation
import Logging
#if canImport(Glibc)
import Glibc
#endif

/// What the sink has written, and the work of keeping the files in line with the engine.
struct SinkFiles {
    let sink: TokenFileSink
    /// The fingerprint of the token each file holds, as this sink last wrote it.
    var written: [TokenKey: TokenFingerprint] = [:]
    /// Keys whose last write or removal failed: retried at the writer's next pass (the next
    /// event of a tracked subject, a change of tracking, or the check).
    var failed: Set<TokenKey> = []
    /// Kind directories the last sweep for stale files skipped, with the reason (logged once).
    var unsweptDirectories: [TokenKind: String] = [:]

    init(sink: TokenFileSink) { self.sink = sink }

    /// Writes the held token of `key` if tracked and changed; removes its file if the key is
    /// untracked or holds no usable token.
    mutating func sync(_ key: TokenKey, tracked: Set<TokenKey>) async {
        let held = tracked.contains(key) ? sink.engine.heldToken(for: key)?.token : nil
        let path = sink.path(for: key)
        if let held {
            guard written[key] != held.fingerprint || failed.contains(key) else { return }
            let value = held.value, fileMode = sink.fileMode, directories = sink.directories
            let name = TokenFileSink.fileName(for: key.subjectID), kind = key.kind
            let failure = await SinkFileIO.attempt { () throws(SinkFileIO.Failure) in
                _ = try directories.withKind(kind, create: true) { (directory: Int32) throws(SinkFileIO.Failure) in
                    try SinkFileIO.replace(name, in: directory, path: path, with: value, mode: fileMode)
                }
            }
            guard settle(failure, of: "write", key: key, path: path) else { return }
            written[key] = held.fingerprint
            sink.logger.debug("token file written", metadata: ["key": "\(key)", "path": "\(path)", "fingerprint": "\(held.fingerprint)"])
        } else {
            let directories = sink.directories, name = TokenFileSink.fileName(for: key.subjectID), kind = key.kind
            let failure = await SinkFileIO.attempt { () throws(SinkFileIO.Failure) in
                // A missing kind directory holds no file to remove.
                _ = try directories.withKind(kind, create: false) { (directory: Int32) throws(SinkFileIO.Failure) in
                    try SinkFileIO.remove(name, in: directory, path: path)
                }
            }
            guard settle(failure, of: "remove", key: key, path: path), written.removeValue(forKey: key) != nil else { return }
            sink.logger.info("token file removed", metadata: ["key": "\(key)", "path": "\(path)",
                                                              "reason": tracked.contains(key) ? "no usable token" : "not tracked"])
        }
    }

    /// The failure bookkeeping of one write or removal: a failure is logged (never with the
    /// token) and marks the key for a retry at the next event; a success clears the mark.
    /// True on success.
    private mutating func settle(_ failure: SinkFileIO.Failure?, of operation: String, key: TokenKey, path: String) -> Bool {
        guard let failure else {
            failed.remove(key)
            return true
        }
        failed.insert(key)
        sink.logger.error("could not \(operation) a token file; retrying at the next event", metadata: [
            "key": "\(key)", "path": "\(path)", "error": "\(failure)",
        ])
        return false
    }

    /// Follows what changed, at a cost in proportion to it: syncs each key of `changed` once,
    /// retries failed keys, and only when `lookAtTracked` (a change of tracking has taken
    /// effect), removes the files of keys no longer tracked and writes those of newly tracked
    /// keys that hold a token.
    mutating func follow(_ changed: Set<TokenKey>, tracked: Set<TokenKey>, lookAtTracked: Bool) async {
        var keys = changed.union(failed)
        if lookAtTracked {
            keys.formUnion(written.keys.filter { !tracked.contains($0) })
            keys.formUnion(tracked.filter { written[$0] == nil && sink.engine.heldToken(for: $0) != nil })
        }
        for key in keys { await sync(key, tracked: tracked) }
    }

    /// Brings every file in line: each tracked key, the files of keys no longer tracked and
    /// failed keys, then deletes `*.jwt` files in the kind directories that belong to no tracked
    /// key (left by an earlier run, or missed). Only kind directories that pass the checks are
    /// swept, through their held descriptors; one that does not is logged once (until its
    /// problem changes) and left alone. The safety net under
    /// ``follow(_:tracked:lookAtTracked:)``: it costs a look at every tracked key, so it runs at
    /// start and every check interval, not per event.
    mutating func reconcile(tracked: Set<TokenKey>) async {
        for key in tracked.sorted() { await sync(key, tracked: tracked) }
        for key in Set(written.keys).subtracting(tracked).union(failed).subtracting(tracked) { await sync(key, tracked: tracked) }
        let expected = Dictionary(grouping: tracked, by: \.kind).mapValues { Set($0.map { Array(TokenFileSink.fileName(for: $0.subjectID).utf8) }) }
        let directories = sink.directories
        let swept = await SinkFileIO.perform { () -> [(TokenKind, Result<[String], SinkFileIO.Failure>)] in
            TokenKind.allCases.map { kind in
                do throws(SinkFileIO.Failure) {
                    let removed = try directories.withKind(kind, create: false) { directory in
                        SinkFileIO.removeStale(in: directory, keeping: expected[kind] ?? [])
                    }
                    return (kind, .success(removed ?? []))
                } catch {
                    return (kind, .failure(error))
                }
            }
        }
        for (kind, result) in swept {
            switch result {
            case .success(let removed):
                unsweptDirectories[kind] = nil
                for name in removed { sink.logger.info("stale token file removed", metadata: ["file": "\(kind.rawValue)/\(name)"]) }
            case .failure(let failure):
                guard unsweptDirectories.updateValue(failure.description, forKey: kind) != failure.description else { continue }
                sink.logger.warning("stale token files are not removed from a sink directory that fails its checks", metadata: [
                    "path": "\(directories.path(of: kind))", "error": "\(failure)",
                ])
            }
        }
    }
}
