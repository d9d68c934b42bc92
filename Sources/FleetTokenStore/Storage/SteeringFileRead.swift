// The I/O of the steering-file rule: the file is opened once, the rule is applied to that open
// descriptor (fstat) and to every directory from it up to /, and the bytes returned are read
// from the same descriptor. A check by path followed by a read by path let anyone who can
// write a directory on the way swap the file in between.

package import Foundation
#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

extension SteeringFileCheck {
    /// The largest file ``read(path:role:maximumSize:)`` reads unless told otherwise: 16 MiB.
    package static let defaultMaximumSize = 16 << 20

    /// Judges the file at `path` as it would be read now, without reading it: a symbolic link
    /// is followed to the file it names, and every directory on the way (each one an entry is
    /// looked up in, links met on the way followed) is judged too.
    ///
    /// A missing file passes: reading it says so in the reader's words. Any other failure to
    /// examine it (a loop of symbolic links, a path through a file, a directory this user
    /// cannot search) is refused.
    /// - Parameter role: How a message names the file, such as `config file` or `client key`.
    /// - Throws: ``SteeringFileReadError``: ``SteeringFileReadError/Code/refused`` naming the
    ///   file (or directory), what is wrong and the command that fixes it; or why it cannot be
    ///   examined.
    package static func check(path: String, role: String) throws(SteeringFileReadError) {
        var info = stat()
        guard stat(path, &info) == 0 else {
            let error = errno
            if error == ENOENT { return }
            throw SteeringFileReadError(code: .unreadable, path: path, role: role, systemError: error)
        }
        try judge(info, path: path, role: role)
    }

