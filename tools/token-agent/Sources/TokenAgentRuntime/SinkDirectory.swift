// Agent runtime: the file sink's directories, checked, then held. The root and each kind
// directory are opened with O_NOFOLLOW | O_DIRECTORY, checked (owner, mode) on the open
// descriptor, and every later write, rename and removal is made relative to that descriptor,
// so a symlink or a swapped directory can never send token files, or their removal, elsewhere.

import FleetTokenStore
import Foundation
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

/// The sink's root and kind directories, each opened without following a symlink, checked, and
/// held open for the sink's life; all file work happens relative to the held descriptors.
///
/// A directory is refused (``TokenFileSinkError``) when it is a symbolic link, is not a
/// directory, belongs to a user other than this process's effective uid (root excepted), is
/// writable by group or others, is set-group-ID, or has a POSIX ACL (its own, or a default one
/// its files would inherit). A directory above the root is refused when another user could
/// replace what it holds (the rule for directories above a steering file). Directories it
/// creates get `mode` exactly (whatever the umask) and no ACL (a parent's default one is
/// removed), made with `mkdirat` relative to their held parent.
///
/// A held kind directory is compared, at each use, with the entry of its name in the root: when
/// the name now leads to something else (moved away, replaced), the held descriptor is dropped
/// and the name is opened and checked again. The root stays the directory opened at start.
final class SinkDirectories: Sendable {
    /// The root as configured.
    let root: String
    /// Mode of the directories the sink creates.
    let mode: mode_t

    private struct Held {
        var root: Int32?
        var kinds: [TokenKind: Int32] = [:]
    }

    private let held = Mutex(Held())

    init(root: String, mode: mode_t) {
        self.root = root
        self.mode = mode
    }

    deinit {
        held.withLock { held in
            if let root = held.root { close(root) }
            for descriptor in held.kinds.values { close(descriptor) }
        }
    }

    /// The path of `kind`'s directory, as errors and logs name it.
    func path(of kind: TokenKind) -> String { "\(root)/\(kind.rawValue)" }

    /// Opens (creating it if missing) and checks the root, checks that this user can write in
    /// it, and opens and checks every kind directory that exists.
    func prepare() throws(TokenFileSinkError) {
        try held.withLock { (held: inout Held) throws(TokenFileSinkError) in
            let root = try rootDescriptor(&held)
            guard faccessat(root, ".", W_OK | X_OK, 0) == 0 else { throw notWritable(errno) }
            for kind in TokenKind.allCases { _ = try kindDescriptor(kind, create: false, &held) }
        }
    }

