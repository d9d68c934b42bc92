// Service layer: the file sink's bookkeeping. What TokenFileSink has written, which writes
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
    /// Keys whose last write or removal failed: retried at the next event.
    var failed: Set<TokenKey> = []

    init(sink: TokenFileSink) { self.sink = sink }

    /// Writes the held token of `key` if tracked and changed; removes its file if the key is
    /// untracked or holds no usable token.
    mutating func sync(_ key: TokenKey, tracked: Set<TokenKey>) async {
        let held = tracked.contains(key) ? sink.engine.heldToken(for: key)?.token : nil
        let path = sink.path(for: key)
        if let held {
            guard written[key] != held.fingerprint || failed.contains(key) else { return }
            let value = held.value, fileMode = sink.fileMode, directoryMode = sink.directoryMode
            let failure = await SinkFileIO.attempt { () throws(SinkFileIO.Failure) in
                try SinkFileIO.ensureDirectory((path as NSString).deletingLastPathComponent, mode: directoryMode)
                try SinkFileIO.replace(path, with: value, mode: fileMode)
            }
            guard settle(failure, of: "write", key: key, path: path) else { return }
            written[key] = held.fingerprint
            sink.logger.debug("token file written", metadata: ["key": "\(key)", "path": "\(path)", "fingerprint": "\(held.fingerprint)"])
        } else {
            let failure = await SinkFileIO.attempt { () throws(SinkFileIO.Failure) in try SinkFileIO.remove(path) }
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
        let removed = await SinkFileIO.perform { () -> [String] in
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
                    if stale, (try? SinkFileIO.remove("\(directory)/\(name)")) != nil { removed.append("\(kind.rawValue)/\(name)") }
                }
            }
            return removed
        }
        for file in removed { sink.logger.info("stale token file removed", metadata: ["file": "\(file)"]) }
    }
}