    /// Opens the file at `path` once, judges what was opened (owner, mode, a regular file, the
    /// directories on the way) and returns its bytes, read from the same descriptor: what is
    /// returned is what was judged, whatever happens to the path meanwhile. A symbolic link is
    /// followed; the file it names is what is judged and read.
    /// - Parameters:
    ///   - role: How a message names the file, such as `config file` or `client key`.
    ///   - maximumSize: The largest file read; a larger one is refused (``SteeringFileReadError/Code/tooLarge``).
    /// - Throws: ``SteeringFileReadError`` saying what is wrong: the file is missing, cannot be
    ///   read, is not a regular file, is too large, was replaced while being judged, or another
    ///   user could have written it (``SteeringFileReadError/refusal``, with the fix).
    package static func read(path: String, role: String, maximumSize: Int = defaultMaximumSize) throws(SteeringFileReadError) -> Data {
        // O_NONBLOCK: a FIFO put in the file's place must not hang the open (it is refused as
        // not a regular file); it changes nothing for a regular file.
        let descriptor = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK)
        guard descriptor >= 0 else {
            let error = errno
            throw SteeringFileReadError(code: error == ENOENT ? .missing : .unreadable, path: path, role: role, systemError: error)
        }
        defer { close(descriptor) }
        var info = stat()
        guard fstat(descriptor, &info) == 0 else {
            throw SteeringFileReadError(code: .unreadable, path: path, role: role, systemError: errno)
        }
        try judge(info, path: path, role: role)
        var data = Data()
        var buffer = [UInt8](repeating: 0, count: 64 << 10)
        while data.count <= maximumSize {
            let count = buffer.withUnsafeMutableBytes { systemRead(descriptor, $0.baseAddress, $0.count) }
            if count < 0 {
                if errno == EINTR { continue }
                throw SteeringFileReadError(code: .unreadable, path: path, role: role, systemError: errno)
            }
            if count == 0 { break }
            data.append(contentsOf: buffer[0..<count])
        }
        guard data.count <= maximumSize else {
            throw SteeringFileReadError(code: .tooLarge, path: path, role: role, maximumSize: maximumSize)
        }
        return data
    }

    /// The rule applied to the file `info` describes (reached as `path`) and to the
    /// directories on the way to it.
    private static func judge(_ info: stat, path: String, role: String) throws(SteeringFileReadError) {
        guard info.st_mode & S_IFMT == S_IFREG else {
            throw SteeringFileReadError(code: .notARegularFile, path: path, role: role)
        }
        let userID = UInt32(geteuid())
        let check = SteeringFileCheck(mode: UInt32(info.st_mode), ownerID: UInt32(info.st_uid), userID: userID)
        guard check.isSafe else {
            throw SteeringFileReadError(refusal: SteeringFileError(path: path, role: role, check: check))
        }
        // The file judged must be the one the path leads to now (else the path changed
        // meanwhile) ...
        guard let resolved = realpath(path, nil) else {
            throw SteeringFileReadError(code: .changed, path: path, role: role)
        }
        var now = stat()
        let leadsToIt = stat(resolved, &now) == 0 && now.st_dev == info.st_dev && now.st_ino == info.st_ino
        free(resolved)
        guard leadsToIt else { throw SteeringFileReadError(code: .changed, path: path, role: role) }
        // ... and every directory an entry is looked up in on the way to it (it was just
        // traversed, so a failure now means the path changed meanwhile).
        guard let directories = lookupDirectories(of: absolute(path)) else {
            throw SteeringFileReadError(code: .changed, path: path, role: role)
        }
        guard let (directory, check) = firstUnsafe(of: directories, userID: userID, passingOverUnexaminable: false) else { return }
        guard let check else { throw SteeringFileReadError(code: .changed, path: path, role: role) }
        throw SteeringFileReadError(refusal: SteeringFileError(path: path, role: role, check: check, directory: directory))
    }

    /// The first directory on the way to `path` (from the working directory when relative)
    /// whose owner or mode lets another user replace what `path` names, with the check that
    /// refused it and the reason for a message that names `thing` (`the socket`); nil when
    /// every one is sound. What may not exist yet (the caller creates it) ends the walk, and
    /// a directory that cannot be examined is passed over: creating or opening it fails.
    package static func unsafeDirectory(onTheWayTo path: String, thing: String)
        -> (directory: String, check: SteeringFileCheck, reason: String)? {
        let absolute = absolute(path)
        // A walk that fails (a loop of links, a directory this user cannot search) judges the
        // directories above the path as given.
        let directories = lookupDirectories(of: absolute, stoppingAtMissing: true) ?? ancestors(of: absolute)
        guard let (directory, check) = firstUnsafe(of: directories, userID: UInt32(geteuid()), passingOverUnexaminable: true),
              let check, let reason = check.directoryReason(directory: directory, thing: thing) else { return nil }
        return (directory, check, reason)
    }

    /// The first of `directories` whose owner or mode lets another user (than `userID`)
    /// replace its entries, each directory judged once however often it is named; nil when
    /// all are sound. One that cannot be examined is passed over, or else returned without a
    /// check.
    private static func firstUnsafe(of directories: [String], userID: UInt32,
                                    passingOverUnexaminable: Bool) -> (directory: String, check: SteeringFileCheck?)? {
        var judged: Set<[UInt64]> = []
        for directory in directories {
            guard let (check, identity) = examineDirectory(directory, userID: userID) else {
                if passingOverUnexaminable { continue }
                return (directory, nil)
            }
            if judged.insert(identity).inserted && !check.isSafeDirectory { return (directory, check) }
        }
        return nil
    }

    /// `path`, made absolute from the working directory when relative.
    private static func absolute(_ path: String) -> String {
        path.hasPrefix("/") ? path : FileManager.default.currentDirectoryPath + "/" + path
    }

    /// Every directory an entry is looked up in while the absolute `path` is resolved, symbolic
    /// links followed as the kernel follows them (at most 40); nil when it cannot be resolved.
    /// With `stoppingAtMissing`, a name that does not exist (yet: what the caller will create)
    /// ends the walk instead, with the directories so far.
    package static func lookupDirectories(of path: String, stoppingAtMissing: Bool = false) -> [String]? {
        var remaining = ArraySlice(path.split(separator: "/").map(String.init))
        var current = "/"
        var directories: [String] = []
        var links = 0
        while let name = remaining.first {
            remaining = remaining.dropFirst()
            if name == "." { continue }
            if name == ".." {
                current = ancestors(of: current).first ?? "/"
                continue
            }
            directories.append(current)
            let next = current == "/" ? "/" + name : current + "/" + name
            var info = stat()
            guard lstat(next, &info) == 0 else { return stoppingAtMissing && errno == ENOENT ? directories : nil }
            guard info.st_mode & S_IFMT == S_IFLNK else {
                current = next
                continue
            }
            links += 1
            var buffer = [CChar](repeating: 0, count: Int(PATH_MAX) + 1)
            let count = readlink(next, &buffer, buffer.count - 1)
            guard links <= 40, count > 0 else { return nil }
            let target = String(decoding: buffer[..<count].map { UInt8(bitPattern: $0) }, as: UTF8.self)
            if target.hasPrefix("/") { current = "/" }
            remaining = ArraySlice(target.split(separator: "/").map(String.init)) + remaining
        }
        return directories
    }

    /// The owner and mode of the directory at `directory`, judged for `userID`, and its device
    /// and inode (to judge a directory reached twice once); nil when it cannot be examined.
    private static func examineDirectory(_ directory: String, userID: UInt32) -> (check: SteeringFileCheck, identity: [UInt64])? {
        guard let facts = FileFacts.of(directory) else { return nil }
        return (SteeringFileCheck(mode: facts.mode, ownerID: facts.ownerID, userID: userID), facts.identity)
    }

    /// The directories above an absolute `path`, nearest first, ending with `/`.
    package static func ancestors(of path: String) -> [String] {
        var components = path.split(separator: "/").map(String.init)
        guard !components.isEmpty else { return [] }
        components.removeLast()
        var result = ["/" + components.joined(separator: "/")]
        while !components.isEmpty {
            components.removeLast()
            result.append("/" + components.joined(separator: "/"))
        }
        return result
    }
}

