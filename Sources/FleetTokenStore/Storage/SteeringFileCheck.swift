// Files that steer an agent (its configuration, the subjects it serves, the credentials and
// trust it uses towards the provider) judged as sshd judges `authorized_keys`: refused when
// someone other than the agent's user or root could have written them, or could have replaced
// them through a directory on the way. The rule is a pure value (`SteeringFileCheck`); its I/O
// (`check(path:role:)`, and `read(path:role:)`, which judges and reads one open descriptor) is
// in SteeringFileRead.swift.

import Foundation
#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// Whether a file that steers an agent could have been written by another user.
///
/// A file is sound when it belongs to the agent's effective user or to root, and neither its
/// group nor others may write to it: whoever can write a config file can allow every subject,
/// whoever can write a CA file can trust their own server. Only the write bits and the owner
/// count (not read bits, not ACLs), as with sshd's `StrictModes`.
///
/// ```swift
/// let check = SteeringFileCheck(mode: 0o666, ownerID: 1001, userID: 1000)
/// check.isSafe                   // false
/// check.writableByGroupOrOthers  // true
/// check.ownedByAnotherUser       // true
/// ```
package struct SteeringFileCheck: Sendable, Equatable {
    /// The file's permission bits (`st_mode & 0o7777`).
    package let mode: UInt32
    /// The file's owner (`st_uid`).
    package let ownerID: UInt32
    /// The user the agent runs as (its effective uid).
    package let userID: UInt32

    /// Judges a file from its `stat` fields and the agent's effective uid.
    package init(mode: UInt32, ownerID: UInt32, userID: UInt32) {
        self.mode = mode & 0o7777
        self.ownerID = ownerID
        self.userID = userID
    }

    /// True when group or others may write to the file.
    package var writableByGroupOrOthers: Bool { mode & 0o022 != 0 }

    /// True when the file belongs to neither the agent's user nor root.
    package var ownedByAnotherUser: Bool { ownerID != userID && ownerID != 0 }

    /// True when only the agent's user (or root) can have written the file.
    package var isSafe: Bool { !writableByGroupOrOthers && !ownedByAnotherUser }

    /// True when the sticky bit is set: in such a directory only an entry's owner (and the
    /// directory's owner, and root) may rename or remove it, as in `/tmp`.
    package var isSticky: Bool { mode & 0o1000 != 0 }

    /// True when, judged as a directory on the way to a file, only the agent's user (or root)
    /// can replace what it holds: it belongs to one of them, and group and others may not write
    /// to it unless it is sticky (`/tmp`, root's and mode 1777, passes).
    package var isSafeDirectory: Bool { !ownedByAnotherUser && (!writableByGroupOrOthers || isSticky) }

    /// True when, judged as the directory that holds a file the agent itself puts there (its
    /// Unix socket), only the agent's user (or root) can replace or take that file's name: it
    /// belongs to one of them, and neither group nor others may write to it. Sticky or not: the
    /// sticky bit keeps others from removing the agent's entry, not from creating one under a
    /// name that is free, and the agent frees its socket's name whenever it stops, so another
    /// user could listen there first and answer the agent's clients.
    package var isSafeHoldingDirectory: Bool { !ownedByAnotherUser && !writableByGroupOrOthers }

    /// What is wrong with this directory as the one holding `thing`, and how to fix it, for a
    /// message that names the directory before it: `is writable by everyone, who could replace
    /// the socket: use a directory only this user can write (chmod go-w DIR, mode 0750)`. Nil
    /// when ``isSafeHoldingDirectory``.
    package func holdingDirectoryReason(directory: String, thing: String) -> String? {
        guard !isSafeHoldingDirectory else { return nil }
        if ownedByAnotherUser {
            return "belongs to another user (uid \(ownerID)): use a directory this user owns"
        }
        let who = mode & 0o002 != 0 ? "everyone" : "its group"
        let sticky = isSticky ? " (sticky, which keeps others from removing \(thing) but not from taking its name while it is free, as it is whenever the agent stops)" : ""
        let shown = Self.shellQuoted(directory)
        return "is writable by \(who)\(sticky), who could replace \(thing): use a directory only this user can write (chmod go-w \(shown), mode 0750)"
    }

    /// `belongs to uid 65534 (nobody), neither to this user (uid 1001) nor to root`: the
    /// owner part of the file's and the directory's reasons.
    private var ownership: String {
        let others = userID == 0 ? "not to root, the user this runs as" : "neither to this user (uid \(userID)) nor to root"
        return "belongs to uid \(ownerID)\(Self.userName(ownerID).map { " (\($0))" } ?? ""), \(others)"
    }

    /// What is wrong and how to fix it, for a message that names the file before it: `is
    /// writable by group or others (mode 0666): … run `chmod go-w PATH``. Nil when sound.
    package func reason(path: String) -> String? {
        guard !isSafe else { return nil }
        let shown = Self.shellQuoted(path)
        let owner = ownership
        let open = "is writable by group or others (mode \(String(format: "%04o", mode)))"
        switch (ownedByAnotherUser, writableByGroupOrOthers) {
        case (true, true):
            return "\(owner), and \(open): other users could change what the agent does; run `chown \(userID) \(shown) && chmod go-w \(shown)` as root, or use a file this user owns"
        case (true, false):
            return "\(owner): that user could change what the agent does; run `chown \(userID) \(shown)` as root, or use a file this user owns"
        default:
            return "\(open): another user could change what the agent does; run `chmod go-w \(shown)`"
        }
    }

    /// What is wrong with this directory on the way to a file, and how to fix it, for a message
    /// that names the file before it: `is under /srv/shared, a directory writable by group or
    /// others (mode 0777) and not sticky: … run `chmod go-w /srv/shared`…`. Nil when sound.
    /// `thing` names what another user could replace (`the socket` for a Unix socket).
    package func directoryReason(directory: String, thing: String = "the file") -> String? {
        guard !isSafeDirectory else { return nil }
        let shown = Self.shellQuoted(directory)
        let owner = ownership
        let open = "writable by group or others (mode \(String(format: "%04o", mode))) and not sticky"
        switch (ownedByAnotherUser, writableByGroupOrOthers && !isSticky) {
        case (true, true):
            return "is under \(directory), a directory that \(owner), and is \(open): other users could replace \(thing); run `chown \(userID) \(shown) && chmod go-w \(shown)` as root, or keep \(thing) in a directory only this user or root can write"
        case (true, false):
            return "is under \(directory), a directory that \(owner): that user could replace \(thing); run `chown \(userID) \(shown)` as root, or keep \(thing) in a directory this user or root owns"
        default:
            return "is under \(directory), a directory \(open): another user could replace \(thing); run `chmod go-w \(shown)`, or keep \(thing) in a directory only this user or root can write"
        }
    }

    /// `path` as a shell word: as it is when it holds only safe characters, else single-quoted.
    package static func shellQuoted(_ path: String) -> String {
        let safe = CharacterSet(charactersIn: "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789/._-+:@%,=")
        guard !path.isEmpty, path.unicodeScalars.allSatisfy(safe.contains) else {
            return "'" + path.replacingOccurrences(of: "'", with: "'\\''") + "'"
        }
        return path
    }

    /// The login name of `uid`, when the system knows one.
    static func userName(_ uid: UInt32) -> String? {
        var entry = passwd()
        var result: UnsafeMutablePointer<passwd>?
        var buffer = [CChar](repeating: 0, count: 4096)
        guard getpwuid_r(uid_t(uid), &entry, &buffer, buffer.count, &result) == 0, result != nil, let name = entry.pw_name else {
            return nil
        }
        return String(cString: name)
    }
}

