// Service layer: which Unix-socket callers may have which subjects' tokens (`--allow-client`):
// the rules as written, resolved to uids and gids, and the decision for one caller. Pure values;
// name resolution is passed in.

package import FleetTokenStore
#if canImport(Glibc)
package import Glibc
#endif

/// Who called over a Unix socket, as the kernel says (`SO_PEERCRED`, `SO_PEERGROUPS`).
package struct PeerIdentity: Sendable, Equatable, CustomStringConvertible {
    /// The caller's effective user id.
    package let uid: uid_t
    /// The caller's effective group id.
    package let gid: gid_t
    /// The caller's process id when it connected.
    package let pid: pid_t
    /// The caller's supplementary groups (may be empty when they could not be read).
    package let groups: [gid_t]

    /// An identity from its parts.
    package init(uid: uid_t, gid: gid_t, pid: pid_t, groups: [gid_t] = []) {
        self.uid = uid
        self.gid = gid
        self.pid = pid
        self.groups = groups
    }

    /// `uid=1001 pid=4242`.
    package var description: String { "uid=\(uid) pid=\(pid)" }
}

/// One `--allow-client` rule: a user or group (by name or number) and a `KIND:GLOB` pattern of
/// the subjects it grants, e.g. `user:dispatch vehicle:*` or `gid:1002 trip:T-*`.
public struct ClientRule: Sendable, Equatable, CustomStringConvertible {
    /// Whom the rule is for.
    package enum Principal: Sendable, Equatable, CustomStringConvertible {
        /// A user by name, resolved to its uid at start and on reload.
        case user(String)
        /// A group by name, resolved to its gid at start and on reload.
        case group(String)
        /// A user id.
        case uid(uid_t)
        /// A group id.
        case gid(gid_t)

        /// As written: `user:NAME`, `group:NAME`, `uid:N`, `gid:N`.
        package var description: String {
            switch self {
            case .user(let name): "user:\(name)"
            case .group(let name): "group:\(name)"
            case .uid(let uid): "uid:\(uid)"
            case .gid(let gid): "gid:\(gid)"
            }
        }
    }

    /// Whom the rule is for.
    package let principal: Principal
    /// The subjects it grants.
    package let pattern: SubjectAllowList.Pattern

    /// Parses `user:NAME KIND:GLOB` (or `group:`, `uid:`, `gid:`).
    /// - Throws: ``ClientRuleError`` naming what is wrong.
    public init(parsing text: String) throws(ClientRuleError) {
        let parts = text.split(separator: " ", omittingEmptySubsequences: true)
        guard parts.count == 2, let colon = parts[0].firstIndex(of: ":") else {
            throw ClientRuleError(rule: text, problem: "write WHO KIND:GLOB, e.g. 'user:dispatch vehicle:*' or 'group:fleet trip:T-*' (WHO is user:NAME, group:NAME, uid:N or gid:N)")
        }
        let who = parts[0][..<colon]
        let name = String(parts[0][parts[0].index(after: colon)...])
        guard !name.isEmpty else { throw ClientRuleError(rule: text, problem: "\(who): give a name or a number after the colon") }
        switch who {
        case "user": principal = .user(name)
        case "group": principal = .group(name)
        case "uid", "gid":
            guard let number = UInt32(name) else { throw ClientRuleError(rule: text, problem: "\(who): \(name) is not a number") }
            principal = who == "uid" ? .uid(number) : .gid(number)
        default:
            throw ClientRuleError(rule: text, problem: "unknown \"\(who)\": use user:NAME, group:NAME, uid:N or gid:N")
        }
        do {
            pattern = try SubjectAllowList.Pattern(parsing: String(parts[1]))
        } catch {
            throw ClientRuleError(rule: text, problem: error.problem)
        }
    }

    /// `WHO KIND:GLOB`.
    public var description: String { "\(principal) \(pattern)" }
}

/// A client rule that cannot be read or resolved: thrown by ``ClientRule/init(parsing:)`` and
/// ``ClientAccessPolicy/init(rules:)``.
public struct ClientRuleError: Error, Sendable, Equatable, CustomStringConvertible {
    /// The rule as given.
    package let rule: String
    /// What is wrong and what to write.
    package let problem: String

