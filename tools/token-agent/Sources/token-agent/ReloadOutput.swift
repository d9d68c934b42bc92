// What a reload prints on stdout beside the engine's events: the subjects tracked and
// untracked, the options applied, and refusals (as lines, or JSON objects with --json).

import FleetTokenService
import TokenAgentRuntime
import FleetTokenStore
import Foundation

extension AgentOutput {
    /// One event per added and removed subject, then a summary: `tracked`/`untracked`/`reloaded`
    /// lines, or JSON objects `{"event":"tracked","kind":…,"id":…}` and
    /// `{"event":"subjects_reloaded","added":"1","removed":"1","subjects":"3"}`.
    /// The summary line only with a subjects file (without one, `config-reloaded` says it).
    /// The `tracked` and `untracked` lines are per-subject lines, within `--max-event-lines`.
    func printReload(_ change: SubjectListChange, subjects: Int, subjectsFile: Bool) {
        let now = Date()
        let stamp = now.formatted(.iso8601)
        for (event, keys) in [("tracked", change.added), ("untracked", change.removed)] where !keys.isEmpty {
            writeSubjectLines(event, count: keys.count, at: now) { allowed, block in
                for key in keys.prefix(allowed) {
                    block.append(json ? Self.encode(["event": event, "kind": key.kind.rawValue, "id": key.subjectID])
                                 : "\(stamp) \(event.padding(toLength: 9, withPad: " ", startingAt: 0)) \(key)\(event == "untracked" ? " (still served while in use)" : "")")
                }
            }
        }
        var lines: [String] = []
        if subjectsFile {
            lines.append(json
            ? Self.encode(["event": "subjects_reloaded", "added": String(change.added.count), "removed": String(change.removed.count),
                           "subjects": String(subjects)])
            : "\(stamp) reloaded  subjects file: \(change.added.count) added, \(change.removed.count) removed, \(subjects) tracked")
        }
        if !lines.isEmpty { writeLines(lines) }
    }

    /// `reload-failed` with the bad lines; JSON `{"event":"reload_failed","error":…,"lines":"3,7"}`.
    func printReloadFailed(path: String, message: String, lines: String, inForce: String) {
        writeLines([json
            ? Self.encode(["event": "reload_failed", "path": path, "error": message, "lines": lines])
            : "\(Date().formatted(.iso8601)) reload-failed \(message); \(inForce)"])
    }

    /// `config-reloaded` with the options applied and those waiting for a restart; JSON
    /// `{"event":"config_reloaded","changed":"log-level,vehicle","restart_needed":"db"}`.
    func printConfigReload(changed: [String], restartNeeded: [String]) {
        let changedText = changed.joined(separator: ",")
        let restartText = restartNeeded.joined(separator: ",")
        writeLines([json
            ? Self.encode(["event": "config_reloaded", "changed": changedText, "restart_needed": restartText])
            : "\(Date().formatted(.iso8601)) config-reloaded changed: \(changed.isEmpty ? "nothing" : changedText)"
                + (restartNeeded.isEmpty ? "" : "; needs a restart (old values kept): \(restartText)")])
    }
}
