// Issue 26, item 8: the rule for files that steer an agent, as plain values (mode, owner, the
// agent's uid), and its I/O wrapper on real files.

import FleetTokenStore
import Foundation
import TestSupportKit
import Testing
#if canImport(Glibc)
import Glibc
#endif

@Suite("SteeringFileCheck: files others could have written")
struct SteeringFileCheckTests {
    @Test("sound: owned by the agent's user or root, no write bit for group or others", arguments: [
        (UInt32(0o600), UInt32(1000), UInt32(1000)),
        (0o644, 1000, 1000),
        (0o640, 0, 1000),      // root's file, readable by the agent's group: the packaged layout
        (0o444, 0, 1000),
        (0o755, 1000, 1000),   // execute and read bits do not count
        (0o4644, 1000, 1000),  // nor setuid and the like
        (0o600, 0, 0),         // an agent running as root
    ])
    func sound(_ mode: UInt32, _ owner: UInt32, _ user: UInt32) {
        let check = SteeringFileCheck(mode: mode, ownerID: owner, userID: user)
        #expect(check.isSafe && !check.writableByGroupOrOthers && !check.ownedByAnotherUser)
        #expect(check.reason(path: "/etc/a") == nil)
    }

    @Test("writable by group or others: any of the two write bits, whoever owns it", arguments: [
        (UInt32(0o620), UInt32(1000)), (0o602, 1000), (0o666, 1000), (0o664, 0), (0o100622, 1000), (0o777, 0),
    ])
    func writable(_ mode: UInt32, _ owner: UInt32) {
        let check = SteeringFileCheck(mode: mode, ownerID: owner, userID: 1000)
        #expect(!check.isSafe && check.writableByGroupOrOthers && !check.ownedByAnotherUser)
        let reason = check.reason(path: "/etc/token-agent/agent.yaml") ?? ""
        #expect(reason.hasPrefix("is writable by group or others (mode 0\(String(mode & 0o777, radix: 8)))"), "\(reason)")
        #expect(reason.hasSuffix("run `chmod go-w /etc/token-agent/agent.yaml`"), "\(reason)")
    }

    @Test("owned by another user: refused whatever the mode, the fix names the agent's uid")
    func otherOwner() {
        let check = SteeringFileCheck(mode: 0o600, ownerID: 1001, userID: 1000)
        #expect(!check.isSafe && check.ownedByAnotherUser && !check.writableByGroupOrOthers)
        let reason = check.reason(path: "/etc/a") ?? ""
        #expect(reason.hasPrefix("belongs to uid 1001"), "\(reason)")
        #expect(reason.contains("run `chown 1000 /etc/a` as root"), "\(reason)")

        let both = SteeringFileCheck(mode: 0o666, ownerID: 1001, userID: 1000)
        #expect(both.ownedByAnotherUser && both.writableByGroupOrOthers)
        #expect(both.reason(path: "/etc/a")?.contains("run `chown 1000 /etc/a && chmod go-w /etc/a` as root") == true)
        // Root's files are trusted; the agent's user is trusted even when not root.
        #expect(SteeringFileCheck(mode: 0o600, ownerID: 0, userID: 1000).isSafe)
        #expect(!SteeringFileCheck(mode: 0o600, ownerID: 1000, userID: 0).isSafe, "an agent running as root trusts only root's files")
    }

    @Test("a path with spaces or quotes is quoted for the shell in the fix")
    func quoting() {
        let check = SteeringFileCheck(mode: 0o666, ownerID: 7, userID: 7)
        #expect(check.reason(path: "/srv/my config.yaml")?.hasSuffix("run `chmod go-w '/srv/my config.yaml'`") == true)
        #expect(check.reason(path: "/srv/it's.yaml")?.hasSuffix(#"run `chmod go-w '/srv/it'\''s.yaml'`"#) == true)
    }

    @Test("the I/O wrapper: a sound file passes, a loose one throws naming role, path and fix, a missing one is left to the reader")
    func onDisk() throws {
        let scratch = Scratch()
        let path = scratch.file("agent.yaml")
        try "vehicle: [a]\n".write(toFile: path, atomically: true, encoding: .utf8)
        #expect(chmod(path, 0o640) == 0)
        try SteeringFileCheck.check(path: path, role: "config file")
        #expect(chmod(path, 0o660) == 0)
        let error = #expect(throws: SteeringFileError.self) { try SteeringFileCheck.check(path: path, role: "config file") }
        #expect(error?.code == .writableByGroupOrOthers)
        #expect(error?.description == "the config file \(path) is writable by group or others (mode 0660): another user could change what the agent does; run `chmod go-w \(path)`")
        #expect(error?.description.contains("vehicle") == false, "never the content")
        // Through a symbolic link: the file it points to is judged.
        let link = scratch.file("link.yaml")
        #expect(symlink(path, link) == 0)
        #expect(throws: SteeringFileError.self) { try SteeringFileCheck.check(path: link, role: "config file") }
        try SteeringFileCheck.check(path: scratch.file("absent.yaml"), role: "config file")
    }

    @Test("the I/O wrapper: a file owned by another user is refused (run as root: chown to nobody)", .enabled(if: geteuid() == 0))
    func onDiskOwner() throws {
        let scratch = Scratch()
        let path = scratch.file("subjects.txt")
        try "vehicle:a\n".write(toFile: path, atomically: true, encoding: .utf8)
        #expect(chown(path, 65534, 65534) == 0)
        let error = #expect(throws: SteeringFileError.self) { try SteeringFileCheck.check(path: path, role: "subjects file") }
        #expect(error?.code == .ownedByAnotherUser)
        #expect(error?.check.ownerID == 65534 && error?.check.userID == 0)
        #expect(error?.description.contains("run `chown 0 \(path)` as root") == true, "\(String(describing: error))")
    }
}