    init(rule: String, problem: String) {
        self.rule = rule
        self.problem = problem
    }

    /// `client rule "…": problem`.
    public var description: String { "client rule \"\(rule)\": \(problem)" }
}

/// The client rules resolved to uids and gids: which subjects a Unix-socket caller may have.
///
/// Once any rule exists, a caller gets only subjects that a rule for its uid, its gid or one of
/// its supplementary groups grants; configured subjects and `--allow` patterns grant nothing by
/// themselves. Names are resolved once (at start and on reload), so a user renamed or removed
/// later keeps the uid it had then.
public struct ClientAccessPolicy: Sendable, Equatable {
    private var byUID: [uid_t: [SubjectAllowList.Pattern]] = [:]
    private var byGID: [gid_t: [SubjectAllowList.Pattern]] = [:]
    /// The rules as given.
    package let rules: [ClientRule]

    /// True when no rule is given: callers are not told apart.
    package var isEmpty: Bool { rules.isEmpty }

    /// Resolves `rules`, looking user and group names up in the host's database (`getpwnam`,
    /// `getgrnam`).
    /// - Throws: ``ClientRuleError`` for a name that does not exist.
    public init(rules: [ClientRule]) throws(ClientRuleError) {
        try self.init(rules: rules, user: SystemAccounts.uid(named:), group: SystemAccounts.gid(named:))
    }

    /// Resolves `rules`; `user` and `group` look names up (tests pass their own; `group`
    /// defaults to `getgrnam`).
    /// - Throws: ``ClientRuleError`` for a name that does not exist.
    package init(rules: [ClientRule], user: (String) -> uid_t?,
                group: (String) -> gid_t? = SystemAccounts.gid(named:)) throws(ClientRuleError) {
        self.rules = rules
        for rule in rules {
            switch rule.principal {
            case .uid(let uid): byUID[uid, default: []].append(rule.pattern)
            case .gid(let gid): byGID[gid, default: []].append(rule.pattern)
            case .user(let name):
                guard let uid = user(name) else {
                    throw ClientRuleError(rule: rule.description, problem: "no user named \(name) on this host: create it, or write uid:N")
                }
                byUID[uid, default: []].append(rule.pattern)
            case .group(let name):
                guard let gid = group(name) else {
                    throw ClientRuleError(rule: rule.description, problem: "no group named \(name) on this host: create it, or write gid:N")
                }
                byGID[gid, default: []].append(rule.pattern)
            }
        }
    }

    /// True when a rule for `caller` (its uid, gid or a supplementary group) grants `key`.
    package func allows(_ key: TokenKey, for caller: PeerIdentity) -> Bool {
        if byUID[caller.uid]?.contains(where: { $0.matches(key) }) == true { return true }
        if byGID[caller.gid]?.contains(where: { $0.matches(key) }) == true { return true }
        return caller.groups.contains { byGID[$0]?.contains(where: { $0.matches(key) }) == true }
    }
}

/// The host's user and group database (`getpwnam_r`, `getgrnam_r`).
package enum SystemAccounts {
    /// The uid of the user `name`, or nil when there is none.
    package static func uid(named name: String) -> uid_t? {
        var size = 16_384
        // ERANGE: the entry is larger than the buffer (a long list of fields); grow and retry.
        while size <= 16 << 20 {
            var entry = passwd()
            var result: UnsafeMutablePointer<passwd>?
            var buffer = [CChar](repeating: 0, count: size)
            let status = getpwnam_r(name, &entry, &buffer, buffer.count, &result)
            if status == ERANGE { size *= 4; continue }
            return status == 0 && result != nil ? entry.pw_uid : nil
        }
        return nil
    }

    /// The gid of the group `name`, or nil when there is none.
    package static func gid(named name: String) -> gid_t? {
        var size = 65_536
        // ERANGE: a group with many members does not fit; grow and retry.
        while size <= 64 << 20 {
            var entry = group()
            var result: UnsafeMutablePointer<group>?
            var buffer = [CChar](repeating: 0, count: size)
            let status = getgrnam_r(name, &entry, &buffer, buffer.count, &result)
            if status == ERANGE { size *= 4; continue }
            return status == 0 && result != nil ? entry.gr_gid : nil
        }
        return nil
    }
}