    /// What ``prepare()`` would refuse, judged without creating anything and holding nothing:
    /// the directories above the root, then the root and each kind directory that exists; a
    /// root that does not exist yet must be one this user can create.
    func inspect() throws(TokenFileSinkError) {
        try judgeAncestors()
        let (_, parentPath, name) = Self.split(root)
        let rootDescriptor: Int32
        if let unnamed = try openUnnamed(root, isRoot: true) {
            rootDescriptor = unnamed
        } else {
            let parent = open(parentPath, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
            guard parent >= 0 else {
                guard errno == ENOENT else { throw notOpened(parentPath, errno) }
                return try requireCreatable(under: parentPath)
            }
            defer { close(parent) }
            guard let opened = try openChecked(in: parent, name: name, path: root, create: false, isRoot: true) else {
                return try requireCreatable(under: parentPath)
            }
            rootDescriptor = opened
        }
        defer { close(rootDescriptor) }
        guard faccessat(rootDescriptor, ".", W_OK | X_OK, 0) == 0 else { throw notWritable(errno) }
        for kind in TokenKind.allCases {
            if let descriptor = try openChecked(in: rootDescriptor, name: kind.rawValue, path: path(of: kind), create: false, isRoot: false) {
                close(descriptor)
            }
        }
    }

    /// Runs `body` with the held descriptor of `kind`'s directory, created when missing and
    /// `create` is true. Without `create`, a missing directory runs nothing and returns nil.
    func withKind<T: Sendable>(_ kind: TokenKind, create: Bool,
                               _ body: (Int32) throws(SinkFileIO.Failure) -> T) throws(SinkFileIO.Failure) -> T? {
        try held.withLock { (held: inout Held) throws(SinkFileIO.Failure) -> T? in
            let descriptor: Int32?
            do throws(TokenFileSinkError) { descriptor = try kindDescriptor(kind, create: create, &held) } catch { throw SinkFileIO.Failure(error) }
            return try descriptor.map { descriptor throws(SinkFileIO.Failure) in try body(descriptor) }
        }
    }

    // MARK: - Opening and checking

    private func rootDescriptor(_ held: inout Held) throws(TokenFileSinkError) -> Int32 {
        if let descriptor = held.root {
            try Self.check(descriptor, path: root, root: root)
            return descriptor
        }
        try judgeAncestors()
        let descriptor = try openPath(root, isRoot: true)
        held.root = descriptor
        return descriptor
    }

    /// Throws when a directory above the root could have its entries replaced by another user:
    /// they could move the root away and put their own directory, with their own token files or
    /// an ACL that lets them read the sink's, in its place.
    private func judgeAncestors() throws(TokenFileSinkError) {
        // Those above the root as its path names it, and every directory a link on the way
        // leads through (the parents are opened following links).
        guard let unsafe = SteeringFileCheck.unsafeDirectory(onTheWayTo: root, thing: "the sink directory") else { return }
        throw TokenFileSinkError(unsafe.check.ownedByAnotherUser ? .foreignOwner : .writableByOthers, directory: root,
                                 path: unsafe.directory, "the sink directory \(root) \(unsafe.reason)")
    }

    private func kindDescriptor(_ kind: TokenKind, create: Bool, _ held: inout Held) throws(TokenFileSinkError) -> Int32? {
        let root = try rootDescriptor(&held)
        if let descriptor = held.kinds[kind] {
            var named = stat(), opened = stat()
            if fstatat(root, kind.rawValue, &named, AT_SYMLINK_NOFOLLOW) == 0, fstat(descriptor, &opened) == 0,
               named.st_dev == opened.st_dev, named.st_ino == opened.st_ino {
                try Self.check(descriptor, path: path(of: kind), root: self.root)
                return descriptor
            }
            close(descriptor) // the name leads elsewhere now: open and check it again
            held.kinds[kind] = nil
        }
        guard let descriptor = try openChecked(in: root, name: kind.rawValue, path: path(of: kind), create: create, isRoot: false) else { return nil }
        held.kinds[kind] = descriptor
        return descriptor
    }

    /// Opens the directory at `path`: its parents as the path says (following links, creating
    /// missing ones with ``mode``), its last component without following a link. The last one
    /// is checked when it is the sink root.
    private func openPath(_ path: String, isRoot: Bool) throws(TokenFileSinkError) -> Int32 {
        if let unnamed = try openUnnamed(path, isRoot: isRoot) { return unnamed }
        let (trimmed, parent, name) = Self.split(path)
        if !isRoot {
            // A parent as the path names it, links and all: the operator's choice.
            let descriptor = open(trimmed, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
            if descriptor >= 0 { return descriptor }
            guard errno == ENOENT else { throw notOpened(trimmed, errno) }
        }
        let up = try openPath(parent, isRoot: false)
        defer { close(up) }
        return try openChecked(in: up, name: name, path: isRoot ? root : trimmed, create: true, isRoot: isRoot, checked: isRoot)!
    }

    /// The directory at `path` when its last component is one no link can stand for and nothing
    /// could create (`/`, `.`, `..`): opened as named, and checked when it is the sink root.
    /// Nil for any other path.
    private func openUnnamed(_ path: String, isRoot: Bool) throws(TokenFileSinkError) -> Int32? {
        let (trimmed, _, name) = Self.split(path)
        guard name.isEmpty || name == "." || name == ".." || trimmed == "/" else { return nil }
        let descriptor = open(trimmed, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        guard descriptor >= 0 else { throw notOpened(trimmed, errno) }
        if isRoot { try Self.check(descriptor, path: root, root: root, closing: true) }
        return descriptor
    }

    /// Opens `name` in `parent` without following a link, creating it with ``mode`` when
    /// missing and `create` is true (nil when missing otherwise); checks it when `checked`.
    private func openChecked(in parent: Int32, name: String, path: String, create: Bool, isRoot: Bool,
                             checked: Bool = true) throws(TokenFileSinkError) -> Int32? {
        let flags = O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC
        var descriptor = openat(parent, name, flags)
        var created = false
        if descriptor < 0 && errno == ENOENT {
            guard create else { return nil }
            created = mkdirat(parent, name, mode) == 0
            guard created || errno == EEXIST else {
                throw TokenFileSinkError(.directoryNotCreated, directory: root, path: path,
                                         "cannot create the sink directory \(path): \(String(cString: strerror(errno))); create it, or choose another directory")
            }
            descriptor = openat(parent, name, flags)
        }
        guard descriptor >= 0 else {
            let code = errno
            var info = stat()
            if code == ELOOP || (fstatat(parent, name, &info, AT_SYMLINK_NOFOLLOW) == 0 && info.st_mode & S_IFMT == S_IFLNK) {
                throw Self.symbolicLink(path, target: Self.linkTarget(in: parent, name), root: root, isRoot: isRoot)
            }
            if code == ENOTDIR {
                throw TokenFileSinkError(.notADirectory, directory: root, path: path,
                                         "\(path) is not a directory, and the sink keeps token files there: move it away, and the sink creates the directory")
            }
            throw notOpened(path, code)
        }
        if created {
            // No ACL (a parent's default one was inherited, and could let another user read
            // the token files whatever the mode says), exactly `mode` (the umask may have
            // cleared bits; a set-group-ID parent would have set one) and the sink's own group,
            // not one inherited from the parent.
            AccessControlList.remove(from: descriptor)
            fchown(descriptor, uid_t.max, getegid())
            fchmod(descriptor, mode)
        }
        if checked { try Self.check(descriptor, path: path, root: root, closing: true) }
        return descriptor
    }

    /// Throws unless this user may create what is missing of the root: the nearest directory
    /// of `path` and those above it that exists must let it add entries.
    private func requireCreatable(under path: String) throws(TokenFileSinkError) {
        var existing = path
        while access(existing, F_OK) != 0 && errno == ENOENT && existing != "/" && existing != "." {
            existing = Self.split(existing).parent
        }
        guard access(existing, W_OK | X_OK) == 0 else {
            throw TokenFileSinkError(.directoryNotCreated, directory: root, path: root,
                                     "cannot create the sink directory \(root) in \(existing): \(String(cString: strerror(errno))); create it, or choose another directory")
        }
    }

    /// `path` without trailing slashes, the directory it is in and its last component
    /// (`/var/lib/sink/` → `/var/lib/sink`, `/var/lib`, `sink`; `sink` → `sink`, `.`, `sink`).
    private static func split(_ path: String) -> (trimmed: String, parent: String, name: String) {
        var trimmed = path
        while trimmed.count > 1 && trimmed.hasSuffix("/") { trimmed.removeLast() }
        let slash = trimmed.lastIndex(of: "/")
        let name = slash.map { String(trimmed[trimmed.index(after: $0)...]) } ?? trimmed
        let parent = slash.map { $0 == trimmed.startIndex ? "/" : String(trimmed[..<$0]) } ?? "."
        return (trimmed, parent, name)
    }

    /// The sink directory exists but this user cannot write in it (`code`: its errno).
    private func notWritable(_ code: Int32) -> TokenFileSinkError {
        TokenFileSinkError(.directoryNotWritable, directory: root,
                           "cannot write in the sink directory \(root): \(String(cString: strerror(code))); give this user write access, or choose another directory")
    }

    /// A directory that exists (or should) but cannot be opened.
    private func notOpened(_ path: String, _ code: Int32) -> TokenFileSinkError {
        if code == EACCES || code == EPERM {
            return TokenFileSinkError(.directoryNotWritable, directory: root, path: path,
                                      "cannot open the sink directory \(path): \(String(cString: strerror(code))); give this user access to it, or choose another directory")
        }
        return TokenFileSinkError(.directoryNotCreated, directory: root, path: path,
                                  "cannot open the sink directory \(path): \(String(cString: strerror(code))); create it, or choose another directory")
    }

    private static func linkTarget(in parent: Int32, _ name: String) -> String? {
        var buffer = [CChar](repeating: 0, count: Int(PATH_MAX) + 1)
        let count = readlinkat(parent, name, &buffer, buffer.count - 1)
        guard count >= 0 else { return nil }
        return String(decoding: buffer[..<count].map { UInt8(bitPattern: $0) }, as: UTF8.self)
    }

    static func symbolicLink(_ path: String, target: String?, root: String, isRoot: Bool) -> TokenFileSinkError {
        let to = target.map { " (to \($0))" } ?? ""
        let fix = isRoot ? "use the directory it leads to\(target.map { " (\($0))" } ?? "") as the sink directory"
            : "remove the link (rm \(path)), and the sink creates a real directory there"
        return TokenFileSinkError(.symbolicLink, directory: root, path: path,
                                  "the sink directory \(path) is a symbolic link\(to); the sink does not follow links, so that no link can send token files, or their removal, elsewhere: \(fix)")
    }

    /// Checks the open directory `descriptor` (at `path`): throws when another user owns it,
    /// group or others may write in it, or it is set-group-ID; `closing` closes it then.
    static func check(_ descriptor: Int32, path: String, root: String, closing: Bool = false) throws(TokenFileSinkError) {
        var info = stat()
        let problem: TokenFileSinkError?
        if fstat(descriptor, &info) != 0 {
            problem = TokenFileSinkError(.directoryNotCreated, directory: root, path: path,
                                         "cannot check the sink directory \(path): \(String(cString: strerror(errno))); check the file system")
        } else {
            problem = Self.problem(owner: info.st_uid, group: info.st_gid, mode: info.st_mode, path: path, root: root, user: geteuid())
                ?? Self.problem(acls: AccessControlList.present(on: descriptor), path: path, root: root)
        }
        guard let problem else { return }
        if closing { close(descriptor) }
        throw problem
    }

    /// What makes a directory of `owner`, `group` and `mode` unsafe for the tokens of a sink
    /// running as `user`, every problem and its fix in one message; nil when it is safe.
    static func problem(owner: uid_t, group: gid_t, mode: mode_t, path: String, root: String, user: uid_t) -> TokenFileSinkError? {
        var codes: [TokenFileSinkError.Code] = [], problems: [String] = [], fixes: [String] = [], chmods: [String] = []
        let shown = "mode " + String(mode & 0o7777, radix: 8).leftPadded(to: 4)
        if owner != user && owner != 0 {
            codes.append(.foreignOwner)
            problems.append("it belongs to uid \(owner) (not this user, uid \(user), nor root), who could read, swap or plant token files")
            fixes.append("chown \(user) \(path)")
        }
        if mode & 0o022 != 0 {
            codes.append(.writableByOthers)
            problems.append("group or others may write in it (\(shown)) and could swap or plant token files")
            chmods.append("go-w")
        }
        if mode & S_ISGID != 0 {
            codes.append(.setGroupID)
            problems.append("it is set-group-ID (\(shown)): token files in it would take its group (gid \(group)), which could read them")
            chmods.append("g-s")
        }
        guard let code = codes.first else { return nil }
        if !chmods.isEmpty { fixes.append("chmod \(chmods.joined(separator: ",")) \(path)") }
        let remedy = path == root ? "or choose another directory" : "or remove it and let the sink create it"
        return TokenFileSinkError(code, directory: root, path: path,
                                  "the sink directory \(path) is not safe for tokens: \(problems.joined(separator: "; ")); \(fixes.joined(separator: " and ")), \(remedy)")
    }
}

extension SinkDirectories {
    /// What makes a directory with the POSIX ACLs `acls` (their attribute names) unsafe for
    /// tokens; nil when it has none. The mode bits do not show what an ACL grants: a named
    /// user's entry gives that user access, and a default ACL is inherited by every token file.
    static func problem(acls: [String], path: String, root: String) -> TokenFileSinkError? {
        guard !acls.isEmpty else { return nil }
        let reason = AccessControlList.reason(acls, path: path, madeInIt: "every token file made in it", harm: "read, swap or plant token files")
        let remedy = path == root ? "or choose another directory" : "or remove it and let the sink create it"
        return TokenFileSinkError(.accessControlList, directory: root, path: path,
                                  "the sink directory \(path) is not safe for tokens: it \(reason), \(remedy)")
    }
}

extension String {
    fileprivate func leftPadded(to width: Int) -> String { String(repeating: "0", count: max(0, width - count)) + self }
}
