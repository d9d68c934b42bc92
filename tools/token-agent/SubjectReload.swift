import FleetTokenService
import FleetTokenStore
import Foundation
import Logging
import ServiceLifecycle
import UnixSignals

/// SIGHUP re-reads `--subjects-file`: added subjects are tracked, removed ones untracked (the
/// engine keeps serving them while they are used; the idle rule evicts them later); subjects
/// given by flags always stay. A file that cannot be used is reported with its line numbers
/// and the list in force stays.
///
/// Runs in the service group after the engine, so it is stopped first on graceful shutdown
/// (it ends by itself then) and never tracks into a stopped engine.
struct SubjectReloadService: Service {
    /// Trapped before the engine starts, so that an early SIGHUP never kills the agent.
    let hangups: UnixSignalsSequence
    var reloader: SubjectReloader

    /// Traps SIGHUP now (from here on it no longer ends the process) for a service run later.
    static func trappingHangups(_ reloader: SubjectReloader) async -> SubjectReloadService {
        SubjectReloadService(hangups: await UnixSignalsSequence(trapping: .sighup), reloader: reloader)
    }

    func run() async {
        let (start, hangups) = (reloader, self.hangups)
        await cancelWhenGracefulShutdown {
            var reloader = start
            for await _ in hangups { await reloader.reload() }
        }
    }
}

/// The subject list in force and how to change it. Used by one loop, so plain state.
struct SubjectReloader: Sendable {
    let engine: TokenSyncEngine
    /// The `--subjects-file`, if given.
    let path: String?
    /// Subjects given by flags: never untracked by a reload.
    let fixed: Set<TokenKey>
    /// The file's subjects in force.
    var current: [TokenKey]
    let output: AgentOutput
    let logger: Logger
    /// The local token API, whose allowed and readiness subjects follow the reloaded list.
    var api: TokenAPI?

    /// Keys named in one log line at most; the counts are always complete.
    static let keysLogged = 100

    mutating func reload() async {
        guard let path else {
            logger.notice("SIGHUP received: there is nothing to reload (no --subjects-file given); the agent goes on")
            return
        }
        let list: SubjectListFile
        do {
            list = try SubjectListFile(contentsOfFile: path)
        } catch {
            logger.error("SIGHUP: the subjects file cannot be used; the previous subject list stays in force", metadata: [
                "path": "\(path)", "lines": "\(error.lines.map(String.init).joined(separator: ","))", "error": "\(error)",
            ])
            output.printReloadFailed(path: path, error: error)
            return
        }
        let change = SubjectListChange(from: current, to: list.subjects, keeping: fixed)
        await engine.track(change.added)
        await engine.untrack(change.removed)
        current = list.subjects
        api?.replaceSubjects(fixed.union(current).sorted())
        let tracked = fixed.union(current).count
        logger.notice("SIGHUP: subjects file reloaded", metadata: [
            "path": "\(path)", "added": "\(change.added.count)", "removed": "\(change.removed.count)",
            "subjects": "\(tracked)",
            "added_keys": "\(Self.summary(change.added))", "removed_keys": "\(Self.summary(change.removed))",
        ])
        output.printReload(change, subjects: tracked)
        // As at start: what the store already held for a new subject is reported here (no fetch
        // was needed); fetched tokens are reported by refresh events.
        for key in change.added {
            if let held = engine.heldToken(for: key), held.source == .store {
                output.print(.refreshed(key: key, fingerprint: held.token.fingerprint, expiresAt: held.token.expiresAt, source: .store))
            }
        }
    }

    /// `vehicle/a,trip/b`, the first ``keysLogged`` keys and how many more.
    static func summary(_ keys: [TokenKey]) -> String {
        let shown = keys.prefix(keysLogged).map(\.description).joined(separator: ",")
        return keys.count > keysLogged ? "\(shown) and \(keys.count - keysLogged) more" : shown
    }
}

extension AgentOutput {
    /// One event per added and removed subject, then a summary: `tracked`/`untracked`/`reloaded`
    /// lines, or JSON objects `{"event":"tracked","kind":…,"id":…}` and
    /// `{"event":"subjects_reloaded","added":"1","removed":"1","subjects":"3"}`.
    func printReload(_ change: SubjectListChange, subjects: Int) {
        let now = Date()
        let stamp = now.formatted(.iso8601)
        var lines: [String] = []
        for (event, keys) in [("tracked", change.added), ("untracked", change.removed)] {
            for key in keys {
                lines.append(json ? Self.encode(["event": event, "kind": key.kind.rawValue, "id": key.subjectID])
                             : "\(stamp) \(event.padding(toLength: 9, withPad: " ", startingAt: 0)) \(key)\(event == "untracked" ? " (still served while in use)" : "")")
            }
        }
        lines.append(json
            ? Self.encode(["event": "subjects_reloaded", "added": String(change.added.count), "removed": String(change.removed.count),
                           "subjects": String(subjects)])
            : "\(stamp) reloaded  subjects file: \(change.added.count) added, \(change.removed.count) removed, \(subjects) tracked")
        write(lines)
    }

    /// `reload-failed` with the bad lines; JSON `{"event":"reload_failed","error":…,"lines":"3,7"}`.
    func printReloadFailed(path: String, error: SubjectListFileError) {
        let lines = error.lines.map(String.init).joined(separator: ",")
        write([json
            ? Self.encode(["event": "reload_failed", "path": path, "error": error.description, "lines": lines])
            : "\(Date().formatted(.iso8601)) reload-failed \(error); the previous subject list stays in force"])
    }

    /// One write for the lines (the event printer writes a line at a time beside it).
    private func write(_ lines: [String]) {
        FileHandle.standardOutput.write(Data(lines.map { $0 + "\n" }.joined().utf8))
    }
}
