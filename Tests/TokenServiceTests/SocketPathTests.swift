// The rules for a Unix socket path (SocketPath.check), on real directories, files and sockets:
// what each refusal says, and what passes. The agent's process tests cover a few of them end to
// end; these cover every branch, now that the facts come from FileFacts rather than `stat` here.

import FleetTokenService
import FleetTokenStore
import Foundation
import Testing
import TestSupportKit
#if canImport(Glibc)
import Glibc
#endif

@Suite("Unix socket path rules", .paced)
struct SocketPathTests {
    /// The code and message of the refusal of `path`, or nil when it passes.
    private func refusal(_ path: String) -> (code: TokenAPIError.Code, message: String)? {
        do throws(TokenAPIError) {
            try SocketPath.check(path)
            return nil
        } catch {
            return (error.code, error.description)
        }
    }

    private func directory(_ path: String, mode: mode_t) throws {
        try FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: true)
        try #require(chmod(path, mode) == 0)
    }

    /// A Unix socket bound at `path`; listening when `listening`. Returns its descriptor.
    private func bindSocket(_ path: String, listening: Bool) throws -> Int32 {
        let descriptor = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0)
        try #require(descriptor >= 0)
        let bound = withUnixSocketAddress(path) { bind(descriptor, $0, $1) }
        try #require(bound == 0)
        if listening { try #require(listen(descriptor, 4) == 0) }
        return descriptor
    }

    @Test("the socket's directory: missing, not a directory, another user's, writable by others or its group (sticky too) are refused; the agent's own passes")
    func directoryRules() throws {
        let scratch = Scratch()
        #expect(refusal(scratch.file("none/agent.sock"))?.code == .socketDirectoryMissing)
        try #require(FileManager.default.createFile(atPath: scratch.file("plain"), contents: Data()))
        #expect(refusal(scratch.file("plain/agent.sock"))?.code == .socketDirectoryMissing)

        try directory(scratch.file("own"), mode: 0o750)
        #expect(refusal(scratch.file("own/agent.sock")) == nil)
        // Sticky keeps others from removing the socket, not from taking its name while it is free.
        try directory(scratch.file("sticky"), mode: 0o1777)
        let sticky = refusal(scratch.file("sticky/agent.sock"))
        #expect(sticky?.code == .socketDirectoryUnsafe && sticky?.message.contains("writable by everyone (sticky, which keeps others") == true,
                "a sticky directory of the agent's user: \(String(describing: sticky))")

        try directory(scratch.file("everyone"), mode: 0o777)
        let everyone = refusal(scratch.file("everyone/agent.sock"))
        #expect(everyone?.code == .socketDirectoryUnsafe && everyone?.message.contains("writable by everyone") == true, "\(String(describing: everyone))")
        try directory(scratch.file("group"), mode: 0o770)
        let group = refusal(scratch.file("group/agent.sock"))
        #expect(group?.code == .socketDirectoryUnsafe && group?.message.contains("writable by its group") == true, "\(String(describing: group))")

        // Another user's directory: only root can make one here (the CI runs as root).
        if geteuid() == 0 {
            try directory(scratch.file("foreign"), mode: 0o755)
            try #require(chown(scratch.file("foreign"), 65534, 65534) == 0)
            let foreign = refusal(scratch.file("foreign/agent.sock"))
            #expect(foreign?.code == .socketDirectoryUnsafe && foreign?.message.contains("belongs to another user (uid 65534)") == true,
                    "\(String(describing: foreign))")
            // A sticky directory of another user does not protect the agent's socket.
            try directory(scratch.file("foreign-sticky"), mode: 0o1777)
            try #require(chown(scratch.file("foreign-sticky"), 65534, 65534) == 0)
            #expect(refusal(scratch.file("foreign-sticky/agent.sock"))?.code == .socketDirectoryUnsafe)
        }
    }

    // Found by a review: through a link, only the directories above the path as given were
    // judged, not those above the directory the link leads to.
    @Test("a socket directory reached through a symbolic link: the directories above the one it leads to are judged too")
    func directoryThroughLink() throws {
        let scratch = Scratch()
        try directory(scratch.file("shared"), mode: 0o777)
        try directory(scratch.file("shared/sock"), mode: 0o750)
        try FileManager.default.createSymbolicLink(atPath: scratch.file("run"), withDestinationPath: scratch.file("shared/sock"))
        let refused = refusal(scratch.file("run/agent.sock"))
        #expect(refused?.code == .socketDirectoryUnsafe && refused?.message.contains("is under \(scratch.file("shared"))") == true,
                "\(String(describing: refused))")
        // Led to a directory under safe ones: fine.
        try directory(scratch.file("safe/sock"), mode: 0o750)
        #expect(chmod(scratch.file("safe"), 0o755) == 0)
        try FileManager.default.createSymbolicLink(atPath: scratch.file("run2"), withDestinationPath: scratch.file("safe/sock"))
        #expect(refusal(scratch.file("run2/agent.sock")) == nil)
        // A link met on the way, in a directory others may write that is above neither the path
        // nor the directory it leads to: run3 → open/current/sock, open/current → safe.
        try directory(scratch.file("open"), mode: 0o777)
        try FileManager.default.createSymbolicLink(atPath: scratch.file("open/current"), withDestinationPath: scratch.file("safe"))
        try FileManager.default.createSymbolicLink(atPath: scratch.file("run3"), withDestinationPath: scratch.file("open/current/sock"))
        let viaLink = refusal(scratch.file("run3/agent.sock"))
        #expect(viaLink?.code == .socketDirectoryUnsafe && viaLink?.message.contains("is under \(scratch.file("open"))") == true,
                "\(String(describing: viaLink))")
    }

    // Found by a review with the sink's ACL defect: a default ACL on the socket's directory
    // was inherited by the private directory the socket is bound in and by the socket, so the
    // user it named could connect whatever --socket-mode said.
    @Test("a socket directory with an ACL of its own or a default one is refused, naming `setfacl -b`")
    func directoryWithAccessControlList() throws {
        for name in [AccessControlList.accessName, AccessControlList.defaultName] {
            let scratch = Scratch()
            try directory(scratch.file("run"), mode: 0o750)
            #expect(refusal(scratch.file("run/agent.sock")) == nil)
            try PosixACL.set(PosixACL.namingUser(65534), name: name, on: scratch.file("run"))
            let refused = refusal(scratch.file("run/agent.sock"))
            #expect(refused?.code == .socketDirectoryUnsafe, "\(name): \(String(describing: refused))")
            #expect(refused?.message.contains("setfacl -b \(scratch.file("run"))") == true, "\(String(describing: refused))")
            #expect(refused?.message.contains("a default ACL, which the socket would inherit") == (name == AccessControlList.defaultName),
                    "\(String(describing: refused))")
        }
    }

    @Test("what is already at the path: a file or a symbolic link is refused, a socket someone listens on is in use, a stale socket passes")
    func existingFile() throws {
        let scratch = Scratch()
        try directory(scratch.file("run"), mode: 0o750)
        let path = scratch.file("run/agent.sock")
        try #require(FileManager.default.createFile(atPath: path, contents: Data("x".utf8)))
        #expect(refusal(path)?.code == .notASocket)
        try FileManager.default.removeItem(atPath: path)

        let listening = try bindSocket(path, listening: true)
        let inUse = refusal(path)
        #expect(inUse?.code == .socketInUse && inUse?.message.contains("another process is listening on \(path)") == true)
        close(listening)
        #expect(refusal(path) == nil, "a socket nobody answers on is stale: the agent replaces it")

        // A link to a socket is not a socket at the path (lstat, not stat).
        try FileManager.default.createSymbolicLink(atPath: scratch.file("run/link.sock"), withDestinationPath: path)
        #expect(refusal(scratch.file("run/link.sock"))?.code == .notASocket)
        try FileManager.default.removeItem(atPath: path)
    }
}
