// tokenctl beside an installed agent: the store and the encryption key files come from the
// agent's own settings when tokenctl is not given them, so `tokenctl --config
// /etc/token-agent/token-agent.yaml list` (or TOKEN_AGENT_CONFIG) finds the agent's store. The
// precedence is the agent's (README "Config file and environment"): flags, then variables, then
// the config file, then the default.

import FleetTokenStore
import Foundation
import Yams

/// The two settings tokenctl takes from the agent's config file: `db` and `encryption-key-file`
/// (the agent's keys). The agent checks the rest of the file; tokenctl ignores it.
struct AgentConfigDefaults: Equatable, Sendable {
    let path: String
    let db: String?
    let encryptionKeyFiles: [String]

    /// The variable naming the agent's config file, as for the agent.
    static let fileVariable = "TOKEN_AGENT_CONFIG"

    /// Reads `path` with the agent's rule for its config file (refused when another user could
    /// have written it) and takes the two keys.
    /// - Throws: ``AgentConfigError`` naming the file (and line) and what to do.
    static func load(_ path: String) throws(AgentConfigError) -> AgentConfigDefaults {
        let data: Data
        do { data = try SteeringFileCheck.read(path: path, role: "agent config file") } catch {
            let hint = error.code == .missing ? ": give the agent's config file (--config, or TOKEN_AGENT_CONFIG), or --db" : ""
            throw AgentConfigError(path: path, line: nil, message: error.reason + hint)
        }
        let text = String(decoding: data, as: UTF8.self)
        let root: Node?
        do { root = try Yams.compose(yaml: text) } catch {
            // Not the parser's text: it may quote the line at fault, which may hold a credential.
            throw AgentConfigError(path: path, line: nil, message: "is not valid YAML or JSON (`token-agent --config \(path) --check-config` says where)")
        }
        guard let root else { return AgentConfigDefaults(path: path, db: nil, encryptionKeyFiles: []) }
        guard case .mapping(let mapping) = root else {
            throw AgentConfigError(path: path, line: root.mark?.line, message: "must be a mapping of option names to values")
        }
        var db: String?
        var keyFiles: [String] = []
        for (key, value) in mapping {
            switch (key.string, value) {
            case ("db", .scalar(let scalar)):
                db = scalar.string
            case ("db", _):
                throw AgentConfigError(path: path, line: key.mark?.line, message: "'db' must be a single value")
            case ("encryption-key-file", .sequence(let items)):
                keyFiles = items.compactMap(\.string)
            case ("encryption-key-file", _):
                throw AgentConfigError(path: path, line: key.mark?.line, message: "'encryption-key-file' must be a list, such as encryption-key-file: [PATH]")
            default:
                continue
            }
        }
        return AgentConfigDefaults(path: path, db: db, encryptionKeyFiles: keyFiles)
    }
}

/// The store and key files tokenctl uses, and where the store came from (for messages).
struct StoreSelection: Equatable, Sendable {
    let db: String
    /// `--db`, `TOKEN_AGENT_DB`, `TOKEN_STORE_DB`, `/etc/token-agent/token-agent.yaml (db)`, or `default`.
    let dbOrigin: String
    /// Empty: none given (TokenKeyring then looks for systemd's credential).
    let encryptionKeyFiles: [String]

    /// Flags > TOKEN_AGENT_* variables > TOKEN_STORE_DB > the agent's config file > default,
    /// as the agent resolves its own store.
    init(db flag: String?, encryptionKeyFiles flagKeys: [String], environment: [String: String], file: AgentConfigDefaults?) {
        func variable(_ name: String) -> String? { environment[name].flatMap { $0.isEmpty ? nil : $0 } }
        if let flag {
            (db, dbOrigin) = (flag, "--db")
        } else if let value = variable("TOKEN_AGENT_DB") {
            (db, dbOrigin) = (value, "TOKEN_AGENT_DB")
        } else if let value = variable("TOKEN_STORE_DB") {
            (db, dbOrigin) = (value, "TOKEN_STORE_DB")
        } else if let file, let value = file.db {
            (db, dbOrigin) = (value, "\(file.path) (db)")
        } else {
            (db, dbOrigin) = ("./tokens.sqlite", "default")
        }
        if !flagKeys.isEmpty {
            encryptionKeyFiles = flagKeys
        } else if let value = variable("TOKEN_AGENT_ENCRYPTION_KEY_FILE") {
            encryptionKeyFiles = value.split(separator: ",").map { $0.trimmingCharacters(in: .whitespaces) }.filter { !$0.isEmpty }
        } else {
            encryptionKeyFiles = file?.encryptionKeyFiles ?? []
        }
    }
}

/// The agent's config file cannot be used: exit 64 with this message.
struct AgentConfigError: Error, CustomStringConvertible {
    let path: String
    let line: Int?
    let message: String

    var description: String { "agent config file \(path)\(line.map { ":\($0)" } ?? ""): \(message)" }
}
