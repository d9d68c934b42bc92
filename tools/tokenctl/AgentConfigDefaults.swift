// tokenctl beside an installed agent: the store and the encryption key files come from the
// agent's own settings when tokenctl is not given them, so `tokenctl --config
// /etc/token-agent/token-agent.yaml list` (or TOKEN_AGENT_CONFIG) finds the agent's store. The
// precedence is the agent's (README "Config file and environment"): flags, then variables, then
// the config file, then the default.

import AgentVariables
import FleetTokenStore
import Foundation
import Synchronization
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
    /// as the agent resolves its own store: the agent's order (``AgentVariables/source(flag:variables:file:)``)
    /// and its split of a list variable.
    init(db flag: String?, encryptionKeyFiles flagKeys: [String], environment: [String: String], file: AgentConfigDefaults?) {
        let variables = AgentVariables(environment)
        let dbVariables = [AgentVariables.name(of: "db"), AgentVariables.storeVariable]
        switch variables.source(flag: flag != nil, variables: dbVariables, file: file?.db != nil) {
        case .flag:
            (db, dbOrigin) = (flag ?? "", "--db")
        case .variable(let name):
            (db, dbOrigin) = (variables.value(name) ?? "", name)
        case .file:
            (db, dbOrigin) = (file?.db ?? "", "\(file?.path ?? "") (db)")
        case nil:
            (db, dbOrigin) = ("./tokens.sqlite", "default")
        }
        let keyVariable = AgentVariables.name(of: "encryption-key-file")
        switch variables.source(flag: !flagKeys.isEmpty, variables: [keyVariable], file: file != nil) {
        case .flag:
            encryptionKeyFiles = flagKeys
        case .variable(let name):
            encryptionKeyFiles = variables.list("encryption-key-file", in: name) ?? []
        case .file:
            encryptionKeyFiles = file?.encryptionKeyFiles ?? []
        case nil:
            encryptionKeyFiles = []
        }
    }
}

/// The agent's config file read once per run: the first ``value(path:)`` loads it, later calls
/// for the same path give what that load gave (the settings, or the error).
final class AgentConfigRead: Sendable {
    private let loaded = Mutex<(path: String?, result: Result<AgentConfigDefaults?, AgentConfigError>)?>(nil)

    /// The settings of the file at `path` (nil when no file is named), loading it only the first time.
    /// - Throws: ``AgentConfigError`` when the file cannot be used.
    func value(path: String?) throws(AgentConfigError) -> AgentConfigDefaults? {
        let result = loaded.withLock { loaded in
            if let loaded, loaded.path == path { return loaded.result }
            let result: Result<AgentConfigDefaults?, AgentConfigError>
            do throws(AgentConfigError) {
                result = .success(try path.map { path throws(AgentConfigError) in try AgentConfigDefaults.load(path) })
            } catch {
                result = .failure(error)
            }
            loaded = (path, result)
            return result
        }
        return try result.get()
    }
}

/// The agent's config file cannot be used: exit 64 with this message.
struct AgentConfigError: Error, CustomStringConvertible {
    let path: String
    let line: Int?
    let message: String

    var description: String { "agent config file \(path)\(line.map { ":\($0)" } ?? ""): \(message)" }
}