#if canImport(Glibc)
private let systemRead = Glibc.read
#elseif canImport(Darwin)
private let systemRead = Darwin.read
#endif

/// A steering file that cannot be used: refused by the rule (``refusal``), or missing,
/// unreadable, not a regular file, too large, or replaced while it was judged. Names the file,
/// never its content.
package struct SteeringFileReadError: Error, Sendable, Equatable, CustomStringConvertible {
    /// What is wrong. More codes may come: match them with `==`, keep a `default`.
    package struct Code: Hashable, Sendable, CustomStringConvertible {
        fileprivate let name: String
        /// Another user could have written the file, or replaced it: ``SteeringFileReadError/refusal`` says how.
        package static let refused = Code(name: "refused")
        /// There is no such file.
        package static let missing = Code(name: "missing")
        /// The file cannot be opened, examined or read (``SteeringFileReadError/systemError`` says why).
        package static let unreadable = Code(name: "unreadable")
        /// Not a regular file (a directory, a device, a FIFO, a socket).
        package static let notARegularFile = Code(name: "notARegularFile")
        /// Larger than the reader takes.
        package static let tooLarge = Code(name: "tooLarge")
        /// The path led to another file while it was being judged: it was replaced meanwhile.
        package static let changed = Code(name: "changed")
        /// The code's stable name.
        package var description: String { name }
    }

    /// What is wrong.
    package let code: Code
    /// The file.
    package let path: String
    /// How messages name the file: `config file`, `subjects file`, `CA file`, ….
    package let role: String
    /// With ``Code/refused``: the file or directory at fault and the fix.
    package let refusal: SteeringFileError?
    /// With ``Code/missing`` and ``Code/unreadable``: the `errno` of the failed call.
    package let systemError: Int32?
    /// With ``Code/tooLarge``: the largest size taken, in bytes.
    package let maximumSize: Int?

    init(code: Code, path: String, role: String, systemError: Int32? = nil, maximumSize: Int? = nil) {
        self.code = code
        self.path = path
        self.role = role
        self.refusal = nil
        self.systemError = systemError
        self.maximumSize = maximumSize
    }

    /// A file refused by the rule.
    package init(refusal: SteeringFileError) {
        code = .refused
        path = refusal.path
        role = refusal.role
        self.refusal = refusal
        systemError = nil
        maximumSize = nil
    }

    /// The system's words for ``systemError``: `Permission denied`.
    package var systemMessage: String? { systemError.map { String(cString: strerror($0)) } }

    /// What is wrong, without the role and path: `is writable by group or others (mode 0666):
    /// …; run `chmod go-w PATH``, `cannot be read (Permission denied)`, ….
    package var reason: String {
        switch code {
        case .refused: refusal?.reason ?? "could have been written by another user"
        case .missing: "does not exist"
        case .unreadable: "cannot be read (\(systemMessage ?? "unknown error")): check the path and its permissions"
        case .notARegularFile: "is not a regular file: give the path of a file"
        case .tooLarge: "is larger than \((maximumSize ?? 0) >> 20) MiB: is it the right file?"
        case .changed: "was replaced while it was being checked: try again, and make sure no other user can write the directories on its path"
        default: "cannot be used"
        }
    }

    /// `the config file /etc/token-agent.yaml is writable by group or others (mode 0666): …`.
    package var description: String { "the \(role) \(path) \(reason)" }
}