/// A file refused because another user could have written it, or could have replaced it
/// through a directory on the way: which file, what is wrong (with the file or with which
/// directory), and the command that fixes it. Never the file's content.
package struct SteeringFileError: Error, Sendable, Equatable, CustomStringConvertible {
    /// What is wrong. More codes may come: match them with `==`, keep a `default`.
    package struct Code: Hashable, Sendable, CustomStringConvertible {
        fileprivate let name: String
        /// The file belongs to a user other than the agent's and root (whatever its mode).
        package static let ownedByAnotherUser = Code(name: "ownedByAnotherUser")
        /// Group or others may write to the file.
        package static let writableByGroupOrOthers = Code(name: "writableByGroupOrOthers")
        /// The code's stable name.
        package var description: String { name }
    }

    /// What is wrong: ``Code/ownedByAnotherUser`` when the owner is wrong (the mode may be too),
    /// else ``Code/writableByGroupOrOthers``; of the file, or of ``directory`` when it is set.
    package var code: Code { check.ownedByAnotherUser ? .ownedByAnotherUser : .writableByGroupOrOthers }
    /// The file.
    package let path: String
    /// How messages name the file: `config file`, `subjects file`, `CA file`, ….
    package let role: String
    /// The mode and owner of the file (or of ``directory``), and the agent's user.
    package let check: SteeringFileCheck
    /// The directory on the way to the file that another user could write to (so replace the
    /// file), judged by ``check``; nil when the file itself is at fault.
    package let directory: String?

    /// A refusal of the file at `path`, judged by `check`.
    package init(path: String, role: String, check: SteeringFileCheck) {
        self.init(path: path, role: role, check: check, directory: nil)
    }

    /// A refusal of the file at `path` because of `directory` on the way to it, judged by
    /// `check` (nil: the file itself, judged by `check`).
    package init(path: String, role: String, check: SteeringFileCheck, directory: String?) {
        self.path = path
        self.role = role
        self.check = check
        self.directory = directory
    }

    /// What is wrong and the fix, without the role and path: `is writable by group or others
    /// (mode 0666): …; run `chmod go-w PATH``, or `is under DIR, a directory …; run `chmod go-w DIR`…`.
    package var reason: String {
        guard let directory else { return check.reason(path: path) ?? "is sound" }
        return check.directoryReason(directory: directory) ?? "is sound"
    }

    /// `the config file /etc/token-agent.yaml is writable by group or others (mode 0666): …`.
    package var description: String { "the \(role) \(path) \(reason)" }
}
